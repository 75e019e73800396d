"""The starvation bound's victims (issue #42, opt-in): by remaining time, and holding instead of stopping."""

from __future__ import annotations

from dataclasses import replace

from orchestrator.policies import DEFAULT_POLICIES, Policies
from schemas.events import PreemptionRequested
from tests.core.harness import Sim, of_type

T = 3600.0
# The fixed bound and victims cheapest first (the rule before #42 made longest-remaining-first the default).
BOUND = replace(DEFAULT_POLICIES, starvation_bound_s=T, starvation_bound_factor=0.0, starvation_longest_first_s=0.0)


def _stopped(s: Sim) -> list[str]:
    return sorted(p.job_id for p in of_type(s.run(), PreemptionRequested))  # type: ignore[arg-type]


def _three_running(policies: Policies) -> Sim:
    """Three 8-GPU jobs of `a` of 100 h, 20 h and 5 h limits, started in that order; a 16-GPU gang of `b`
    past the bound, about to stop two of them."""
    s = Sim(policies=policies)
    for n in ("n0", "n1", "n2"):
        s.node(n)
    s.queue("a")
    s.queue("b")
    for job, hours in (("long", 100), ("mid", 20), ("short", 5)):
        s.submit(job, queue="a", gpus_per_rank=8, time_limit_s=hours * 3600, preemptible=True)
        s.run()
        s.tick(60)
    s.submit("big", queue="b", ranks=2, gpus_per_rank=8, time_limit_s=3600)
    s.tick(T)
    return s


def _three_checkpointed(policies: Policies) -> list[str]:
    """The three, each just past a checkpoint: which two are stopped?"""
    s = _three_running(policies)
    for job in ("long", "mid", "short"):
        s.checkpoint(job, 100, f"/ckpt/{job}")  # everything each did is saved: all three lose only a restart
    return _stopped(s)


def test_low_loss_victims_go_longest_remaining_first() -> None:
    # Cheapest first: equal costs, so the newest starts (the short jobs near their end) go.
    assert _three_checkpointed(BOUND) == ["mid", "short"]
    # By remaining time: the ones that would hold their GPUs longest go; the 5 h job finishes.
    assert _three_checkpointed(replace(BOUND, starvation_longest_first_s=1800)) == ["long", "mid"]


def test_a_costly_victim_still_goes_after_the_low_loss_ones() -> None:
    """Only victims losing at most the threshold per GPU are ordered by remaining time."""
    s = _three_running(replace(BOUND, starvation_longest_first_s=1800))
    for job in ("mid", "short"):
        s.checkpoint(job, 100, f"/ckpt/{job}")  # `long` would lose its hour: it goes last
    assert _stopped(s) == ["mid", "short"]


def _two_ending_in(seconds: float, policies: Policies) -> Sim:
    """Two nodes, each full with an 8-GPU job of `a` that ends `seconds` after a 16-GPU gang of `b` (1 h) starves."""
    s = Sim(policies=policies)
    s.node("n0")
    s.node("n1")
    s.queue("a")
    s.queue("b")
    for job in ("x", "y"):
        s.submit(job, queue="a", gpus_per_rank=8, time_limit_s=T + 60 + seconds, grace_period_s=0, preemptible=True)
    s.run()
    s.tick(60)
    s.submit("big", queue="b", ranks=2, gpus_per_rank=8, time_limit_s=3600)
    s.tick(T)
    return s


def test_a_starving_gang_holds_a_near_reservation_instead_of_stopping() -> None:
    hold = replace(BOUND, starvation_hold_factor=0.5)  # within 0.5 x 1 h
    assert _stopped(_two_ending_in(600, BOUND)) == ["x", "y"]  # off: it stops both though they end in 10 min
    s = _two_ending_in(600, hold)
    assert _stopped(s) == []
    assert s.job("big").waiting is not None and s.job("big").waiting.hold_ranks  # it holds what it will start on
    # A far start (the jobs end in 10 h) stops them as before.
    assert _stopped(_two_ending_in(36_000, hold)) == ["x", "y"]
