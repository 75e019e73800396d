"""Day-two controls in the pure core (issue #41): update, requeue, node reservations.

Each is folded and decided by the real `evolve` / `decide` (tests/core/harness.py's Sim folds every decision and
fails on a void one); the CLI tests (tests/cli/test_daytwo.py) drive the same through NATS.
"""

from __future__ import annotations

from typing import Any

from orchestrator.core.decide import decide
from orchestrator.core.evolve import evolve, fold
from orchestrator.core.model.state import restore, snapshot
from schemas.events import (
    Event,
    GangReserved,
    JobCancelled,
    JobRejected,
    JobRequeued,
    JobSubmitted,
    JobUpdateByOperator,
    JobUpdated,
    JobUpdateRequested,
    RankPlacement,
    RequeueRequested,
    ReservationCreated,
    ReservationDeleted,
)
from schemas.jobspec import JobSpec
from tests.core.harness import Sim, of_type


def _update(s: Sim, job_id: str, *, operator: bool = False, **fields: Any) -> str:
    kind = JobUpdateByOperator if operator else JobUpdateRequested
    eid = s.eid()
    s.emit(kind(event_id=eid, occurred_at=s.now, job_id=job_id, requested_by="alice", **fields))
    return eid


def _asked(s: Sim, job_id: str, **fields: Any) -> JobUpdated:
    """Ask for an update, let the scheduler answer it; the answer."""
    rid = _update(s, job_id, **fields)
    return _answer(s.decide(), rid)


def _answer(events: list[Event], request_id: str) -> JobUpdated:
    found = [e for e in of_type(events, JobUpdated) if e.request_id == request_id]
    assert len(found) == 1, events
    return found[0]


def _reserved(events: list[Event]) -> dict[str, set[str]]:
    return {e.job_id: {rp.node_id for rp in e.ranks} for e in of_type(events, GangReserved)}


# --- update ---------------------------------------------------------------------


def test_a_pending_jobs_new_priority_moves_it_ahead_in_line() -> None:
    s = Sim()
    s.node("n1", gpus=1)
    s.submit("busy", gpus_per_rank=1)
    s.run()
    s.submit("a", gpus_per_rank=1)
    s.tick(1)
    s.submit("b", gpus_per_rank=1)
    s.run()
    rid = _update(s, "b", priority=10, time_limit_s=3600.0)
    ans = _answer(s.decide(), rid)
    assert not ans.refused
    assert [(c.field, c.old, c.new) for c in ans.changes] == [("priority", 0, 10), ("time_limit_s", None, 3600.0)]
    assert s.job("b").spec.priority == 10 and s.job("b").spec.time_limit_s == 3600.0
    assert not s.state.update_asks
    s.finish("busy")
    assert "b" in _reserved(s.run())  # b went first although a was submitted before it
    assert s.job("a").status == "pending"


def test_a_pending_job_moves_to_another_queues_line() -> None:
    s = Sim()
    s.queue("default")
    s.queue("research")
    s.node("n1", gpus=1)
    s.submit("busy", gpus_per_rank=1)
    s.run()
    s.submit("a", gpus_per_rank=1, queue="default")
    s.run()
    ans = _asked(s, "a", queue="research")
    assert [(c.field, c.old, c.new) for c in ans.changes] == [("queue", "default", "research")]
    assert [k[3] for k in s.state.lines["research"]] == ["a"] and "default" not in s.state.lines
    s.finish("busy")
    s.run()
    assert s.job("a").status == "running" and s.job("a").queue == "research"


def test_a_running_jobs_limit_only_goes_down_unless_an_operator_asks() -> None:
    s = Sim()
    s.node("n1", gpus=1)
    s.submit("a", gpus_per_rank=1, time_limit_s=600.0)
    s.run()
    assert s.job("a").status == "running"
    refused = _asked(s, "a", time_limit_s=7200.0)
    assert "only an operator may raise" in refused.refused and s.job("a").spec.time_limit_s == 600.0
    assert "only a pending job's priority" in _asked(s, "a", priority=5).refused
    raised = _asked(s, "a", operator=True, time_limit_s=7200.0)
    assert not raised.refused and s.job("a").spec.time_limit_s == 7200.0
    assert s.state.ends[0][0] == s.job("a").reserved_at + 7200.0
    lowered = _asked(s, "a", time_limit_s=60.0)
    assert not lowered.refused
    s.tick(61)
    events = s.run()
    assert any("time limit 60s exceeded" in getattr(e, "reason", "") for e in events)


def test_a_stale_or_outdated_answer_is_void_and_the_request_is_answered_again() -> None:
    s = Sim()
    s.node("n1", gpus=1)
    s.submit("busy", gpus_per_rank=1)
    s.run()
    s.submit("a", gpus_per_rank=1)
    rid = _update(s, "a", priority=3)
    answer = _answer(decide(s.state, s.now, epoch=1), rid)
    s.elect(2)
    voids = s.state.voids
    evolve(s.state, answer)  # decided under epoch 1, folded after epoch 2 was elected
    assert s.state.voids == voids + 1 and s.job("a").spec.priority == 0 and rid in s.state.update_asks
    assert not _answer(s.decide(), rid).refused and s.job("a").spec.priority == 3


def test_a_finished_or_unknown_job_is_not_updated() -> None:
    s = Sim()
    s.node("n1", gpus=1)
    s.submit("a", gpus_per_rank=1)
    s.run()
    s.finish("a")
    s.run()
    assert "completed: nothing to update" in _asked(s, "a", priority=1).refused
    _update(s, "nope", priority=1)
    assert not s.state.update_asks  # a request about a job the log does not know is not kept


# --- requeue --------------------------------------------------------------------


def test_a_running_job_requeued_stops_and_waits_again_from_its_checkpoint() -> None:
    s = Sim()
    s.node("n1", gpus=2)
    s.submit("a", gpus_per_rank=2)
    s.run()
    s.checkpoint("a", 100, "/ckpt/a/100")
    s.emit(RequeueRequested(event_id=s.eid(), occurred_at=s.now, job_id="a", requested_by="alice", reason="bad run"))
    assert s.job("a").stop is not None and s.job("a").stop.requeue
    s.decide()  # the nodes are told to stop its ranks
    s.exit("a", code=None, reason="cancelled")
    events = s.decide()
    (rq,) = of_type(events, JobRequeued)
    assert rq.attempt == 2 and rq.resume_from == "/ckpt/a/100" and "requeued by alice: bad run" in rq.reason
    job = s.job("a")
    assert job.attempt in (2,) and job.restarts == 0 and job.stop is None and "a" not in s.state.stopping
    assert job.status in ("pending", "reserved") and job.resume_from == "/ckpt/a/100"
    s.run()
    assert s.job("a").status == "running" and s.job("a").attempt == 2


def test_a_finished_job_requeued_runs_again_but_not_an_array_element() -> None:
    s = Sim()
    s.node("n1", gpus=1)
    s.submit("a", gpus_per_rank=1)
    s.run()
    s.exit("a", code=1, reason="crashed")
    s.run()
    s.exit("a", code=1, reason="crashed") if s.job("a").status == "running" else None
    s.submit("done", gpus_per_rank=0)
    s.run()
    s.cancel("a")
    s.run()
    s.exit("a", code=None, reason="cancelled")
    s.run()
    assert s.job("a").status == "cancelled"
    before = s.job("a").attempt
    s.emit(RequeueRequested(event_id=s.eid(), occurred_at=s.now, job_id="a", requested_by="alice"))
    assert s.job("a").status == "pending" and s.job("a").attempt == before + 1 and "a" not in s.state.finished
    s.run()
    assert s.job("a").status == "running"


def test_a_cancel_during_a_requeue_wins() -> None:
    s = Sim()
    s.node("n1", gpus=1)
    s.submit("a", gpus_per_rank=1)
    s.run()
    s.emit(RequeueRequested(event_id=s.eid(), occurred_at=s.now, job_id="a", requested_by="alice"))
    s.cancel("a")
    s.decide()
    s.exit("a", code=None, reason="cancelled")
    assert of_type(s.decide(), JobCancelled) and s.job("a").status == "cancelled"


# --- reservations ---------------------------------------------------------------


def _reserve(s: Sim, name: str, nodes: tuple[str, ...], start: float, end: float, **kw: Any) -> None:
    s.emit(ReservationCreated(event_id=s.eid(), occurred_at=s.now, name=name, nodes=nodes, start=start, end=end,
                              created_by="ops", **kw))


def test_reserved_nodes_take_no_work_that_would_reach_into_the_window() -> None:
    s = Sim()
    s.node("n1", gpus=1)
    s.node("n2", gpus=1)
    _reserve(s, "maint", ("n1",), start=s.now + 3600, end=s.now + 7200)
    s.submit("long", gpus_per_rank=1, time_limit_s=7200.0)  # would reach into it: n2 only
    s.submit("short", gpus_per_rank=1, time_limit_s=600.0)  # ends before the window: may use n1
    placed = _reserved(s.run())
    assert placed == {"long": {"n2"}, "short": {"n1"}}
    s.submit("open", gpus_per_rank=1)  # no limit: never on n1 while the reservation stands
    s.run()
    assert s.job("open").status == "pending"
    assert "reserved (maint) and not for it" in (s.job("open").waiting.message if s.job("open").waiting else "")
    s.finish("short")
    s.finish("long")
    s.run()
    assert s.job("open").status == "running" and {rp.node_id for rp in s.job("open").placement} == {"n2"}


def test_a_reservations_jobs_run_only_inside_its_window_and_on_its_nodes() -> None:
    s = Sim()
    s.node("n1", gpus=1)
    s.node("n2", gpus=1)
    _reserve(s, "event", ("n1",), start=s.now + 100, end=s.now + 1000, users=("alice",))
    s.emit(JobSubmitted(event_id=s.eid(), occurred_at=s.now, job_id="mine", submitted_by="alice",
                        spec=JobSpec(name="mine", reservation="event")))
    s.submit("other", gpus_per_rank=1, time_limit_s=10_000.0)
    assert _reserved(s.run()) == {"other": {"n2"}}
    assert s.job("mine").status == "pending"
    assert "window opens" in s.job("mine").waiting.message  # type: ignore[union-attr]
    s.tick(150)
    placed = _reserved(s.run())
    assert placed == {"mine": {"n1"}}


def test_a_job_naming_a_reservation_it_cannot_use_is_rejected() -> None:
    s = Sim()
    s.node("n1", gpus=1)
    _reserve(s, "event", ("n1",), start=s.now, end=s.now + 1000, users=("bob",))
    s.submit("nope", gpus_per_rank=1, reservation="missing")
    s.submit("notyours", gpus_per_rank=1, reservation="event")
    rejected = {e.job_id: e.reasons[0] for e in of_type(s.run(), JobRejected)}
    assert "does not exist" in rejected["nope"] and "is for bob" in rejected["notyours"]
    s.submit("mine", gpus_per_rank=1, reservation="event", time_limit_s=10.0)
    s.emit(JobSubmitted(event_id=s.eid(), occurred_at=s.now, job_id="bobs", submitted_by="bob",
                        spec=JobSpec(name="bobs", reservation="event")))
    s.submit("filler", gpus_per_rank=1)
    s.run()
    assert s.job("bobs").status == "running" and s.job("filler").status == "pending"
    s.submit("later", gpus_per_rank=1, reservation="event")
    s.emit(JobSubmitted(event_id=s.eid(), occurred_at=s.now, job_id="bobs2", submitted_by="bob",
                        spec=JobSpec(name="bobs2", reservation="event")))
    s.run()
    assert s.job("bobs2").status == "pending"  # waits for room in its reservation
    s.emit(ReservationDeleted(event_id=s.eid(), occurred_at=s.now, name="event"))
    assert not s.state.reservations
    rejected = {e.job_id: e.reasons[0] for e in of_type(s.run(), JobRejected)}
    assert "does not exist" in rejected["bobs2"]  # the job waiting in a deleted reservation is told


def test_the_fold_voids_a_placement_inside_a_window_whoever_decided_it() -> None:
    s = Sim()
    s.node("n1", gpus=1)
    _reserve(s, "maint", ("n1",), start=s.now - 10, end=s.now + 1000)
    s.submit("a", gpus_per_rank=1)
    voids = s.state.voids
    evolve(s.state, GangReserved(event_id="forged", occurred_at=s.now, job_id="a", attempt=1, epoch=1,
                                 ranks=(RankPlacement(rank=0, node_id="n1", gpus=(0,)),)))
    assert s.state.voids == voids + 1 and "reserved" in s.state.last_void and s.job("a").status == "pending"


def test_folding_a_day_two_log_twice_gives_the_same_snapshot() -> None:
    s = Sim()
    s.node("n1", gpus=1)
    s.node("n2", gpus=1)
    _reserve(s, "maint", ("n1",), start=s.now + 3600, end=s.now + 7200)
    s.submit("a", gpus_per_rank=1)
    s.run()
    _update(s, "a", time_limit_s=100.0)
    s.emit(RequeueRequested(event_id=s.eid(), occurred_at=s.now, job_id="a", requested_by="alice"))
    s.run()
    a, b = fold(s.log), fold(s.log)
    assert snapshot(a) == snapshot(b)
    assert snapshot(restore(snapshot(a))) == snapshot(a)
