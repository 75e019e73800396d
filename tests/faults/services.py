"""Real `corral scheduler` / `corral agent` processes for fault tests, and waiting on the log.

Fault tests kill, partition and restart these, so they are separate OS
processes talking to a real nats-server, exactly as deployed; only the test's
own observer (a Follower) and, where a test says so, simulated agents live in
the test process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from pathlib import Path

from events.bus import Bus
from events.follow import Follower
from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import ClusterState
from tests.integration.harness import log_tail, start_corral, stop

Proc = subprocess.Popen[bytes]


def scheduler_proc(url: str, sid: str, logs: Path, *, heartbeat_timeout: float = 60.0, lease_ttl: float = 1.5,
                   min_runtime: float = 60.0, snapshot_every: int = 10_000, env: Mapping[str, str] | None = None,
                   policy: str = "corral", log_level: str = "warning") -> Proc:
    """`corral scheduler` with test-sized timers; its JSON log goes to logs/<sid>.log (`env`: added variables)."""
    return start_corral(
        "--nats", url, "scheduler", "--id", sid, "--lease-ttl", str(lease_ttl), "--tick", "0.2",
        "--heartbeat-timeout", str(heartbeat_timeout), "--topology-levels", "block,leaf",
        "--min-runtime", str(min_runtime), "--snapshot-every", str(snapshot_every), "--log-level", log_level,
        "--policy", policy, log=logs / f"{sid}.log", env=env,
    )


def agent_proc(url: str, node_id: str, data_dir: Path, *, runtime: str = "simulated", gpus: int = 8,
               heartbeat: float = 0.5, index: int = 0, env: Mapping[str, str] | None = None) -> Proc:
    """`corral agent` on fake GPUs; labels put two nodes per leaf and eight per block, like the harness."""
    return start_corral(
        "--nats", url, "agent", "--node-id", node_id, "--runtime", runtime, "--fake-gpus", str(gpus),
        "--labels", f"block=b{index // 8},leaf=l{index // 2}", "--data-dir", str(data_dir),
        "--checkpoint-root", str(data_dir / "checkpoints"), "--address", "127.0.0.1",
        "--heartbeat", str(heartbeat), "--log-level", "info",
        log=data_dir / f"agent-{node_id}.log", env=env,
    )


def kill(proc: Proc) -> None:
    """SIGKILL: no goodbye, no clean-stop snapshot, no lease release."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def stop_all(procs: list[Proc]) -> list[int]:
    """SIGTERM each (a clean stop), SIGKILL what does not stop in time; their exit codes."""
    codes = []
    for p in procs:
        try:
            codes.append(stop(p, timeout=8))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(p.wait())
    return codes


@contextlib.asynccontextmanager
async def observer(bus: Bus) -> AsyncIterator[Follower[ClusterState]]:
    """The test's own projection of the live log."""
    f = Follower(bus, evolve, ClusterState())
    task = asyncio.create_task(f.follow())
    try:
        yield f
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def until(follower: Follower[ClusterState], predicate: Callable[[ClusterState], bool], timeout: float, what: str,
                *, alive: Sequence[Proc] = ()) -> None:
    """Wait for `predicate(state)`; fail early (with its log tail) if a service process died meanwhile.

    A predicate that looks up a job the observer has not read yet (KeyError:
    the submit is acked before our follower sees it) counts as not yet true.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not _holds(predicate, follower.state):
        for p in alive:
            if p.poll() is not None:
                raise AssertionError(f"a service died (rc={p.returncode}, args={p.args[3:7]}) while waiting for "
                                     f"{what}; its log ends:\n{log_tail(p)}")
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        follower.changed.clear()
        await follower.wait_changed(0.25)


def _holds(predicate: Callable[[ClusterState], bool], state: ClusterState) -> bool:
    try:
        return predicate(state)
    except KeyError:
        return False


def logged_starts(logs: Iterable[Path]) -> Counter[tuple[str, int, int]]:
    """(job, attempt, rank) -> how many times agent processes logged starting that worker.

    For agents in other processes the runtime cannot be instrumented; their
    own `worker_started` log lines (written after the runtime started the
    worker) are the record of real starts, duplicates included, which the log
    hides (a second WorkerStarted with the same id is deduplicated).
    """
    seen: Counter[tuple[str, int, int]] = Counter()
    for path in logs:
        for line in path.read_text(errors="replace").splitlines():
            if '"worker_started"' not in line:
                continue
            with contextlib.suppress(ValueError, KeyError):
                rec = json.loads(line)
                seen[(rec["job_id"], int(rec["attempt"]), int(rec["rank"]))] += 1
    return seen
