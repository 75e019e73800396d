"""The CLI under test is the real one: `corral ARGS` through its parser (`orchestrator.cli.main`, in-process:
an interpreter start-up per command made these tests slow) against a real `corral up` subprocess (embedded
nats-server, scheduler, simulated nodes running examples/worker.py).

One `corral up` is shared by the whole session (`cluster`); tests use their own job ids and
queues so they do not depend on each other's jobs. The preemption scenario runs once
(`preemption`) and several tests read its log.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import aclosing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from events.bus import Bus, Envelope
from events.sdk import Client
from orchestrator.cli import main
from orchestrator.cli.state_view import load_state
from orchestrator.core.model.state import ClusterState

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "examples" / "worker.py"
CORRAL = [sys.executable, "-m", "orchestrator.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker_cmd(steps: int, step_ms: int = 10) -> list[str]:
    return [sys.executable, str(WORKER), "--steps", str(steps), "--step-ms", str(step_ms)]


def job(name: str, *, queue: str = "default", ranks: int = 1, gpus: int = 1, steps: int = 50,
        **extra: Any) -> dict[str, Any]:
    """A job spec running the toy worker (`steps` x 10 ms)."""
    return {"name": name, "queue": queue, "ranks": ranks, "gpus_per_rank": gpus, "command": worker_cmd(steps),
            "grace_period_s": 10, **extra}


def corral(*args: str, url: str | None = None, timeout: float = 60, stdin: str | None = None,
           check: int | None = 0, env: dict[str, str | None] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `corral ARGS` to completion in this process, through the parser as a shell would; assert its exit
    code is `check` (None: any). `timeout` is left to pytest-timeout (kept for the callers' sake).

    Only the interpreter start-up is skipped (test_cli_start.py keeps subprocess smoke tests): stdout and stderr
    are what a subprocess would print, with its environment, working directory and the interpreter's defaults
    for what reaches stderr (library log records of WARNING and up, warnings not ignored by default); an
    exception escaping `main` fails the test instead of becoming a traceback on stderr. `env`: variables set
    (None: unset) for the command, over this process's environment."""
    del timeout
    env = {"CORRAL_LOG_LEVEL": "warning", **({"CORRAL_NATS_URL": url} if url is not None else {}), **(env or {})}
    out, err = (io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True) for _ in range(2))
    code: object = 0
    with _env(env), contextlib.chdir(ROOT), _stderr_like_a_process(err), \
            mock.patch.multiple(sys, stdout=out, stderr=err, stdin=io.TextIOWrapper(
                io.BytesIO((stdin or "").encode()), encoding="utf-8")):
        try:
            main(list(args))
        except SystemExit as e:
            code = e.code
    rc = code if isinstance(code, int) else (0 if code is None else 1)
    if not isinstance(code, int | None):  # sys.exit("message") prints it, as the interpreter would
        err.write(f"{code}\n")
    proc = subprocess.CompletedProcess([*CORRAL, *args], rc, _text(out), _text(err))
    if check is not None:
        assert proc.returncode == check, (
            f"corral {' '.join(args)}: exit {proc.returncode}, expected {check}\n"
            f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def _text(stream: io.TextIOWrapper) -> str:
    stream.flush()
    return stream.buffer.getvalue().decode()  # type: ignore[attr-defined,no-any-return]


@contextlib.contextmanager
def _env(values: dict[str, str | None]) -> Iterator[None]:
    """os.environ with `values` (None: unset) while the block runs."""
    saved = {k: os.environ.get(k) for k in values}

    def put(pairs: dict[str, str | None]) -> None:
        for k, v in pairs.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    put(values)
    try:
        yield
    finally:
        put(saved)


#: The interpreter's warning filters when started without -W or -X dev (pytest's own record them instead).
_DEFAULT_WARNINGS = (("default", DeprecationWarning, "__main__"), ("ignore", DeprecationWarning, ""),
                     ("ignore", PendingDeprecationWarning, ""), ("ignore", ImportWarning, ""),
                     ("ignore", ResourceWarning, ""))


@contextlib.contextmanager
def _stderr_like_a_process(err: io.TextIOWrapper) -> Iterator[None]:
    """What a fresh `corral` process would print on stderr besides its own output: stdlib log records of
    WARNING and up (logging's last-resort handler; pytest's capture handlers would swallow them) and warnings."""
    handler = logging.StreamHandler(err)
    handler.setLevel(logging.WARNING)
    root = logging.getLogger()
    root.addHandler(handler)
    with warnings.catch_warnings():
        warnings.resetwarnings()
        for action, category, module in reversed(_DEFAULT_WARNINGS):
            warnings.filterwarnings(action, category=category, module=module)  # type: ignore[arg-type]
        warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: err.write(
            warnings.formatwarning(message, category, filename, lineno, line))
        try:
            yield
        finally:
            root.removeHandler(handler)


def corral_many(commands: list[list[str]], *, url: str | None = None,
                timeout: float = 60) -> list[subprocess.CompletedProcess[str]]:
    """Run several `corral` commands (in-process, one after the other); their results in order."""
    return [corral(*args, url=url, timeout=timeout, check=None) for args in commands]


def corral_json(*args: str, url: str) -> Any:
    return json.loads(corral(*args, "--json", url=url).stdout)


def assert_one_line_error(proc: subprocess.CompletedProcess[str], code: int) -> str:
    """A user error: exit `code`, one line on stderr, no traceback."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("corral"), lines
    return lines[0]


# --- in-process reads (setup and cross-checks, not the code under test) ---------------------------


async def _with_bus(url: str, fn: Callable[[Bus], Any]) -> Any:
    bus = await Bus.connect(url, name="corral-test")
    try:
        return await fn(bus)
    finally:
        await bus.close()


def state_of(url: str) -> ClusterState:
    return asyncio.run(_with_bus(url, load_state))


def log_of(url: str) -> list[Envelope]:
    async def read(bus: Bus) -> list[Envelope]:
        out: list[Envelope] = []
        async with aclosing(bus.replay()) as batches:
            async for batch in batches:
                out.extend(batch)
        return out

    return asyncio.run(_with_bus(url, read))


def submit(url: str, specs: dict[str, dict[str, Any]]) -> None:
    """Submit job specs by id in one connection (fast setup)."""
    async def go(bus: Bus) -> None:
        client = Client(bus, user="tests")
        for job_id, spec in specs.items():
            await client.submit(spec, job_id=job_id)

    asyncio.run(_with_bus(url, go))


def wait_state(url: str, until: Callable[[ClusterState], bool], timeout: float = 60, what: str = "") -> ClusterState:
    deadline = time.monotonic() + timeout
    while True:
        state = state_of(url)
        if until(state):
            return state
        if time.monotonic() > deadline:
            jobs = {j: (s.status, s.attempt) for j, s in state.jobs.items()}
            raise AssertionError(f"timed out waiting for {what or until}; jobs: {jobs}")
        time.sleep(0.3)


def statuses(state: ClusterState, ids: list[str]) -> list[str]:
    return [state.jobs[j].status if j in state.jobs else "missing" for j in ids]


# --- corral up ----------------------------------------------------------------------------


@dataclass
class Up:
    """A `corral up` subprocess; `url` is parsed from its first line."""

    data_dir: Path
    args: list[str] = field(default_factory=list)
    url: str = ""
    proc: subprocess.Popen[str] | None = None
    lines: list[str] = field(default_factory=list)
    starts: int = 0
    _reader: threading.Thread | None = None
    _stderr: Any = None

    def start(self, timeout: float = 30) -> Up:
        env = {**os.environ, "CORRAL_LOG_LEVEL": "warning"}
        self.starts += 1
        # Its logs go to a file: a pipe nobody reads would fill and block it.
        self._stderr = open(self.data_dir.parent / f"{self.data_dir.name}-up{self.starts}.stderr", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [*CORRAL, "up", "--port", "0", "--data-dir", str(self.data_dir), *self.args],
            stdout=subprocess.PIPE, stderr=self._stderr, text=True, env=env, cwd=ROOT,
        )
        first = self.proc.stdout.readline() if self.proc.stdout else ""
        assert "NATS at " in first, f"corral up did not start: {first!r}"
        self.url = first.split("NATS at ", 1)[1].split()[0]
        self.lines = [first]
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()
        wait_state(self.url, lambda s: len(s.nodes) >= self.nodes and s.epoch > 0, timeout, "nodes and a leader")
        return self

    @property
    def nodes(self) -> int:
        return int(self.args[self.args.index("--nodes") + 1]) if "--nodes" in self.args else 4

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def stop(self, timeout: float = 60) -> int:
        """SIGINT, as Ctrl-C would; the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        if self._reader is not None:
            self._reader.join(5)
        self._stderr.close()
        stuck = [ln for ln in Path(self._stderr.name).read_text(errors="replace").splitlines() if "stop_stuck" in ln]
        if stuck:  # the hard stop ended it (exit 0): say where the stop hung, in the run's warnings summary
            warnings.warn(f"corral up hit its hard stop: {stuck[0][:4000]}", stacklevel=2)
        return rc


@pytest.fixture(scope="session")
def metrics_port() -> int:
    return free_port()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory, metrics_port: int) -> Iterator[Up]:
    """2 nodes x 4 GPUs, preemption allowed after 1 s, metrics on `metrics_port`."""
    up = Up(tmp_path_factory.mktemp("cli") / "corral",
            ["--nodes", "2", "--gpus-per-node", "4", "--min-runtime", "1", "--metrics-port", str(metrics_port)])
    up.start()
    # Once any queue is defined, jobs naming an undefined one are rejected: define the ones tests use.
    async def queues(bus: Bus) -> None:
        for name in ("default", "research"):
            await Client(bus).define_queue(name)

    asyncio.run(_with_bus(up.url, queues))
    try:
        yield up
    finally:
        rc = up.stop()
        assert rc == 0, f"corral up exited {rc}:\n{''.join(up.lines[-20:])}"
        assert "corral up: stopped" in "".join(up.lines)


@dataclass(frozen=True)
class Preemption:
    victims: list[str]
    preemptor: str


@pytest.fixture(scope="session")
def preemption(cluster: Up) -> Preemption:
    """Fill the cluster with preemptible research jobs, then a prod job reclaims its guarantee.

    Returns once every job of the scenario finished (victims resume from their checkpoint).
    """
    url = cluster.url
    corral("queue", "set", "prod", "--guarantee", "2", "--weight", "2", url=url)
    corral("queue", "set", "research", "--weight", "1", url=url)
    victims = [f"pre-sweep-{i}" for i in range(8)]
    submit(url, {v: job(v, queue="research", steps=700) for v in victims})
    wait_state(url, lambda s: statuses(s, victims) == ["running"] * 8, 60, "the sweep to fill the cluster")
    submit(url, {"pre-urgent": job("urgent", queue="prod", gpus=2, steps=30, priority=100, preemptible=False)})
    done = [*victims, "pre-urgent"]
    state = wait_state(url, lambda s: statuses(s, done) == ["completed"] * len(done), 90, "the scenario to finish")
    preempted = [v for v in victims if state.jobs[v].attempt > 1]
    assert preempted, "no victim was preempted"
    return Preemption(victims=preempted, preemptor="pre-urgent")
