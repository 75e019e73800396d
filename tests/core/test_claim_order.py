"""Shortest remaining claim first inside a queue, kept by the fold's own lines (issue #29, estimates.claim_of)."""

from __future__ import annotations

from dataclasses import replace

from orchestrator.core.model.estimates import LIMIT
from orchestrator.policies import DEFAULT_POLICIES
from schemas.events import GangReserved, JobSubmitted
from schemas.jobspec import JobSpec
from tests.core.harness import Sim, of_type

# Reservations off: the line alone decides who gets the node that comes free.
ORDER_ONLY = replace(DEFAULT_POLICIES, reservations=0)


def _full_node() -> Sim:
    s = Sim(policies=ORDER_ONLY)
    s.node("n0")
    s.submit("running", gpus_per_rank=8, time_limit_s=100_000)
    s.run()
    return s


def _started_when_freed(s: Sim, job: str = "running") -> list[str]:
    s.finish(job)
    return [e.job_id for e in of_type(s.run(), GangReserved)]


def _anon(s: Sim, job_id: str, gpus: int) -> None:
    """A job with neither a time limit nor a user, its name its id: only its queue and size say anything."""
    s.emit(JobSubmitted(event_id=s.eid(), occurred_at=s.now, job_id=job_id,
                        spec=JobSpec(name=job_id, gpus_per_rank=gpus)))


def test_the_smaller_claim_goes_first_and_priority_before_it() -> None:
    s = _full_node()
    s.submit("long", gpus_per_rank=8, time_limit_s=10 * 3600)
    s.tick(10)
    s.submit("short", gpus_per_rank=8, time_limit_s=1800)
    assert (s.job("long").claim, s.job("short").claim) == (8 * 36_000, 8 * 1800)
    assert s.job("short").claim_from == LIMIT
    assert _started_when_freed(s)[:1] == ["short"]
    # A higher priority still goes first, whatever it claims.
    s = _full_node()
    s.submit("urgent", gpus_per_rank=8, time_limit_s=10 * 3600, priority=5)
    s.submit("short", gpus_per_rank=8, time_limit_s=1800)
    assert _started_when_freed(s)[:1] == ["urgent"]


def test_a_claim_is_learned_from_the_queues_jobs_of_its_size_and_fixed_while_it_waits() -> None:
    s = Sim(policies=ORDER_ONLY)
    s.node("n0")
    for job, seconds in (("w1", 100.0), ("w8", 5000.0)):  # history: 1-GPU jobs 100 s, 8-GPU jobs 5000 s
        _anon(s, job, 1 if job == "w1" else 8)
        s.run()
        s.tick(seconds)
        s.finish(job)
        s.run()
    _anon(s, "blocker", 8)
    s.run()
    _anon(s, "eight", 8)
    s.tick(1)
    _anon(s, "one", 1)
    eight, one = s.job("eight"), s.job("one")
    assert (eight.claim, eight.claim_from) == (8 * 5000.0, "gpus")
    assert (one.claim, one.claim_from) == (100.0, "gpus")
    # A completion that changes the estimate does not move a job already in line.
    s.tick(50)
    s.finish("blocker")
    events = s.run()
    assert s.job("eight").claim == 8 * 5000.0
    assert s.state.lines["default"] == sorted(s.state.lines["default"])
    assert [e.job_id for e in of_type(events, GangReserved)][:1] == ["one"]


def test_a_preempted_job_rejoins_with_the_service_it_attained_taken_off_its_claim() -> None:
    s = Sim(policies=DEFAULT_POLICIES)
    s.node("n0")
    s.submit("low", gpus_per_rank=8, time_limit_s=3600, preemptible=True)
    s.run()
    s.tick(600)
    s.submit("high", gpus_per_rank=8, time_limit_s=3600, priority=5)
    s.run()
    low = s.job("low")
    assert low.status == "pending" and low.attempt == 2
    assert low.claim == 8 * 3600 - low.attained_s and low.attained_s >= 8 * 600
