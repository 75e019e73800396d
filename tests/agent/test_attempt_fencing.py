"""Workers are fenced by attempt: an agent starts, reports and recovers only for what is current in its fold.

DESIGN.md, "Safety by construction": a checkpoint belongs to one attempt, and
an agent never reports or starts anything for an attempt that is not current
in its fold. These drive one in-process agent against a real nats-server with
the log moving under it; tests/faults/ does the same with real processes
(test_orphan_checkpoint.py, test_gang_backoff.py, test_agent_partition.py).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from events.bus import Bus
from nodeagent.agent import Agent, AgentConfig
from nodeagent.checkpoint import Manifest, write_manifest
from nodeagent.runtime.base import WorkerHandle, WorkerSpec
from nodeagent.runtime.simulated import SimulatedRuntime
from orchestrator.core.node_view import NodeView
from schemas import Checkpointed, GangRestarted, JobFailed, NodeFailed, NodeRecovered, WorkerExited, WorkerStarted
from tests.agent.relay import relay
from tests.agent.test_reconcile import placed, running
from tests.core.harness import inventory
from tests.integration.harness import wait_until


class SlowStart(SimulatedRuntime):
    """A start that waits for `gate` (pulling an image, spawning a process) while the log moves on."""

    def __init__(self) -> None:
        super().__init__()
        self.gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.at_gate = asyncio.Event()
        self.started: list[WorkerSpec] = []

    async def start(self, spec: WorkerSpec) -> WorkerHandle:
        self.started.append(spec)
        self.at_gate.set()
        await self.gate
        return await super().start(spec)


async def log_of(bus: Bus, job_id: str) -> list[object]:
    return [env.event async for batch in bus.replay() for env in batch if getattr(env.event, "job_id", "") == job_id]


async def test_a_worker_whose_attempt_failed_while_it_started_is_not_told_and_is_stopped(
        bus: Bus, tmp_path: Path) -> None:
    """Seen in a fault run: `JobFailed` then `WorkerStarted attempt=4` in the log."""
    sim = await placed(bus, "A")
    runtime = SlowStart()
    agent = Agent(bus, AgentConfig(node_id="n0", data_dir=tmp_path), inventory(), runtime)
    await agent.follower.catch_up()
    following = asyncio.create_task(agent.follower.follow())
    try:
        starting = asyncio.create_task(agent.reconcile())
        await asyncio.wait_for(runtime.at_gate.wait(), 10)
        async with relay(bus):  # the scheduler's part: the node is told to let A go
            await bus.append(JobFailed(event_id="failed:A", occurred_at=sim.now, job_id="A", attempt=1,
                                       reason="test"))
            await wait_until(agent.follower, lambda v: "A" not in v.work, 10, "A's release folded")
        runtime.gate.set_result(None)
        await asyncio.wait_for(starting, 10)
        await asyncio.wait_for(_until(lambda: not agent.workers), 10)
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)
        await agent.stop_workers(0.1)
    assert len(runtime.started) == 1 and all(w.done.done() for w in runtime._workers.values()), "started, then stopped"
    told = [type(e).__name__ for e in await log_of(bus, "A") if isinstance(e, WorkerStarted | WorkerExited)]
    assert told == [], f"the log tells of a worker of an attempt that had failed: {told}"


async def test_only_the_current_attempts_own_checkpoints_are_reported(bus: Bus, tmp_path: Path) -> None:
    """Each attempt checkpoints in its own directory; a manifest naming another attempt is not this one's."""
    await placed(bus, "C")
    agent = Agent(bus, AgentConfig(node_id="n0", data_dir=tmp_path), inventory(), SimulatedRuntime())
    async with running(agent), relay(bus) as scheduler:
        await wait_until(agent.follower, lambda v: _status(v, "C") == "started", 10, "C's worker")
        mine = Path(agent.workers[("C", 1, 0)].spec.checkpoint_dir or "")
        assert mine == tmp_path / "checkpoints" / "C" / "attempt-1" / "rank-0"
        mine.mkdir(parents=True)  # (the process and Docker runtimes make it; the simulated one writes nothing)
        write_manifest(mine, Manifest(step=900, path="/not-this-attempts", attempt=7))  # not this attempt's
        await asyncio.sleep(2.5)  # two checkpoint scans
        write_manifest(mine, Manifest(step=100, path="/mine", attempt=1))
        await wait_until(scheduler.follower, lambda s: s.jobs["C"].checkpoint is not None, 10, "C's checkpoint")
    steps = [(e.attempt, e.step, e.path) for e in await log_of(bus, "C") if isinstance(e, Checkpointed)]
    assert steps == [(1, 100, "/mine")], steps


async def test_a_node_recovers_from_every_failure(bus: Bus, tmp_path: Path) -> None:
    """Once per NodeFailed, not once per agent process: the id names the failure's position."""
    await placed(bus, "J")
    agent = Agent(bus, AgentConfig(node_id="n0", data_dir=tmp_path, tick_s=0.1), inventory(), SimulatedRuntime())
    async with running(agent):
        await wait_until(agent.follower, lambda v: v.node is not None and v.node.incarnation == agent.incarnation,
                         10, "registered")
        for i in range(3):
            await bus.append(NodeFailed(event_id=f"failed-{i}", occurred_at=time.time(), node_id="n0",
                                        incarnation=agent.incarnation, reason="test"))
            await wait_until(agent.follower, lambda v: v.node.failed, 10, f"failure {i}")
            await wait_until(agent.follower, lambda v: not v.node.failed, 10, f"recovery {i}")
    events = [env.event async for batch in bus.replay() for env in batch]
    recovered = [e.event_id for e in events if isinstance(e, NodeRecovered)]
    assert len(recovered) == 3 == len(set(recovered)), recovered


async def test_a_gang_restart_waits_for_its_not_before(bus: Bus, tmp_path: Path) -> None:
    """The backoff is in the log: no worker of the restarted attempt starts before GangRestarted.not_before."""
    await placed(bus, "G", restart_policy="gang", max_restarts=2)
    runtime = SimulatedRuntime()
    agent = Agent(bus, AgentConfig(node_id="n0", data_dir=tmp_path, tick_s=0.1), inventory(), runtime)
    async with running(agent), relay(bus):
        await wait_until(agent.follower, lambda v: _status(v, "G") == "started", 10, "G's worker")
        now = time.time()  # a scheduler stamps both with one clock: the backoff is their difference (#30)
        not_before = now + 1.5
        await bus.append(GangRestarted(event_id="restart-G", occurred_at=now, job_id="G", attempt=2, epoch=1,
                                       not_before=not_before))
        await wait_until(agent.follower, lambda v: v.work["G"].attempt == 2 and _status(v, "G") == "started", 10,
                         "attempt 2's worker")
    started = [e for e in await log_of(bus, "G") if isinstance(e, WorkerStarted) and e.attempt == 2]
    assert len(started) == 1 and started[0].occurred_at >= not_before, (
        f"started {started[0].occurred_at - not_before:+.2f}s after its not_before")


def _status(view: NodeView, job_id: str, rank: int = 0) -> str | None:
    """Rank `rank` of `job_id` as the node's view has it reported (None: not reported, or not held)."""
    job = view.work.get(job_id)
    st = job.report(rank) if job is not None else None
    return st.status if st is not None else None


async def _until(predicate, interval: float = 0.05) -> None:  # type: ignore[no-untyped-def]
    while not predicate():
        await asyncio.sleep(interval)
