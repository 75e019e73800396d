"""What a long history costs each reader: a `corral sim` log loaded into a fresh stream, then real processes timed.

    python bench/history.py --log /path/events-corral.jsonl [--runs 3]
    python bench/history.py --jobs 5000                 # generate the log first (corral sim --generate)
    python bench/history.py --compare 50k.json 500k.json

Issue #28, acceptance 1. Starts its own nats-server in a temp dir, loads the
log into a fresh CORRAL stream with pipelined `Bus.append_many` (the log's
clock is moved so its last event is "now": a cluster's history ending at the
load, so `--since`, ages and "now" mean what they do on a cluster; event ids
and contents are otherwise unchanged), then times real `corral` processes:

- readers, process start to caught up (the service's `/readyz` once it was
  seen answering 503 first -- readiness that means caught up -- else its log
  line: the scheduler's `caught_up`, the agent's `agent_started`):
  `jobs_cold` (`corral jobs` before anything wrote a snapshot, once; not
  with --skip-jobs-cold), `scheduler_cold` (no snapshot exists), then the
  scheduler is stopped with SIGTERM (a clean stop writes a snapshot), then
  `scheduler` (a restart), `agent` (one of the log's nodes, simulated
  runtime: it starts no work), `jobs` and `nodes` (wall time of the process);
  the agent's state digest and position from its /metrics are then checked
  against a fold of every event up to that position (not with --skip-digest);
- queries, wall time: `usage`, `explain` of the log's oldest job, `job` of
  it, and `jobs --all --by-user U --since D` (U: the log's most frequent
  submitter; D: one day before the log's end; `--since` only where `jobs`
  has it);
- the baseline: `corral jobs --log FILE` (the same fold from the file,
  `--baseline-runs`, once by default), and `corral --version`: the floor
  under every CLI figure (interpreter start and imports).

Readers and queries run `--runs` times (median reported, every run kept),
with the CPU seconds each process spent (to caught up, for a service): on a
shared machine a steadier figure than wall time. If `corral index` / `corral
archive` exist (their `--help` exits 0) they are started after the load and
waited for (their readiness), and stay up while the readers and queries run. Which readers
started from a snapshot is read from their logs (any log event naming a
snapshot, e.g. the scheduler's `snapshot_loaded`).

`--compare A.json B.json` reads two runs' last lines (say 50k and 500k jobs)
and prints each figure's B/A ratio and the issue's targets as MET / NOT MET:
every reader that can start from a snapshot caught up in <= 3 s, every query
<= 1 s, every ratio <= 1.5. Every run prints progress to stderr and one JSON
object as its last stdout line.

Every child runs in its own process group and is killed on the way out (also
on an error, Ctrl-C or SIGTERM); the temp dir goes with it.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import datetime as dt
import json
import os
import platform
import resource
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.scale import vm_kb  # noqa: E402
from events.bus import Bus  # noqa: E402
from events.follow import fold_batch  # noqa: E402
from events.logfile import LogFile  # noqa: E402
from events.server import NatsServer  # noqa: E402
from events.subjects import slice_filters  # noqa: E402
from events.telemetry import digest  # noqa: E402
from orchestrator.core.node_view import NodeView, evolve_node, view_bytes  # noqa: E402
from schemas.events import Event, GangRestarted, JobSubmitted, JobWaiting, NodeRegistered, Unknown  # noqa: E402

#: The issue's targets (acceptance 1), checked by --compare.
READER_TARGET_S = 3.0
QUERY_TARGET_S = 1.0
RATIO_TARGET = 1.5
#: Readers that start where no snapshot can exist yet (a freshly loaded stream): reported, no target.
NO_SNAPSHOT_POSSIBLE = ("scheduler_cold", "jobs_cold")
DAY_S = 86400.0


def note(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- child processes ---------------------------------------------------------------------------


class Children:
    """Every process the bench starts, each in its own process group; `kill_all` ends them all."""

    def __init__(self) -> None:
        self._procs: list[subprocess.Popen[bytes]] = []

    def popen(self, argv: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(argv, start_new_session=True, stdin=subprocess.DEVNULL, **kw)
        self._procs.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        with contextlib.suppress(ValueError):
            self._procs.remove(proc)

    def kill_all(self) -> None:
        for proc in list(self._procs):
            self.kill(proc)


def corral_argv(*args: str) -> list[str]:
    """The `corral` CLI of this checkout (not whatever is installed)."""
    return [sys.executable, "-m", "orchestrator.cli", *args]


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


@dataclass
class Timed:
    """One process run to its end: wall seconds, CPU seconds (user + system), exit code, stdout lines."""

    s: float
    cpu_s: float
    rc: int
    lines: int
    err: str


def children_cpu_s() -> float:
    """CPU seconds of every child waited for so far: around one run, what that run spent (on a shared
    machine a steadier figure than wall time, which the other load moves)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds a running process has spent so far (Linux /proc; None elsewhere or once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def run_cli(children: Children, args: list[str], timeout: float) -> Timed:
    """Run `corral ARGS` to its end and time it (process start to exit)."""
    cpu = children_cpu_s()
    t = time.perf_counter()
    proc = children.popen(corral_argv(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                          env=child_env())
    try:
        out, err = proc.communicate(timeout=timeout)
        dt_s = time.perf_counter() - t
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"`corral {shlex.join(args)}` did not finish in {timeout:.0f} s") from None
    finally:
        children.kill(proc)
    return Timed(dt_s, children_cpu_s() - cpu, proc.returncode, len(out.splitlines()),
                 err.decode(errors="replace")[-1500:])


@dataclass
class Service:
    """A long-running `corral` service: its log lines (structlog JSON) are watched as they arrive."""

    name: str
    proc: subprocess.Popen[bytes]
    started: float
    metrics_port: int | None
    events: dict[str, float] = field(default_factory=dict)  # log event -> when first seen
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=40))
    saw_503: bool = False
    cpu_s: float | None = None  # CPU it had spent when it was seen caught up

    def watch(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            now = time.perf_counter()
            line = raw.decode(errors="replace").rstrip()
            self.tail.append(line)
            with contextlib.suppress(ValueError, AttributeError):
                ev = json.loads(line).get("event")
                if isinstance(ev, str):
                    self.events.setdefault(ev, now)

    def readyz(self) -> int | None:
        """/readyz's status code, None if nothing answers yet."""
        if self.metrics_port is None:
            return None
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/readyz", timeout=1.0) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)
        except (OSError, ValueError):
            return None

    def snapshot_events(self) -> list[str]:
        return sorted(e for e in self.events if "snapshot" in e)

    def why(self) -> str:
        return "\n".join(self.tail) or "(it printed nothing)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_service(children: Children, name: str, args: list[str], *, metrics: bool) -> Service:
    port = free_port() if metrics else None
    argv = corral_argv(*args, *(["--metrics-port", str(port), "--metrics-host", "127.0.0.1"] if port else []))
    t = time.perf_counter()
    proc = children.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT, env=child_env())
    svc = Service(name, proc, t, port)
    threading.Thread(target=svc.watch, name=f"log-{name}", daemon=True).start()
    return svc


def wait_ready(svc: Service, log_events: tuple[str, ...], timeout: float) -> tuple[float, str]:
    """Seconds from the process's start to caught up, and which signal said so (`svc.cpu_s`: its CPU by then).

    `/readyz` counts only once it was seen answering 503: a readiness that answers 200 as soon
    as NATS is connected (today's) says nothing about catching up, so the log line decides then.
    """
    deadline = svc.started + timeout
    while True:
        for ev in log_events:
            if ev in svc.events:
                svc.cpu_s = process_cpu_s(svc.proc.pid)
                return svc.events[ev] - svc.started, f"log:{ev}"
        code = svc.readyz()
        if code == 503:
            svc.saw_503 = True
        elif code == 200 and svc.saw_503:
            svc.cpu_s = process_cpu_s(svc.proc.pid)
            return time.perf_counter() - svc.started, "readyz"
        if svc.proc.poll() is not None:
            time.sleep(0.2)  # the watcher thread may still be reading its last lines
            raise RuntimeError(f"{svc.name} exited ({svc.proc.returncode}) before it caught up:\n{svc.why()}")
        if time.perf_counter() > deadline:
            raise RuntimeError(f"{svc.name} not caught up after {timeout:.0f} s (no {'/'.join(log_events)} "
                               f"in its log, /readyz never 503 then 200):\n{svc.why()}")
        time.sleep(0.05)


def proc_mb(pid: int) -> dict[str, float]:
    """The process's resident memory now and at its peak (MiB), from /proc (empty where there is none)."""
    rss, peak = vm_kb(pid, "VmRSS"), vm_kb(pid, "VmHWM")
    return {"rss_mb": round(rss / 1024, 1), "peak_rss_mb": round(peak / 1024, 1)} if rss else {}


def stop_service(children: Children, svc: Service, timeout: float) -> int | None:
    """SIGTERM to its group (a clean stop), SIGKILL after `timeout`; its exit code (None: killed)."""
    if svc.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(svc.proc.pid, signal.SIGTERM)
        try:
            svc.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            note(f"  {svc.name} did not stop within {timeout:.0f} s of SIGTERM: killed")
            children.kill(svc.proc)
            return None
    children.kill(svc.proc)
    return svc.proc.returncode


def has_command(name: str) -> str | None:
    """`corral NAME --help`'s text if it exits 0 (the command exists), else None."""
    try:
        proc = subprocess.run(corral_argv(name, "--help"), capture_output=True, text=True, cwd=ROOT, env=child_env(),
                              timeout=60, start_new_session=True)
    except subprocess.TimeoutExpired:
        return None
    return proc.stdout if proc.returncode == 0 else None


# --- the log -----------------------------------------------------------------------------------


@dataclass
class LogFacts:
    """What the load learned of the log: sizes, and what the readers are asked about."""

    events: int = 0
    jobs: int = 0
    oldest_job: str | None = None
    submitters: collections.Counter[str] = field(default_factory=collections.Counter)
    node: NodeRegistered | None = None
    last_time: float = 0.0


def rebased(event: Any, offset: float) -> Any:
    """The event with every absolute time moved by `offset` (occurred_at, and the two deadlines the log stores)."""
    changes: dict[str, float] = {"occurred_at": event.occurred_at + offset}
    if isinstance(event, JobWaiting) and event.hold_until > 0:
        changes["hold_until"] = event.hold_until + offset
    if isinstance(event, GangRestarted) and event.not_before > 0:
        changes["not_before"] = event.not_before + offset
    return msgspec.structs.replace(event, **changes)


def log_events(path: Path, offset: float, facts: LogFacts) -> Iterator[Event]:
    for env in LogFile(path).envelopes():
        event = env.event
        if isinstance(event, Unknown):
            raise RuntimeError(f"{path}: line {env.seq} is not an event this corral decodes (a log of another version?)")
        facts.events += 1
        if isinstance(event, JobSubmitted):
            facts.jobs += 1
            facts.oldest_job = facts.oldest_job or event.job_id
            facts.submitters[event.submitted_by or "-"] += 1
        elif isinstance(event, NodeRegistered) and facts.node is None and event.inventory.gpus:
            facts.node = event
        moved = rebased(event, offset)
        facts.last_time = max(facts.last_time, moved.occurred_at)
        yield moved


async def load(url: str, path: Path, chunk: int) -> tuple[LogFacts, float]:
    """Append the whole log to a fresh stream in pipelined chunks; what it held and the seconds it took."""
    facts = LogFacts()
    offset = time.time() - await LogFile(path).last_time()
    # A short duplicate window: the server keeps every id it saw within it, and a load publishes
    # millions in minutes (the services set the usual window again when they connect).
    bus = await Bus.connect(url, duplicate_window=30.0)
    try:
        t = time.perf_counter()
        batch: list[Event] = []
        for event in log_events(path, offset, facts):
            batch.append(event)
            if len(batch) >= chunk:
                await bus.append_many(batch, timeout=60.0)
                batch = []
                if facts.events % (chunk * 10) == 0:
                    note(f"  {facts.events:,} events ({facts.events / (time.perf_counter() - t):,.0f}/s)")
        if batch:
            await bus.append_many(batch, timeout=60.0)
        dt_s = time.perf_counter() - t
        last = await bus.last_seq()
        if last != facts.events:
            raise RuntimeError(f"the stream holds {last:,} events after loading {facts.events:,}")
    finally:
        await bus.close()
    return facts, dt_s


async def stream_bytes(url: str) -> dict[str, dict[str, int]]:
    """Every stream on the server (CORRAL, and the buckets: snapshots are OBJ_*): messages and bytes."""
    bus = await Bus.connect(url)
    try:
        out = {}
        for info in await bus.js.streams_info():
            out[info.config.name or "?"] = {"messages": int(info.state.messages), "bytes": int(info.state.bytes),
                                            "first_seq": int(info.state.first_seq)}
        return out
    finally:
        await bus.close()


def scrape_fold(svc: Service) -> tuple[int, int] | None:
    """(corral_log_position, corral_state_digest) from a one-reader service's /metrics, None if it has none."""
    if svc.metrics_port is None:
        return None
    with urllib.request.urlopen(f"http://127.0.0.1:{svc.metrics_port}/metrics", timeout=10.0) as r:
        text = r.read().decode()
    found: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        base = name.partition("{")[0]
        if base in ("corral_log_position", "corral_state_digest") and base not in found:
            found[base] = int(float(value))
    if len(found) < 2:
        return None
    return found["corral_log_position"], found["corral_state_digest"]


async def slice_fold_digest(url: str, node_id: str, upto: int) -> int:
    """The digest of `evolve_node` over the node's slice (#40) up to `upto`, read from the stream into an
    empty view: what the agent holds, whichever stored view it started from."""
    bus = await Bus.connect(url)
    try:
        view = NodeView(node_id=node_id)
        async for batch in bus.replay(1, to_seq=upto, subjects=slice_filters(node_id), stall_timeout=120.0):
            view = fold_batch(view, batch, evolve_node, contiguous=False, stream_times=True)
        return digest(view_bytes(view))
    finally:
        await bus.close()


def generate(jobs: int, out: Path, children: Children, timeout: float) -> Path:
    note(f"generating a {jobs:,}-job log (corral sim --generate {jobs}) ...")
    r = run_cli(children, ["sim", "--generate", str(jobs), "--no-figures", "--json", "--out", str(out)], timeout)
    path = out / "events-corral.jsonl"
    if r.rc != 0 or not path.exists():
        raise RuntimeError(f"corral sim --generate {jobs} failed ({r.rc}):\n{r.err}")
    return path


# --- the run -----------------------------------------------------------------------------------


def median_of(runs: list[Timed]) -> dict[str, Any]:
    return {"s": round(statistics.median(r.s for r in runs), 3), "runs": [round(r.s, 3) for r in runs],
            "cpu_s": round(statistics.median(r.cpu_s for r in runs), 3), "rc": runs[-1].rc, "lines": runs[-1].lines}


def cpu_round(x: float | None) -> float | None:
    return round(x, 3) if x is not None else None


def repeat(children: Children, label: str, args: list[str], runs: int, timeout: float,
           ok: Callable[[int], bool] = lambda rc: rc == 0) -> dict[str, Any]:
    out: list[Timed] = []
    for _ in range(runs):
        r = run_cli(children, args, timeout)
        if not ok(r.rc):
            raise RuntimeError(f"`corral {shlex.join(args)}` exit {r.rc}:\n{r.err}")
        out.append(r)
    fig = median_of(out)
    note(f"  {label:<14} {fig['s']:7.2f} s  (runs {', '.join(f'{s:.2f}' for s in fig['runs'])}; "
         f"CPU {fig['cpu_s']:.2f} s; exit {fig['rc']}, {fig['lines']} lines)")
    return fig


def option_for(help_text: str, *names: str) -> str | None:
    """The first of `names` the command's --help lists."""
    return next((n for n in names if f"{n} " in help_text or f"{n}=" in help_text or f"{n}\n" in help_text), None)


def start_optional(children: Children, name: str, help_text: str, url: str, tmp: Path, extra: list[str],
                   timeout: float) -> tuple[Service, dict[str, Any]]:
    """Start `corral index` / `corral archive` (the options its --help lists) and wait for its readiness."""
    args = ["--nats", url, name]
    if (d := option_for(help_text, "--data-dir", "--dir", "--path", "--archive-dir")) is not None:
        args += [d, str(tmp / name)]
    if option_for(help_text, "--log-level"):
        args += ["--log-level", "info"]
    svc = start_service(children, name, [*args, *extra], metrics=option_for(help_text, "--metrics-port") is not None)
    # The archiver folds nothing a reader waits for (no readiness gate): started is its ready.
    signals = ("archiver_started",) if name == "archive" else ("caught_up", "index_caught_up", "ready")
    s, signal_ = wait_ready(svc, signals, timeout)
    note(f"  {name:<14} {s:7.2f} s to ready ({signal_})")
    return svc, {"s": round(s, 3), "cpu_s": cpu_round(svc.cpu_s), "signal": signal_, "args": args[3:] + extra}


def run(log: Path, tmp: Path, children: Children, a: argparse.Namespace) -> dict[str, Any]:
    server = NatsServer(tmp / "nats", start_timeout=60.0)
    server.start()
    try:
        return measure(log, tmp, children, a, server.url)
    finally:
        children.kill_all()
        server.stop(timeout=30.0)


def measure(log: Path, tmp: Path, children: Children, a: argparse.Namespace, url: str) -> dict[str, Any]:
    nats = ["--nats", url]
    out: dict[str, Any] = {"log": str(log), "log_bytes": log.stat().st_size}
    load_before = os.getloadavg()

    note(f"loading {log} into a fresh stream ...")
    facts, load_s = asyncio.run(load(url, log, a.chunk))
    streams = asyncio.run(stream_bytes(url))
    corral = streams["CORRAL"]
    if facts.jobs == 0 or facts.oldest_job is None:
        raise RuntimeError(f"{log}: no JobSubmitted in it: not a workload's log")
    if facts.node is None:
        raise RuntimeError(f"{log}: no NodeRegistered with GPUs in it: no node for the agent")
    out |= {"jobs": facts.jobs, "events": facts.events, "load_s": round(load_s, 2),
            "load_per_s": round(facts.events / load_s), "stream_bytes": corral["bytes"],
            "bytes_per_job": round(corral["bytes"] / facts.jobs), "bytes_per_event": round(corral["bytes"] / facts.events)}
    note(f"  {facts.events:,} events of {facts.jobs:,} jobs in {load_s:.1f} s ({out['load_per_s']:,}/s); stream "
         f"{corral['bytes'] / 1e6:.1f} MB, {out['bytes_per_job']:,} bytes/job, {out['bytes_per_event']} bytes/event")

    user = facts.submitters.most_common(1)[0][0]
    since = dt.datetime.fromtimestamp(facts.last_time - DAY_S).isoformat(timespec="seconds")
    jobs_help = has_command("jobs") or ""
    user_opt = option_for(jobs_help, "--by-user", "--submitter") or "--by-user"
    jobs_all = ["jobs", "--all", user_opt, user, *(["--since", since] if option_for(jobs_help, "--since") else [])]
    node = facts.node
    out["asked"] = {"oldest_job": facts.oldest_job, "user": user, "user_jobs": facts.submitters[user], "since": since,
                    "jobs_all_args": jobs_all[1:], "node": node.node_id}

    services: dict[str, Any] = {}
    running: list[Service] = []
    for name, extra in (("archive", a.archive_args), ("index", a.index_args)):
        help_text = has_command(name)
        services[name] = help_text is not None
        if help_text is not None:
            note(f"corral {name} exists: starting it ...")
            svc, fig = start_optional(children, name, help_text, url, tmp, shlex.split(extra), a.timeout)
            running.append(svc)
            services[f"{name}_ready"] = fig
    out["services"] = services
    if services["archive"]:
        out["stream_bytes_after_archive"] = asyncio.run(stream_bytes(url))["CORRAL"]["bytes"]

    readers: dict[str, Any] = {}
    note("readers (start to caught up):")
    if not a.skip_jobs_cold:
        r = run_cli(children, [*nats, "jobs"], a.timeout)
        if r.rc != 0:
            raise RuntimeError(f"`corral jobs` exit {r.rc}:\n{r.err}")
        readers["jobs_cold"] = {"s": round(r.s, 3), "cpu_s": round(r.cpu_s, 3),
                                "note": "before any snapshot was written"}
        note(f"  {'jobs_cold':<14} {r.s:7.2f} s  (CPU {r.cpu_s:.2f} s; before any snapshot)")

    sched_args = [*nats, "scheduler", "--id", "bench", "--heartbeat-timeout", "3600", "--log-level", "info"]
    for label in ("scheduler_cold", "scheduler"):
        svc = start_service(children, label, sched_args, metrics=True)
        s, how = wait_ready(svc, ("caught_up",), a.timeout)
        code = stop_service(children, svc, a.timeout)  # a clean stop writes a snapshot
        readers[label] = {"s": round(s, 3), "cpu_s": cpu_round(svc.cpu_s), "signal": how,
                          "snapshot_log": svc.snapshot_events(), "exit": code}
        note(f"  {label:<14} {s:7.2f} s  (CPU {svc.cpu_s or 0:.2f} s; {how}; snapshot log events: "
             f"{svc.snapshot_events() or 'none'})")
    snaps = {k: v for k, v in asyncio.run(stream_bytes(url)).items() if k != "CORRAL"}
    out["buckets"] = snaps

    labels = ",".join(f"{k}={v}" for k, v in sorted(node.inventory.labels.items()))
    agent_args = [*nats, "agent", "--node-id", node.node_id, "--runtime", "simulated", "--fake-gpus",
                  str(node.inventory.gpu_count), "--gpu-model", node.inventory.gpus[0].model, "--address", "127.0.0.1",
                  "--data-dir", str(tmp / "agent"), "--heartbeat", "1", "--log-level", "info",
                  *(["--labels", labels] if labels else [])]
    svc = start_service(children, "agent", agent_args, metrics=True)
    s, how = wait_ready(svc, ("agent_started",), a.timeout)
    agent_fold = scrape_fold(svc)
    agent_mem = proc_mb(svc.proc.pid)  # #40: an agent's memory does not grow with the history it never reads
    stop_service(children, svc, a.timeout)
    readers["agent"] = {"s": round(s, 3), "cpu_s": cpu_round(svc.cpu_s), "signal": how,
                        "snapshot_log": svc.snapshot_events(), **agent_mem}
    if agent_fold is not None and not a.skip_digest:
        # #28 acceptance 4: the agent that started from a stored view holds what a fold of its whole slice holds.
        seq, agent_digest = agent_fold
        t = time.perf_counter()
        full = asyncio.run(slice_fold_digest(url, node.node_id, seq))
        readers["agent"]["digest"] = {"seq": seq, "agent": agent_digest, "full_fold": full,
                                      "equal": full == agent_digest, "full_fold_s": round(time.perf_counter() - t, 1)}
        note(f"  agent digest at seq {seq:,}: {agent_digest} vs a full fold's {full}: "
             f"{'EQUAL' if full == agent_digest else 'DIFFERENT'}")
    note(f"  {'agent':<14} {s:7.2f} s  (CPU {svc.cpu_s or 0:.2f} s; {how}; node {node.node_id}; snapshot log events: "
         f"{svc.snapshot_events() or 'none'})")

    for label, args in (("jobs", ["jobs"]), ("nodes", ["nodes"])):
        readers[label] = repeat(children, label, [*nats, *args], a.runs, a.timeout)
    out["readers"] = readers

    note("queries:")
    queries: dict[str, Any] = {}
    queries["usage"] = repeat(children, "usage", [*nats, "usage"], a.runs, a.timeout)
    queries["explain"] = repeat(children, "explain", [*nats, "explain", facts.oldest_job], a.runs, a.timeout)
    # Today the fold forgets a job once 10,000 newer ones finished: "not found" (4) is a finding, not an error.
    queries["job"] = repeat(children, "job", [*nats, "job", facts.oldest_job], a.runs, a.timeout,
                            ok=lambda rc: rc in (0, 4))
    queries["jobs_all"] = repeat(children, "jobs_all", [*nats, *jobs_all], a.runs, a.timeout)
    out["queries"] = queries

    note("baseline:")
    # What any `corral` command costs before it reads anything (interpreter start, imports): the floor
    # under every reader's and query's figure on this machine.
    out["cli_floor"] = repeat(children, "--version", ["--version"], a.runs, a.timeout)
    if a.baseline_runs > 0:
        base = repeat(children, "jobs --log", ["jobs", "--log", str(log)], a.baseline_runs, a.timeout)
        out["baseline"] = {"jobs_file": base}
        if "jobs_cold" in readers:  # the same fold from NATS and from the file (the item 5)
            out["baseline"]["nats_vs_file"] = round(base["s"] / readers["jobs_cold"]["s"], 3)

    for svc in running:
        stop_service(children, svc, 60.0)
    out["stream_bytes_end"] = asyncio.run(stream_bytes(url))["CORRAL"]["bytes"]
    out["loadavg_before"] = [round(x, 2) for x in load_before]
    out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    out["runs"] = a.runs
    out["python"] = platform.python_version()
    return out


# --- compare -----------------------------------------------------------------------------------


def figures(run: dict[str, Any]) -> dict[str, tuple[str, float]]:
    """name -> (kind, value) of every figure: reader, query or size (targets apply), or info (none do)."""
    out: dict[str, tuple[str, float]] = {}
    for key in ("stream_bytes", "bytes_per_job"):
        if isinstance(run.get(key), int | float):
            out[key] = ("size", float(run[key]))
    for group, kind in (("readers", "reader"), ("queries", "query")):
        for name, fig in run.get(group, {}).items():
            out[f"{kind}:{name}"] = ("info" if name in NO_SNAPSHOT_POSSIBLE else kind, float(fig["s"]))
            if isinstance(fig.get("cpu_s"), int | float):
                out[f"cpu:{kind}:{name}"] = ("info", float(fig["cpu_s"]))
    if isinstance(run.get("cli_floor"), dict):
        out["cli_floor"] = ("info", float(run["cli_floor"]["s"]))
    for name, fig in run.get("services", {}).items():
        if isinstance(fig, dict) and "s" in fig:
            out[f"service:{name}"] = ("info", float(fig["s"]))
    return out


def last_json(path: Path) -> dict[str, Any]:
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    if not lines:
        raise ValueError(f"{path}: empty")
    try:
        obj = json.loads(lines[-1])
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: its last line is not JSON ({e})") from None
    if not isinstance(obj, dict) or "readers" not in obj:
        raise ValueError(f"{path}: its last line is not a bench/history.py result")
    return obj


def compare(a_path: Path, b_path: Path) -> dict[str, Any]:
    a, b = last_json(a_path), last_json(b_path)
    fa, fb = figures(a), figures(b)
    print(f"{b_path.name} ({b.get('jobs', '?'):,} jobs) / {a_path.name} ({a.get('jobs', '?'):,} jobs)")
    ratios: dict[str, float | None] = {}
    targets: dict[str, bool] = {}
    for name in sorted(fa.keys() | fb.keys()):
        kind, va = fa.get(name, ("?", float("nan")))
        _, vb = fb.get(name, (kind, float("nan")))
        ratio = vb / va if name in fa and name in fb and va > 0 else None
        ratios[name] = round(ratio, 3) if ratio is not None else None
        print(f"  {name:<24} {va:>14,.3f} -> {vb:>14,.3f}   ratio {'-' if ratio is None else f'{ratio:.2f}'}")
        if kind == "info":
            continue
        if kind in ("reader", "query") and name in fb:
            limit = READER_TARGET_S if kind == "reader" else QUERY_TARGET_S
            targets[f"{name} <= {limit:g} s"] = vb <= limit
        targets[f"{name} ratio <= {RATIO_TARGET}"] = ratio is not None and ratio <= RATIO_TARGET
    for name, fig in b.get("queries", {}).items():
        if fig.get("rc", 0) != 0:  # fast but not answered (today: `job` of a job the fold forgot) is not met
            targets[f"query:{name} answered (exit {fig['rc']})"] = False
    check = b.get("readers", {}).get("agent", {}).get("digest")
    if isinstance(check, dict):  # acceptance 4: the restarted agent holds what a fold of every event holds
        targets[f"agent digest at seq {check.get('seq')} equals a full fold's"] = check.get("equal") is True
    if "--since" not in b.get("asked", {}).get("jobs_all_args", ["--since"]):
        print("NOTE: query:jobs_all ran without --since: this corral's `jobs` has no such option")
    for t, met in targets.items():
        print(f"{'MET' if met else 'NOT MET'}: {t}")
    return {"a": str(a_path), "b": str(b_path), "ratios": ratios, "targets": targets,
            "all_met": all(targets.values()) if targets else False}


# --- main --------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--log", type=Path, help="a corral sim event log (events-<policy>.jsonl)")
    src.add_argument("--jobs", type=int, help="generate a log of N jobs first (corral sim --generate N)")
    src.add_argument("--compare", nargs=2, type=Path, metavar=("A.json", "B.json"),
                     help="two runs' output (their last line): B/A ratios and the issue's targets")
    ap.add_argument("--runs", type=int, default=3, help="runs of each reader and query; the median counts")
    ap.add_argument("--chunk", type=int, default=50_000, help="events per append_many call while loading")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds any one step may take")
    ap.add_argument("--baseline-runs", type=int, default=1,
                    help="runs of the file-fold baseline `corral jobs --log FILE` (0: skip it)")
    ap.add_argument("--skip-jobs-cold", action="store_true",
                    help="do not time `corral jobs` before any snapshot (a whole-log fold: minutes at 500,000 jobs)")
    ap.add_argument("--skip-digest", action="store_true",
                    help="do not check the agent's digest against a full fold (minutes at 500,000 jobs)")
    ap.add_argument("--index-args", default="", help="extra arguments for `corral index`, if it exists")
    ap.add_argument("--archive-args", default="", help="extra arguments for `corral archive`, if it exists")
    a = ap.parse_args()
    if a.compare:
        try:
            print(json.dumps(compare(*a.compare)))
        except (OSError, ValueError) as e:
            print(f"history.py: {e}", file=sys.stderr)
            return 2
        return 0
    if a.runs < 1 or a.chunk < 1:
        ap.error("--runs and --chunk must be at least 1")
    if a.log is not None and not a.log.is_file():
        ap.error(f"--log {a.log}: no such file")

    def terminated(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # unwinds through the finally blocks that kill the children

    signal.signal(signal.SIGTERM, terminated)
    children = Children()
    try:
        with tempfile.TemporaryDirectory(prefix="corral-history-") as tmp_name:
            tmp = Path(tmp_name)
            log = a.log.resolve() if a.log is not None else generate(a.jobs, tmp / "sim", children, a.timeout)
            result = run(log, tmp, children, a)
    except RuntimeError as e:
        print(f"history.py: {e}", file=sys.stderr)
        return 1
    finally:
        children.kill_all()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
