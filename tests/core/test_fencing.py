"""Fencing: every decision a scheduler authors is void once a newer leader was elected (issue #19).

A paused leader resumed after a standby took over appended NodeFailed for
every healthy node, and the fold accepted them: NodeFailed carried no epoch.
Here every event type with an `epoch` is checked to change nothing when it
comes from an older epoch, and to apply from the current one (so the void is
the epoch's doing). Elections are exactly previous + 1: repeats, jumps and a
forged 2^64-1 are void.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core.decide import decide
from orchestrator.core.model.state import SCHEDULER, restore, snapshot
from schemas import EVENT_TYPES, decode, encode
from schemas.events import (
    AnyEvent,
    CancelRequested,
    ClusterConfigured,
    Event,
    FieldChange,
    GangReserved,
    GangRestarted,
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobRejected,
    JobRequeued,
    JobRunning,
    JobUpdated,
    JobUpdateRequested,
    JobWaiting,
    NodeFailed,
    Preempted,
    PreemptionRequested,
    RankPlacement,
    SchedulerElected,
    WorkAssigned,
    WorkChanged,
)
from tests.core.harness import Sim

Make = Callable[[int], AnyEvent]


def _reserve(s: Sim, job_id: str, node: str = "n0", gpus: tuple[int, ...] = (0, 1, 2, 3), epoch: int = 1) -> GangReserved:
    return GangReserved(event_id=s.eid(), occurred_at=s.now, job_id=job_id, attempt=1, epoch=epoch,
                        ranks=(RankPlacement(rank=0, node_id=node, gpus=gpus),))


def _cluster() -> Sim:
    s = Sim()  # epoch 1 elected
    s.node("n0")
    s.submit("a", gpus_per_rank=4)
    return s


def _reserved() -> Sim:
    s = _cluster()
    s.emit(_reserve(s, "a"))
    return s


def _preempting() -> Sim:
    s = _reserved()
    s.submit("x", gpus_per_rank=8, priority=10)
    s.emit(PreemptionRequested(event_id=s.eid(), occurred_at=s.now, job_id="a", attempt=1, preemptor_job_id="x",
                               reason="", grace_s=1, epoch=1))
    return s


# Each case: a cluster where the decision would change something, and the decision stamped with an epoch.
CASES: dict[type[Event], Callable[[], tuple[Sim, Make]]] = {}


def case(kind: type[Event]) -> Callable[[Callable[[], tuple[Sim, Make]]], Callable[[], tuple[Sim, Make]]]:
    def register(f: Callable[[], tuple[Sim, Make]]) -> Callable[[], tuple[Sim, Make]]:
        CASES[kind] = f
        return f
    return register


@case(GangReserved)
def _gang_reserved() -> tuple[Sim, Make]:
    s = _cluster()
    return s, lambda ep: _reserve(s, "a", epoch=ep)


@case(JobWaiting)
def _job_waiting() -> tuple[Sim, Make]:
    s = _cluster()
    return s, lambda ep: JobWaiting(event_id=s.eid(), occurred_at=s.now, job_id="a", code="quota", message="m",
                                    epoch=ep)


@case(PreemptionRequested)
def _preemption_requested() -> tuple[Sim, Make]:
    s = _reserved()
    s.submit("x", gpus_per_rank=8, priority=10)
    return s, lambda ep: PreemptionRequested(event_id=s.eid(), occurred_at=s.now, job_id="a", attempt=1,
                                             preemptor_job_id="x", reason="", grace_s=1, epoch=ep)


@case(GangRestarted)
def _gang_restarted() -> tuple[Sim, Make]:
    s = _reserved()
    return s, lambda ep: GangRestarted(event_id=s.eid(), occurred_at=s.now, job_id="a", attempt=2, epoch=ep)


@case(JobRequeued)
def _job_requeued() -> tuple[Sim, Make]:
    s = _reserved()
    return s, lambda ep: JobRequeued(event_id=s.eid(), occurred_at=s.now, job_id="a", attempt=2, reason="lost",
                                     epoch=ep)


@case(NodeFailed)
def _node_failed() -> tuple[Sim, Make]:
    s = _reserved()
    return s, lambda ep: NodeFailed(event_id=s.eid(), occurred_at=s.now, node_id="n0", incarnation="i1", epoch=ep)


@case(JobRunning)
def _job_running() -> tuple[Sim, Make]:
    s = _reserved()
    s.start("a")
    return s, lambda ep: JobRunning(event_id=s.eid(), occurred_at=s.now, job_id="a", attempt=1, epoch=ep)


@case(Preempted)
def _preempted() -> tuple[Sim, Make]:
    s = _preempting()
    return s, lambda ep: Preempted(event_id=s.eid(), occurred_at=s.now, job_id="a", attempt=1, preemptor_job_id="x",
                                   epoch=ep)


@case(JobCompleted)
def _job_completed() -> tuple[Sim, Make]:
    s = _reserved()
    return s, lambda ep: JobCompleted(event_id=s.eid(), occurred_at=s.now, job_id="a", attempt=1, epoch=ep)


@case(JobFailed)
def _job_failed() -> tuple[Sim, Make]:
    s = _reserved()
    return s, lambda ep: JobFailed(event_id=s.eid(), occurred_at=s.now, job_id="a", attempt=1, reason="r", epoch=ep)


@case(CancelRequested)
def _cancel_requested() -> tuple[Sim, Make]:
    s = _reserved()
    return s, lambda ep: CancelRequested(event_id=s.eid(), occurred_at=s.now, job_id="a", reason="time limit",
                                         requested_by=SCHEDULER, epoch=ep)


@case(JobCancelled)
def _job_cancelled() -> tuple[Sim, Make]:
    s = _reserved()
    return s, lambda ep: JobCancelled(event_id=s.eid(), occurred_at=s.now, job_id="a", epoch=ep)


@case(JobRejected)
def _job_rejected() -> tuple[Sim, Make]:
    s = _cluster()
    return s, lambda ep: JobRejected(event_id=s.eid(), occurred_at=s.now, job_id="a", reasons=("too big",), epoch=ep)


@case(ClusterConfigured)
def _cluster_configured() -> tuple[Sim, Make]:
    s = _cluster()
    return s, lambda ep: ClusterConfigured(event_id=s.eid(), occurred_at=s.now, min_runtime_s=123.0, epoch=ep)


def _assignment(s: Sim, ep: int) -> WorkAssigned:
    job = s.job("a")
    return WorkAssigned(event_id=s.eid(), occurred_at=s.now, node_id="n0", job_id="a", attempt=1, epoch=ep,
                        spec=job.spec, ranks=job.placement, world_size=len(job.placement))


@case(WorkAssigned)
def _work_assigned() -> tuple[Sim, Make]:
    s = _reserved()
    return s, lambda ep: _assignment(s, ep)


@case(WorkChanged)
def _work_changed() -> tuple[Sim, Make]:
    s = _reserved()
    s.emit(_assignment(s, 1))
    return s, lambda ep: WorkChanged(event_id=s.eid(), occurred_at=s.now, node_id="n0", job_id="a", attempt=1,
                                     epoch=ep, intent="stop", grace_s=5.0)


@case(JobUpdated)
def _job_updated() -> tuple[Sim, Make]:
    s = _cluster()
    s.emit(JobUpdateRequested(event_id="ask-1", occurred_at=s.now, job_id="a", requested_by="alice", priority=7))
    return s, lambda ep: JobUpdated(event_id=s.eid(), occurred_at=s.now, job_id="a", request_id="ask-1", epoch=ep,
                                    changes=(FieldChange(field="priority", old=0, new=7),))


#: Types that carried an epoch from v1 (or from their first version): the scheduler always stamped them, so
#: 0 is simply old.
STAMPED_SINCE_V1 = {GangReserved, JobWaiting, PreemptionRequested, GangRestarted, JobRequeued, WorkAssigned,
                    WorkChanged, JobUpdated}


def _normalized(s: Sim) -> bytes:
    """The state but for what any event moves (its position) and the void bookkeeping."""
    st_ = s.state.copy()
    st_.seq, st_.voids, st_.last_void = 0, 0, ""
    return snapshot(st_)


def _applies(s: Sim, event: AnyEvent) -> bool:
    """Fold `event`; whether it changed anything. Fails if it changed something *and* was counted void."""
    before, voids = _normalized(s), s.state.voids
    s.emit(event)
    changed = _normalized(s) != before
    void = s.state.voids > voids
    assert not (changed and void), f"{type(event).__name__} was counted void but changed the state"
    return changed and not void


def _unchanged_but_void(s: Sim, event: AnyEvent) -> None:
    before, voids = snapshot(s.state), s.state.voids
    s.emit(event)
    assert s.state.voids == voids + 1, f"{type(event).__name__} was not counted void"
    after = s.state.copy()
    after.seq, after.voids, after.last_void = s.state.seq - 1, voids, restore(before).last_void
    assert snapshot(after) == before, f"a void {type(event).__name__} changed the state"


def test_every_event_type_with_an_epoch_has_a_case() -> None:
    """A new scheduler-authored type gets an `epoch` and a case here, or this fails."""
    with_epoch = {t for t in EVENT_TYPES if "epoch" in t.__struct_fields__} - {SchedulerElected}
    assert with_epoch == set(CASES)
    assert {NodeFailed, JobRunning, Preempted, JobCompleted, JobFailed, JobCancelled, JobRejected,
            ClusterConfigured, CancelRequested} <= with_epoch


@pytest.mark.parametrize("kind", list(CASES), ids=lambda t: t.__name__)
def test_a_stale_decision_is_void_and_changes_nothing(kind: type[Event]) -> None:
    s, make = CASES[kind]()
    s.elect(2)
    _unchanged_but_void(s, make(1))
    assert s.state.last_void.endswith("stale epoch 1 < 2")


@pytest.mark.parametrize("kind", list(CASES), ids=lambda t: t.__name__)
def test_the_same_decision_from_the_current_epoch_applies(kind: type[Event]) -> None:
    """The other half of the check above: what made it void was its epoch alone."""
    s, make = CASES[kind]()
    s.elect(2)
    assert _applies(s, make(2))


@pytest.mark.parametrize("kind", list(CASES), ids=lambda t: t.__name__)
def test_an_unstamped_decision_is_read_as_old_logs_were(kind: type[Event]) -> None:
    """Epoch 0: a type that gained its epoch with fencing was written without one (old logs, users'
    cancels, the simulator's node failures) and applies; one stamped since v1 is stale."""
    s, make = CASES[kind]()
    s.elect(2)
    if kind in STAMPED_SINCE_V1:
        _unchanged_but_void(s, make(0))
    else:
        assert _applies(s, make(0))


def test_a_paused_leaders_node_failures_change_nothing() -> None:
    """The incident: leader 1 paused, leader 2 elected, leader 1 resumes and fails every node."""
    s = Sim()
    for n in ("n0", "n1", "n2"):
        s.node(n)
    s.submit("a", gpus_per_rank=8)
    s.run()
    s.elect(2)
    before = snapshot(s.state)
    for n in ("n0", "n1", "n2"):
        s.emit(NodeFailed(event_id=s.eid(), occurred_at=s.now, node_id=n, incarnation="i1", epoch=1))
    assert not any(node.failed for node in s.state.nodes.values())
    assert s.job("a").status == "running" and s.state.voids == restore(before).voids + 3
    assert decide(s.state, s.now, epoch=2) == []  # nothing to requeue


@pytest.mark.parametrize("epoch", [0, 1, 3, 10, 2**63 - 1, 2**64 - 1, -1])
def test_an_election_that_is_not_the_next_epoch_is_void(epoch: int) -> None:
    s = Sim()  # epoch 1, scheduler s1
    forged = decode(encode(SchedulerElected(event_id="forged", occurred_at=s.now, epoch=epoch, scheduler_id="x")))
    assert isinstance(forged, SchedulerElected)
    _unchanged_but_void(s, forged)
    assert (s.state.epoch, s.state.scheduler_id) == (1, "s1")
    assert "does not follow 1" in s.state.last_void
    s.elect(2)  # the next one is still 2, not 2^64
    assert (s.state.epoch, s.state.scheduler_id) == (2, "s2")


def test_two_candidates_for_the_same_epoch_the_first_in_the_log_wins() -> None:
    s = Sim()
    s.emit(SchedulerElected(event_id="e-a", occurred_at=s.now, epoch=2, scheduler_id="a"))
    _unchanged_but_void(s, SchedulerElected(event_id="e-b", occurred_at=s.now, epoch=2, scheduler_id="b"))
    assert (s.state.epoch, s.state.scheduler_id) == (2, "a")


def test_every_decision_carries_the_deciders_epoch() -> None:
    """decide stamps what it authors with the epoch it was given; a deposed leader decides nothing."""
    s = Sim(min_runtime_s=0.0)
    s.node("n0")
    s.node("n1")
    s.elect(2)
    s.elect(3)
    seen: list[Event] = []

    def cycle() -> None:
        events = s.decide()
        seen.extend(events)
        s.agents(events)

    s.submit("done", gpus_per_rank=4)
    s.submit("crash", gpus_per_rank=4, restart_policy="gang", max_restarts=1)
    s.submit("limit", gpus_per_rank=4, time_limit_s=10.0)
    s.submit("gone", gpus_per_rank=4)
    s.submit("huge", gpus_per_rank=64)
    for _ in range(3):
        cycle()
    s.finish("done")
    s.exit("crash", 0, code=1, reason="crashed")
    s.cancel("gone")
    cycle()
    s.exit("gone", code=None, reason="cancelled")
    s.tick(11)
    cycle()
    s.exit("limit", code=None, reason="cancelled")
    cycle()
    s.submit("urgent", ranks=2, gpus_per_rank=8, priority=10)  # needs both nodes: preempts "crash"
    cycle()
    s.tick(100)  # "crash" never starts again, so its grace runs out
    cycle()
    cycle()
    assert s.job("urgent").status in ("reserved", "running")
    s.fail_node("n0")
    cycle()
    kinds = {type(e) for e in seen}
    assert kinds >= {GangReserved, JobWaiting, JobRunning, JobCompleted, GangRestarted, JobRejected, CancelRequested,
                     JobFailed, JobCancelled, PreemptionRequested, Preempted, JobRequeued}, kinds
    stamps = {type(e).__name__: getattr(e, "epoch", None) for e in seen}
    assert set(stamps.values()) == {3}, stamps
    assert decide(s.state, s.now + 1000, epoch=2) == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["elect", "fail", "recover"]),
                          st.integers(min_value=-2, max_value=6) | st.sampled_from([2**63 - 1, 2**64 - 1])),
                max_size=30))
def test_epochs_go_one_by_one_and_only_the_newest_leader_fails_nodes(ops: list[tuple[str, int]]) -> None:
    """Whatever elections and node failures arrive, in any order and from any epoch: the fold's epoch
    only ever moves to the next one, and a NodeFailed changes the node only if no newer leader was
    elected before it."""
    s = Sim()
    s.node("n0")
    epochs = [s.state.epoch]
    for op, epoch in ops:
        was_failed, current = s.state.nodes["n0"].failed, s.state.epoch
        if op == "elect":
            s.emit(SchedulerElected(event_id=s.eid(), occurred_at=s.now, epoch=epoch, scheduler_id="x"))
            assert s.state.epoch in (current, current + 1)
            assert (s.state.epoch == current + 1) == (epoch == current + 1)
        elif op == "fail":
            s.emit(NodeFailed(event_id=s.eid(), occurred_at=s.now, node_id="n0", incarnation="i1", epoch=epoch))
            stale = 0 < epoch < current or epoch < 0
            assert s.state.nodes["n0"].failed == (was_failed or not stale)
        else:
            s.recover_node("n0")
        epochs.append(s.state.epoch)
    assert sorted(set(epochs)) == list(range(1, max(epochs) + 1))
    assert epochs == sorted(epochs)
