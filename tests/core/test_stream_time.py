"""The fold's clock is the stream's (#30): publishers' wall clocks never decide a job's age.

Each event here is folded at its stream time `at` (Sim's `now`) while its own
`occurred_at` is a publisher's clock `skew` off it: a previous leader 5 min
behind, an agent 5 min ahead. Decide runs at stream times.
"""

from __future__ import annotations

from msgspec.structs import replace

from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import SCHEDULER, ClusterState
from schemas.events import (
    AnyEvent,
    CancelRequested,
    GangRestarted,
    JobWaiting,
    PreemptionRequested,
)
from tests.core.harness import Sim, of_type


class SkewedSim(Sim):
    """A Sim whose events carry their publisher's clock, `skew` off the stream time they are folded at."""

    skew = 0.0

    def emit(self, event: AnyEvent) -> None:
        stamped = replace(event, occurred_at=event.occurred_at + self.skew)
        if isinstance(stamped, GangRestarted) and stamped.not_before:  # the publisher's clock wrote it too
            stamped = replace(stamped, not_before=stamped.not_before + self.skew)
        self.log.append(stamped)
        evolve(self.state, stamped, at=self.now)


def test_a_time_limit_is_judged_from_the_stream_time_of_the_reservation() -> None:
    s = SkewedSim()
    s.node("n0", gpus=1)
    s.submit("j", gpus_per_rank=1, time_limit_s=60, grace_period_s=5)
    s.skew = -300.0  # the leader that reserves it runs 5 min behind
    s.run()
    assert s.job("j").reserved_at == s.now  # the stream's time, not the leader's
    s.skew = 300.0  # the next leader runs 5 min ahead
    s.tick(59)
    assert not of_type(s.decide(), CancelRequested), "stopped before its time limit"
    s.tick(1)
    (stop,) = of_type(s.decide(), CancelRequested)
    assert stop.requested_by == SCHEDULER and "time limit" in stop.reason


def test_min_runtime_protects_on_the_stream_clock_across_leaders() -> None:
    s = SkewedSim(min_runtime_s=120.0)
    s.node("n0", gpus=8)
    s.skew = -300.0
    s.submit("victim", gpus_per_rank=8)
    s.run()
    s.skew = 300.0
    s.tick(5)
    s.submit("urgent", gpus_per_rank=8, priority=10)
    s.tick(114)
    assert not of_type(s.decide(), PreemptionRequested), "preempted inside --min-runtime"
    s.tick(1)
    (p,) = of_type(s.decide(), PreemptionRequested)
    assert p.job_id == "victim"


def test_a_restart_backoff_is_rebased_on_the_stream_time() -> None:
    s = SkewedSim()
    s.node("n0", gpus=1)
    s.submit("g", gpus_per_rank=1, restart_policy="gang", max_restarts=2)
    s.run()
    s.exit("g", code=1, reason="crashed")
    s.skew = -300.0
    (r,) = of_type(s.decide(), GangRestarted)
    backoff = r.not_before - r.occurred_at  # both the decider's stamps: a duration on its clock
    assert backoff > 0
    # Folded: the backoff runs from the stream time of the GangRestarted, whatever the stamp said.
    assert s.job("g").not_before == s.now + backoff


def test_without_a_stream_time_an_event_folds_as_before() -> None:
    """A simulation or an event-only file (no stream time): the event's own times, bit for bit."""
    s = Sim()
    s.node("n0", gpus=1)
    s.submit("g", gpus_per_rank=1, restart_policy="gang", max_restarts=2)
    s.run()
    s.exit("g", code=1, reason="crashed")
    (r,) = of_type(s.decide(), GangRestarted)
    assert s.job("g").not_before == r.not_before
    again = ClusterState()
    for e in s.log:
        evolve(again, e, at=e.occurred_at)  # a stream time equal to the stamp changes nothing either
    assert again.jobs["g"].not_before == r.not_before


def test_a_backfill_hold_is_rebased_on_the_stream_time() -> None:
    s = Sim()
    s.submit("j", gpus_per_rank=1)
    wait = JobWaiting(event_id="w", occurred_at=100.0, job_id="j", code="backfill_head", message="held",
                      epoch=1, hold_until=160.0)
    evolve(s.state, wait, at=400.0)
    w = s.job("j").waiting
    assert w is not None and w.at == 400.0 and w.hold_until == 460.0
