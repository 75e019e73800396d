"""The fold: validation of decisions, idempotence, determinism, snapshots."""

from __future__ import annotations

import msgspec
import pytest

from orchestrator.core.decide import decide
from orchestrator.core.evolve import evolve, fold
from orchestrator.core.model.state import ClusterState, restore, snapshot
from schemas import decode, encode
from schemas.events import (
    GangReserved,
    JobSubmitted,
    PreemptionRequested,
    RankPlacement,
    Unknown,
    WorkerStarted,
)
from schemas.jobspec import JobSpec
from tests.core.harness import Sim


def sim() -> Sim:
    s = Sim()
    s.node("n0")
    s.node("n1")
    s.submit("a", gpus_per_rank=4)
    s.submit("b", gpus_per_rank=4)
    return s


def reserve(s: Sim, job_id: str, node: str, gpus: tuple[int, ...], *, epoch: int = 1, attempt: int = 1,
            rank: int = 0) -> GangReserved:
    return GangReserved(event_id=s.eid(), occurred_at=s.now, job_id=job_id, attempt=attempt, epoch=epoch,
                        ranks=(RankPlacement(rank=rank, node_id=node, gpus=gpus),))


def unchanged_but_void(s: Sim, event: GangReserved) -> None:
    before = snapshot(s.state)
    voids = s.state.voids
    s.emit(event)
    assert s.state.voids == voids + 1
    after = s.state.copy()
    after.seq, after.voids, after.last_void = s.state.seq - 1, voids, restore(before).last_void
    assert snapshot(after) == before


def test_two_racing_reservations_cannot_double_book() -> None:
    s = sim()
    s.emit(reserve(s, "a", "n0", (0, 1, 2, 3)))
    assert s.state.owners["n0"][:4] == ("a",) * 4
    unchanged_but_void(s, reserve(s, "b", "n0", (3, 4, 5, 6)))
    assert "held by a" in s.state.last_void


def test_stale_epoch_reservation_is_void_and_stale_leader_decides_nothing() -> None:
    s = sim()
    s.elect(2)
    unchanged_but_void(s, reserve(s, "a", "n0", (0, 1, 2, 3), epoch=1))
    assert "stale epoch" in s.state.last_void
    assert decide(s.state, s.now, epoch=1) == []
    assert decide(s.state, s.now, epoch=2)


@pytest.mark.parametrize(
    "case",
    ["failed", "cordoned", "unknown-node", "not-pending", "wrong-attempt", "partial", "gpu-count", "bad-gpu",
     "earmarked", "over-limit", "unknown-job"],
)
def test_invalid_reservations_are_void(case: str) -> None:
    s = sim()
    s.queue("default", limit_gpus=100)
    ev = reserve(s, "a", "n0", (0, 1, 2, 3))
    if case == "failed":
        s.fail_node("n0")
    elif case == "cordoned":
        s.cordon("n0")
    elif case == "unknown-node":
        ev = reserve(s, "a", "zz", (0, 1, 2, 3))
    elif case == "not-pending":
        s.emit(reserve(s, "a", "n1", (0, 1, 2, 3)))
    elif case == "wrong-attempt":
        ev = reserve(s, "a", "n0", (0, 1, 2, 3), attempt=2)
    elif case == "partial":
        s.submit("gang", ranks=2, gpus_per_rank=4)
        ev = reserve(s, "gang", "n0", (0, 1, 2, 3))
    elif case == "gpu-count":
        ev = reserve(s, "a", "n0", (0, 1, 2))
    elif case == "bad-gpu":
        ev = reserve(s, "a", "n0", (5, 6, 7, 8))
    elif case == "earmarked":
        s.emit(reserve(s, "b", "n1", (0, 1, 2, 3)))
        s.submit("x", gpus_per_rank=4)
        s.emit(PreemptionRequested(event_id=s.eid(), occurred_at=s.now, job_id="b", attempt=1,
                                   preemptor_job_id="x", reason="", grace_s=1, epoch=1,
                                   earmark=(RankPlacement(rank=0, node_id="n0", gpus=(0, 1, 2, 3)),)))
    elif case == "over-limit":
        s.queue("default", limit_gpus=2)
    elif case == "unknown-job":
        ev = reserve(s, "nope", "n0", (0, 1, 2, 3))
    unchanged_but_void(s, ev)


def test_earmarked_gpus_go_to_their_preemptor_only() -> None:
    s = sim()
    s.emit(reserve(s, "b", "n1", (0, 1, 2, 3)))
    s.submit("x", gpus_per_rank=4)
    s.emit(PreemptionRequested(event_id=s.eid(), occurred_at=s.now, job_id="b", attempt=1, preemptor_job_id="x",
                               reason="", grace_s=1, epoch=1,
                               earmark=(RankPlacement(rank=0, node_id="n0", gpus=(0, 1, 2, 3)),)))
    assert s.state.earmarks["n0"][:4] == ("x",) * 4
    unchanged_but_void(s, reserve(s, "a", "n0", (0, 1, 2, 3)))
    s.emit(reserve(s, "x", "n0", (0, 1, 2, 3)))
    assert s.state.owners["n0"][:4] == ("x",) * 4 and "n0" not in s.state.earmarks


def test_duplicates_and_unknowns_change_nothing() -> None:
    s = sim()
    s.run()
    before = snapshot(s.state)
    dup_submit = JobSubmitted(event_id=s.eid(), occurred_at=s.now, job_id="a", spec=JobSpec(name="again"))
    job = s.job("a")
    dup_start = WorkerStarted(event_id=s.eid(), occurred_at=s.now, job_id="a", attempt=1, rank=0,
                              node_id=job.placement[0].node_id)
    other = WorkerStarted(event_id=s.eid(), occurred_at=s.now, job_id="ghost", attempt=1, rank=0, node_id="n0")
    wrong_node = WorkerStarted(event_id=s.eid(), occurred_at=s.now, job_id="b", attempt=1, rank=0, node_id="zz")
    unknown = decode(b'{"type": "FluxCapacitorCharged", "event_id": "x", "occurred_at": 1}')
    assert isinstance(unknown, Unknown)
    for e in (dup_submit, dup_start, other, wrong_node, unknown):
        evolve(s.state, e)
    after = s.state.copy()
    after.seq, after.unknown_events = restore(before).seq, 0
    assert snapshot(after) == before
    assert s.state.unknown_events == 1


def test_folding_the_same_log_twice_is_byte_equal_and_restorable() -> None:
    s = sim()
    s.run()
    s.finish("a")
    s.run()
    wire = [encode(e) for e in s.log]  # through the codec, as a reader would
    one = snapshot(fold(decode(w) for w in wire))
    two = snapshot(fold(decode(w) for w in wire))
    assert one == two == snapshot(s.state)
    assert snapshot(restore(one)) == one


def test_copy_is_independent_and_decide_does_not_mutate() -> None:
    s = sim()
    s.run()
    before = snapshot(s.state)
    tentative = s.state.copy()
    s.exit("a")  # fold more into the original...
    evolve(tentative, reserve(s, "b", "n1", (4, 5, 6, 7)))  # ...and something else into the copy
    assert snapshot(s.state) != before and snapshot(tentative) != before
    frozen = snapshot(s.state)
    decide(s.state, s.now + 10_000, epoch=1)
    assert snapshot(s.state) == frozen


def test_state_is_plain_msgpack() -> None:
    s = sim()
    s.run()
    data = msgspec.msgpack.decode(snapshot(s.state))
    assert set(data) >= {"seq", "epoch", "nodes", "owners", "jobs", "queues", "usage"}
    assert isinstance(restore(snapshot(s.state)), ClusterState)


def test_preemption_for_a_preemptor_no_longer_pending_is_void() -> None:
    s = sim()
    s.emit(reserve(s, "b", "n1", (0, 1, 2, 3)))
    s.submit("x", gpus_per_rank=4)
    s.cancel("x")
    s.decide()  # x is cancelled
    voids = s.state.voids
    s.emit(PreemptionRequested(event_id=s.eid(), occurred_at=s.now, job_id="b", attempt=1, preemptor_job_id="x",
                               reason="", grace_s=1, epoch=1))
    assert s.state.voids == voids + 1 and s.job("b").status == "reserved"


def test_a_snapshot_from_before_the_line_indexes_still_schedules() -> None:
    s = sim()
    s.tick(1)
    s.submit("c", gpus_per_rank=8, priority=3)
    raw = msgspec.msgpack.decode(snapshot(s.state))
    for derived in ("lines", "unexplained", "stopping"):
        del raw[derived]  # what older code wrote
    old = restore(msgspec.msgpack.encode(raw))
    assert old.lines == s.state.lines and set(old.unexplained) == set(s.state.unexplained)
    assert decide(old, s.now, epoch=1) == decide(s.state, s.now, epoch=1)


def test_finished_jobs_beyond_the_retention_leave_the_state_deterministically() -> None:
    """Memory and snapshots stay bounded: only the newest FINISHED_KEPT finished jobs are kept."""
    from orchestrator.core.evolve import fold
    from orchestrator.core.model.state import FINISHED_KEPT, snapshot
    from schemas.events import JobRejected, JobSubmitted
    from schemas.jobspec import JobSpec

    n = FINISHED_KEPT + FINISHED_KEPT // 10 + 5
    log = []
    for i in range(n):
        log.append(JobSubmitted(event_id=f"s{i}", occurred_at=float(i), job_id=f"j{i}", spec=JobSpec(name="x")))
        log.append(JobRejected(event_id=f"r{i}", occurred_at=float(i), job_id=f"j{i}", reasons=("no",)))
    state = fold(log)
    assert FINISHED_KEPT <= len(state.jobs) <= FINISHED_KEPT + FINISHED_KEPT // 10
    assert "j0" not in state.jobs and f"j{n - 1}" in state.jobs
    assert list(state.finished) == list(state.jobs)
    assert snapshot(fold(log)) == snapshot(state)
