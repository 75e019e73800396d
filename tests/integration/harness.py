"""Helpers for integration tests: real `corral` processes and in-process simulated agents."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from pathlib import Path

from events.bus import Bus
from events.follow import Follower
from nodeagent.agent import Agent, AgentConfig
from nodeagent.backoff import Backoff
from nodeagent.fake_gpus import fake_inventory
from nodeagent.runtime.base import Runtime
from nodeagent.runtime.process import ProcessRuntime
from nodeagent.runtime.simulated import SimulatedRuntime
from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import HOLDING, ClusterState
from orchestrator.scheduler.service import Scheduler, SchedulerConfig
from schemas import ClusterConfigured

CORRAL = str(Path(sys.executable).parent / "corral")


def start_corral(*args: str, log: Path, env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A real `corral` process (its structlog JSON goes to `log`); `env` adds to this process's environment."""
    out = open(log, "ab")  # noqa: SIM115 - owned by the process for its lifetime
    proc = subprocess.Popen([CORRAL, *args], stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    proc.corral_log = log  # type: ignore[attr-defined]  # read back when a test reports the process died
    return proc


def log_tail(proc: subprocess.Popen[bytes], lines: int = 30) -> str:
    """The last lines a `start_corral` process wrote: what a failure message needs to say why it died."""
    path = getattr(proc, "corral_log", None)
    if path is None or not Path(path).exists():
        return "(no log)"
    return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
    return proc.wait(timeout)


RuntimeFactory = Callable[[str, Path], Runtime]


def simulated(node_id: str, data_dir: Path) -> Runtime:
    return SimulatedRuntime()


def processes(node_id: str, data_dir: Path) -> Runtime:
    return ProcessRuntime(data_dir / "workers", node_id=node_id)


@contextlib.asynccontextmanager
async def agents(bus: Bus, count: int, data_dir: Path, *, gpus: int = 8,
                 runtime: RuntimeFactory = simulated, **config: object) -> AsyncIterator[list[Agent]]:
    """`count` in-process agents n0..n{count-1} with fake GPUs (two nodes per leaf, eight per block);
    `config`: more AgentConfig fields."""
    made = []
    for i in range(count):
        node_id = f"n{i}"
        inv = fake_inventory(gpus, node_id=node_id, labels={"block": f"b{i // 8}", "leaf": f"l{i // 2}"})
        cfg = AgentConfig(node_id=node_id, data_dir=data_dir / node_id, heartbeat_s=0.5, tick_s=0.2,
                          checkpoint_root=data_dir / "checkpoints", backoff=Backoff(base_s=0.05, cap_s=0.2),
                          **config)  # type: ignore[arg-type]
        made.append(Agent(bus, cfg, inv, runtime(node_id, data_dir / node_id)))
    tasks = [asyncio.create_task(a.run()) for a in made]
    try:
        yield made
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(a.stop_workers(0.5) for a in made), return_exceptions=True)


@contextlib.asynccontextmanager
async def scheduler(bus: Bus, **config: object) -> AsyncIterator[Scheduler]:
    """An in-process scheduler (tests that do not kill it)."""
    defaults: dict[str, object] = {
        "scheduler_id": "test-scheduler", "tick_s": 0.2, "lease_ttl_s": 2.0, "heartbeat_timeout_s": 30.0,
        "cluster": ClusterConfigured(event_id="config:test", occurred_at=0.0, topology_levels=("block", "leaf"),
                                     min_runtime_s=0.0)}
    sched = Scheduler(bus, SchedulerConfig(**{**defaults, **config}))  # type: ignore[arg-type]
    task = asyncio.create_task(sched.run())
    try:
        yield sched
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def wait_until(follower: Follower[ClusterState], predicate, timeout: float,  # type: ignore[no-untyped-def]
                     what: str) -> None:
    def holds() -> bool:
        try:
            return bool(predicate(follower.state))
        except KeyError:  # a job the follower has not read yet
            return False

    # asyncio.timeout, not wait_for (see Follower.wait_changed): with wait_for, a deadline that
    # came as an event was folded was swallowed, and a stuck test hung until pytest's timeout.
    try:
        async with asyncio.timeout(timeout):
            while not holds():
                follower.changed.clear()
                await follower.wait_changed(0.5)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout}s waiting for {what}") from None


def assert_no_double_booking(events: Iterable[tuple[int, object]]) -> ClusterState:
    """Fold event by event and check, independently of `owners`, that no GPU is in two live gangs."""
    state = ClusterState()
    for seq, event in events:
        state = evolve(state, event, seq)  # type: ignore[arg-type]
        seen: dict[tuple[str, int], str] = {}
        for job_id in state.active:
            job = state.jobs[job_id]
            assert job.status in HOLDING
            for p in job.placement:
                for g in p.gpus:
                    other = seen.setdefault((p.node_id, g), job_id)
                    assert other == job_id, f"seq {seq}: GPU {p.node_id}/{g} held by {other} and {job_id}"
            ranks = {p.rank for p in job.placement}
            assert ranks == set(range(job.spec.ranks)), f"seq {seq}: gang {job_id} is partial: {sorted(ranks)}"
    return state
