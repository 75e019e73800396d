"""The agent's reconcile pass against a log that moves while the pass awaits.

A pass reads what should run here once, then awaits each start (the runtime,
the append of WorkerStarted). Meanwhile other workers exit and their exits are
folded. A rank whose worker ended during the pass must not be started again
when the pass reaches it: its second run would be invisible in the log (the
WorkerStarted and WorkerExited ids dedupe) but real on the GPUs. CI's
scheduler-kill fault test caught it: a burst of placements after an election
made a long pass on one node, and a 2-rank gang that finished meanwhile ran twice.
(tests/faults/test_exit_race.py covers the moment before the exit is folded.)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from structlog.testing import LogCapture

import nodeagent.agent
from events.bus import Bus
from events.follow import Follower
from events.nodeviews import NodeViewStore
from events.server import NatsServer
from nodeagent.agent import Agent, AgentConfig
from nodeagent.runtime.base import ExitInfo, FoundWorker, WorkerHandle, WorkerSpec, WorkerStartError
from nodeagent.runtime.simulated import SimulatedRuntime
from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import ClusterState
from orchestrator.core.node_view import NodeView, node_view_of
from schemas import GangRestarted, JobRequeued, JobRunning, WorkerExited, WorkerStarted
from tests.agent.relay import relay
from tests.core.harness import Sim, inventory
from tests.integration.harness import wait_until


class GatedRuntime(SimulatedRuntime):
    """Counts starts per job; job A cannot start at attempt 1 and waits for `gate` at attempt 2."""

    def __init__(self) -> None:
        super().__init__()
        self.starts: Counter[str] = Counter()
        self.gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.at_gate = asyncio.Event()

    async def start(self, spec: WorkerSpec) -> WorkerHandle:
        self.starts[spec.job_id] += 1
        if spec.job_id == "A" and spec.attempt == 1:
            raise WorkerStartError("no such image")
        if spec.job_id == "A":
            self.at_gate.set()
            await self.gate
        return await super().start(spec)

    def finish(self, job_id: str) -> None:
        for w in self._workers.values():
            if w.spec.job_id == job_id:
                self._finish(w, ExitInfo.of(0, None))

    def crash(self, job_id: str) -> None:
        for w in self._workers.values():
            if w.spec.job_id == job_id:
                self._finish(w, ExitInfo.of(1, None))


def captured_agent_log(monkeypatch: pytest.MonkeyPatch) -> LogCapture:
    """The agent's log lines as it writes them (structlog's capture_logs misses loggers cached earlier)."""
    capture = LogCapture()
    monkeypatch.setattr(nodeagent.agent, "log", structlog.wrap_logger(
        None, processors=[capture], wrapper_class=structlog.BoundLogger, cache_logger_on_first_use=False))
    return capture


async def placed(bus: Bus, job_id: str, **spec: Any) -> Sim:
    """One node, n0, with `job_id` placed on it; the log so far on `bus`."""
    sim = Sim()
    sim.node("n0")
    sim.submit(job_id, command=("sleep", "3600"), **spec)
    sim.decide()
    await bus.append_many(sim.log)
    return sim


def status(view: NodeView, job_id: str, rank: int = 0) -> str | None:
    """Rank `rank` of `job_id` as the node's view has it reported (None: not reported, or the node let it go)."""
    job = view.work.get(job_id)
    st = job.report(rank) if job is not None else None
    return st.status if st is not None else None


@contextlib.asynccontextmanager
async def running(agent: Agent) -> AsyncIterator[None]:
    """The agent's whole service (adoption, registration, the reconcile loop) while the block runs."""
    task = asyncio.create_task(agent.run())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await agent.stop_workers(0.1)


async def test_a_worker_that_ends_while_a_pass_awaits_another_start_is_not_started_again(
    bus: Bus, tmp_path: Path
) -> None:
    sim = Sim()
    sim.node("n0")
    sim.submit("A", restart_policy="gang", max_restarts=1, command=("sleep", "3600"))
    sim.submit("B", command=("sleep", "3600"))
    sim.decide()
    assert list(sim.state.active) == ["A", "B"]  # a pass visits A's ranks first
    await bus.append_many(sim.log)

    runtime = GatedRuntime()
    agent = Agent(bus, AgentConfig(node_id="n0", data_dir=tmp_path), inventory(), runtime)
    await agent.follower.catch_up()
    following = asyncio.create_task(agent.follower.follow())
    scheduler = relay(bus)
    cluster = await scheduler.__aenter__()
    try:
        await agent.reconcile()  # A fails to start (reported as a crash), B starts
        await wait_until(cluster.follower, lambda s: s.jobs["A"].failure and s.ranks["B"][0].status == "started", 10,
                         "A's crash and B's start in the log")
        await bus.append(GangRestarted(event_id="restart-A", occurred_at=sim.now, job_id="A", attempt=2, epoch=1))
        await wait_until(agent.follower, lambda v: "A" in v.work and v.work["A"].attempt == 2, 10,
                         "the gang restart told")

        second = asyncio.create_task(agent.reconcile())  # waits in A's start at attempt 2
        await asyncio.wait_for(runtime.at_gate.wait(), 10)
        runtime.finish("B")

        def b_done(v: NodeView) -> bool:
            return "B" not in v.work and ("B", 1, 0) not in agent.workers

        await wait_until(agent.follower, b_done, 10, "B's exit folded and its worker forgotten")
        runtime.gate.set_result(None)
        await asyncio.wait_for(second, 10)
    finally:
        await scheduler.__aexit__(None, None, None)
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)
        await agent.stop_workers(0.1)

    assert runtime.starts == {"A": 2, "B": 1}, f"starts per job: {dict(runtime.starts)}"


async def test_a_rank_whose_start_failed_is_not_started_again_before_its_report_is_folded(
    bus: Bus, tmp_path: Path
) -> None:
    """A failed start is reported as the rank's exit; until that report is folded the state still says run."""
    await placed(bus, "A")

    runtime = GatedRuntime()  # A cannot start at attempt 1
    agent = Agent(bus, AgentConfig(node_id="n0", data_dir=tmp_path), inventory(), runtime)
    await agent.follower.catch_up()
    try:
        await agent.reconcile()  # the start fails; its WorkerExited is appended, and nobody has folded it
        await agent.reconcile()  # a second pass on that state, as the next tick or another agent's event starts one
        assert runtime.starts == {"A": 1}, f"starts per job: {dict(runtime.starts)}"
        await agent.follower.catch_up()
        assert "A" not in agent.follower.state.work, "its only rank exited: the node is through with it"
        await agent.reconcile()
    finally:
        await agent.stop_workers(0.1)
    assert runtime.starts == {"A": 1}, f"starts per job: {dict(runtime.starts)}"


async def test_a_new_agent_process_restarts_a_restarting_rank_as_its_next_generation(bus: Bus, tmp_path: Path) -> None:
    """The count of restarts lives in the log, not in the agent that died during the backoff.

    Started again as generation 0, the worker's WorkerStarted and WorkerExited reuse the first
    generation's event ids: the log drops them as duplicates, the rank stays "restarting", and
    a worker that completes is started again and again, each run invisible.
    """
    sim = await placed(bus, "R", restart_policy="rank", max_restarts=2)
    await bus.append(WorkerStarted(event_id="started:R:1:0:0", occurred_at=sim.now, job_id="R", attempt=1, rank=0,
                                   node_id="n0", restarts=0))
    await bus.append(WorkerExited(event_id="exited:R:1:0:0", occurred_at=sim.now, job_id="R", attempt=1, rank=0,
                                  node_id="n0", exit_code=1, reason="crashed", restarts=0, will_restart=True))

    runtime = GatedRuntime()  # the agent that reported will_restart died; this is its successor
    agent = Agent(bus, AgentConfig(node_id="n0", data_dir=tmp_path), inventory(), runtime)
    await agent.follower.catch_up()
    assert status(agent.follower.state, "R") == "restarting"
    try:
        await agent.reconcile()
        await agent.follower.catch_up()
        assert [w.spec.restarts for w in runtime._workers.values()] == [1]
        assert status(agent.follower.state, "R") == "started", "its WorkerStarted was dropped as a duplicate"
    finally:
        await agent.stop_workers(0.1)


async def test_a_rank_whose_worker_vanished_while_the_agent_was_down_is_reported_lost(
    bus: Bus, tmp_path: Path
) -> None:
    """Not started again under the vanished worker's event ids: lost, so the scheduler requeues the gang."""
    sim = await placed(bus, "V")
    await bus.append(WorkerStarted(event_id="started:V:1:0:0", occurred_at=sim.now, job_id="V", attempt=1, rank=0,
                                   node_id="n0"))

    runtime = GatedRuntime()  # adopt() finds nothing: the worker left no trace
    agent = Agent(bus, AgentConfig(node_id="n0", data_dir=tmp_path), inventory(), runtime)
    async with running(agent), relay(bus) as scheduler:
        await wait_until(scheduler.follower, lambda s: s.ranks["V"][0].status == "exited", 10,
                         "the lost rank's report")
        await asyncio.sleep(0.6)  # a reconcile tick on that state
    rank, job = scheduler.state.ranks["V"][0], scheduler.state.jobs["V"]
    assert (rank.reason, job.lost) == ("lost", 1)
    assert runtime.starts == {}, f"starts per job: {dict(runtime.starts)}"
    sim.state = scheduler.state.copy()  # the scheduler's answer to that log
    assert [(e.job_id, e.attempt, e.reason) for e in sim.decide() if isinstance(e, JobRequeued)] == [
        ("V", 2, "1 rank(s) lost")]


@pytest.mark.parametrize("from_snapshot", [False, True], ids=["full-fold", "from-snapshot"])
async def test_a_worker_of_an_attempt_requeued_while_the_agent_was_down_is_reported_ended(
    bus: Bus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, from_snapshot: bool
) -> None:
    """Its gang moved on (the node failed, the job was requeued as attempt 2) while the agent was down and the
    worker died with it. The fold ignores attempt 1's exit, but without it the log showed attempt 1's worker on
    its GPUs forever, beside every later worker there (found by tests/faults/chaos_check.py).

    From a node view stored after all that, the agent never reads the WorkerStarted: the view's
    `unended` must tell it (#28, #40)."""
    sim = await placed(bus, "Q")
    sent = len(sim.log)
    sim.start("Q")
    sim.fail_node("n0")
    assert [(e.job_id, e.attempt) for e in sim.decide() if isinstance(e, JobRequeued)] == [("Q", 2)]
    await bus.append_many(sim.log[sent:])
    if from_snapshot:
        await NodeViewStore(bus.js).save([("n0", node_view_of(sim.state, "n0"))], sim.state.seq,
                                         node_view_of(sim.state, ""))
    logged = captured_agent_log(monkeypatch)

    agent = Agent(bus, AgentConfig(node_id="n0", data_dir=tmp_path), inventory(), GatedRuntime())
    async with running(agent):
        await wait_until(agent.follower, lambda v: v.node is not None and not v.node.failed, 10,
                         "the agent's registration")
        # The registration may be folded while the catch-up still runs: its log line comes after.
        for _ in range(100):
            if any(e["event"] == "caught_up" for e in logged.entries):
                break
            await asyncio.sleep(0.1)
    assert [e["from_view"] for e in logged.entries if e["event"] == "caught_up"] == [
        len(sim.log) if from_snapshot else 0]
    ended = [(env.event.attempt, env.event.reason) async for batch in bus.replay() for env in batch
             if isinstance(env.event, WorkerExited) and env.event.job_id == "Q"]
    assert ended == [(1, "lost")]


class SurvivingRuntime(GatedRuntime):
    """Its workers outlive the agent process, as Docker's and the process runtime's do."""

    async def adopt(self) -> list[FoundWorker]:
        return [FoundWorker(WorkerHandle(wid, w.spec.labels), running=not w.done.done(),
                            exit=w.done.result() if w.done.done() else None) for wid, w in self._workers.items()]


async def test_a_worker_started_by_an_agent_that_died_before_telling_the_log_is_told_when_adopted(
    bus: Bus, tmp_path: Path
) -> None:
    """Adopted and watched but never in the log as started, its gang stayed reserved for good."""
    sim = await placed(bus, "W")
    runtime = SurvivingRuntime()
    # The previous agent process got this far, and died before appending WorkerStarted.
    await runtime.start(WorkerSpec(job_id="W", attempt=1, rank=0, node_id="n0", command=("sleep", "3600")))

    agent = Agent(bus, AgentConfig(node_id="n0", data_dir=tmp_path), inventory(), runtime)
    async with running(agent), relay(bus) as scheduler:
        await wait_until(scheduler.follower, lambda s: s.ranks["W"][0].status == "started", 10,
                         "the adopted worker's start")
    assert runtime.starts == {"W": 1}, f"starts per job: {dict(runtime.starts)}"
    sim.state = scheduler.state.copy()
    assert [e.job_id for e in sim.decide() if isinstance(e, JobRunning)] == ["W"]


async def test_an_exit_told_before_the_agent_died_is_not_told_again_when_its_worker_is_adopted(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """The agent reported a crash with will_restart and died before removing the worker.

    Its successor must not report that exit again: past the log's duplicate window the second
    report (will_restart false) is stored, and the rank that was to restart fails the job.
    """
    bus = await Bus.connect(nats_server.url, duplicate_window=1.0)
    try:
        sim = await placed(bus, "R", restart_policy="rank", max_restarts=2)
        runtime = SurvivingRuntime()
        await runtime.start(WorkerSpec(job_id="R", attempt=1, rank=0, node_id="n0", command=("sleep", "3600")))
        runtime.crash("R")
        await bus.append(WorkerStarted(event_id="started:R:1:0:0", occurred_at=sim.now, job_id="R", attempt=1,
                                       rank=0, node_id="n0"))
        await bus.append(WorkerExited(event_id="exited:R:1:0:0", occurred_at=sim.now, job_id="R", attempt=1,
                                      rank=0, node_id="n0", exit_code=1, reason="crashed", will_restart=True))
        await asyncio.sleep(1.5)  # past the duplicate window

        agent = Agent(bus, AgentConfig(node_id="n0", data_dir=tmp_path), inventory(), runtime)
        async with running(agent), relay(bus) as scheduler:
            await wait_until(agent.follower, lambda v: status(v, "R") == "started", 10, "the next generation")
            await wait_until(scheduler.follower, lambda s: s.ranks["R"][0].status == "started", 10, "its start folded")
        report = agent.follower.state.work["R"].report(0)
        assert report is not None and (report.restarts, scheduler.state.jobs["R"].failure) == (1, "")
    finally:
        await bus.close()


async def test_an_agent_restarted_from_its_stored_view_holds_what_its_slice_folds_to_and_adopts_its_workers(
    bus: Bus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Acceptance 4 of #28 in small, with #40's node views: the restarted agent starts from the view the scheduler
    stored, holds what the scheduler's state says of its node at the same position, and the worker that
    outlived the first agent is adopted, not started twice."""
    await placed(bus, "S")
    runtime = SurvivingRuntime()
    logged = captured_agent_log(monkeypatch)
    first = Agent(bus, AgentConfig(node_id="n0", data_dir=tmp_path), inventory(), runtime)
    task = asyncio.create_task(first.run())
    try:
        await wait_until(first.follower, lambda v: status(v, "S") == "started", 10, "S's worker started")
    finally:
        task.cancel()  # its process dies, the worker does not (no stop_workers)
        await asyncio.gather(task, return_exceptions=True)
    # The first agent process is gone, its worker runs on; the scheduler stores the node's view as it is.
    full = Follower(bus, evolve, ClusterState())
    await full.catch_up()
    await NodeViewStore(bus.js).save([("n0", node_view_of(full.state, "n0"))], full.state.seq,
                                     node_view_of(full.state, ""))

    second = Agent(bus, AgentConfig(node_id="n0", data_dir=tmp_path), inventory(), runtime)
    async with running(second):
        await wait_until(second.follower, lambda v: v.node is not None and v.node.incarnation == second.incarnation,
                         10, "the second agent's registration")
        held = second.follower.state
        adopted = second.workers.get(("S", 1, 0))
    fresh = Follower(bus, evolve, ClusterState())
    await fresh.catch_up(to_seq=held.seq)
    assert held.facts() == node_view_of(fresh.state, "n0").facts()
    assert [e["from_view"] for e in logged.entries if e["event"] == "caught_up"] == [0, full.state.seq]
    assert adopted is not None and adopted.gpus_unknown, [(e["event"], e.get("reason")) for e in logged.entries]
    assert runtime.starts == {"S": 1}, f"starts per job: {dict(runtime.starts)}"
