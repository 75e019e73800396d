"""The starvation bound (issue #29, core/starving.py): a big gang pending T may stop the cheapest running gangs."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from orchestrator.core.starving import starving_from
from orchestrator.policies import DEFAULT_POLICIES, Policies
from orchestrator.policies.victims import STARVATION_STOPS_MAX, PreemptionAsk, find_victims
from schemas.events import GangReserved, PreemptionRequested
from tests.core.harness import Sim, of_type

T = 3600.0
BOUND = replace(DEFAULT_POLICIES, starvation_bound_s=T)


def _full(policies: Policies, smalls: int = 16) -> Sim:
    """Two 8-GPU nodes full of 1-GPU preemptible jobs of queue `a` (guarantee 0), a 16-GPU gang of `b` pending."""
    s = Sim(policies=policies)
    s.node("n0")
    s.node("n1")
    s.queue("a")
    s.queue("b")
    for i in range(smalls):
        s.submit(f"s{i:02d}", queue="a", gpus_per_rank=1, time_limit_s=100_000, preemptible=True)
    s.run()
    s.tick(60)
    s.submit("big", queue="b", ranks=2, gpus_per_rank=8, time_limit_s=3600)
    return s


def _preempted(events: list[object]) -> list[PreemptionRequested]:
    return of_type(events, PreemptionRequested)  # type: ignore[arg-type]


def test_a_big_gang_stops_others_only_once_past_the_bound() -> None:
    s = _full(BOUND)
    assert not _preempted(s.run())
    assert starving_from(s.job("big"), T) == s.job("big").waiting_since + T
    s.tick(T - 1)
    assert not _preempted(s.run()), "stopped others before the bound"
    s.tick(1)
    events = s.run()
    stops = _preempted(events)
    assert {p.job_id for p in stops} == {f"s{i:02d}" for i in range(16)}
    assert all(p.preemptor_job_id == "big" and "starvation bound" in p.reason for p in stops)
    assert "big" in {e.job_id for e in of_type(events, GangReserved)}


def test_without_the_bound_the_big_gang_waits() -> None:
    s = _full(replace(DEFAULT_POLICIES, starvation_bound_s=math.inf))
    s.tick(100 * T)
    assert not _preempted(s.run())
    assert s.job("big").status == "pending"


def test_small_jobs_never_starve_into_preemption() -> None:
    """Only gangs of BIG_GANG_GPUS or more are bounded: an 8-GPU job waits in its line."""
    s = _full(BOUND)
    s.submit("eight", queue="b", gpus_per_rank=8, time_limit_s=3600)
    s.tick(2 * T)
    stops = _preempted(s.run())
    assert {p.preemptor_job_id for p in stops} == {"big"}


def _three_running(checkpoint: str | None) -> list[str]:
    """Three 8-GPU jobs of `a` started 10 min apart on three nodes; a 16-GPU gang of `b` past the bound."""
    s = Sim(policies=BOUND)
    for n in ("n0", "n1", "n2"):
        s.node(n)
    s.queue("a")
    s.queue("b")
    for job in ("old", "mid", "new"):
        s.submit(job, queue="a", gpus_per_rank=8, time_limit_s=10_000_000, preemptible=True)
        s.run()
        s.tick(600)
    s.submit("big", queue="b", ranks=2, gpus_per_rank=8, time_limit_s=3600)
    s.tick(T)
    if checkpoint is not None:
        s.checkpoint(checkpoint, 100, f"/ckpt/{checkpoint}")  # everything it did is saved
    return sorted(p.job_id for p in _preempted(s.run()))


def test_the_cheapest_victims_go_first_and_a_fresh_checkpoint_makes_one_cheap() -> None:
    assert _three_running(None) == ["mid", "new"]  # the least work since their starts
    assert _three_running("old") == ["new", "old"]  # old just saved everything it did


def test_a_job_stopped_three_times_is_no_longer_a_victim() -> None:
    s = Sim(policies=BOUND)
    s.node("n0")
    s.node("n1")
    s.queue("a")
    s.queue("b")
    s.submit("victim", queue="a", ranks=2, gpus_per_rank=8, time_limit_s=10_000_000, preemptible=True)
    s.run()
    for k in range(STARVATION_STOPS_MAX + 1):
        s.tick(T * 2 ** (k + 1))  # past its doubled protection
        s.submit(f"big{k}", queue="b", ranks=2, gpus_per_rank=8, time_limit_s=60)
        s.tick(T)
        events = s.run()
        stopped = [p.job_id for p in _preempted(events)]
        if k < STARVATION_STOPS_MAX:
            assert stopped == ["victim"], k
            s.tick(60)
            s.finish(f"big{k}")
            s.run()
            assert s.job("victim").status == "running"
        else:
            assert stopped == [], "stopped a fourth time"
    assert s.job("victim").attempt == STARVATION_STOPS_MAX + 1


def test_no_rule_stops_a_job_a_fourth_time() -> None:
    """Priority preemption too: after STOPS_MAX stops a job runs to its end like a non-preemptible one."""
    s = Sim(policies=DEFAULT_POLICIES, min_runtime_s=60)
    s.node("n0")
    s.submit("low", gpus_per_rank=8, preemptible=True)
    s.run()
    for k in range(STARVATION_STOPS_MAX + 1):
        s.tick(60 * 2**k + 1)  # past its doubled protection
        s.submit(f"high{k}", gpus_per_rank=8, priority=10, time_limit_s=60)
        stopped = [p.job_id for p in _preempted(s.run())]
        if k == STARVATION_STOPS_MAX:
            assert stopped == [], "stopped a fourth time"
            break
        assert stopped == ["low"], k
        s.tick(10)
        s.finish(f"high{k}")
        s.run()
        assert s.job("low").status == "running"
    assert s.job("low").attempt == STARVATION_STOPS_MAX + 1


def _big_behind_small_claims(guarantee: int) -> Sim:
    """Two nodes full of `a`'s non-preemptible 1-GPU jobs, more of them waiting; a young 16-GPU gang of `b`."""
    s = Sim(policies=DEFAULT_POLICIES)
    s.node("n0")
    s.node("n1")
    s.queue("a")
    s.queue("b", guaranteed_gpus=guarantee)
    for i in range(16):
        s.submit(f"s{i:02d}", queue="a", gpus_per_rank=1, time_limit_s=600 * (i + 1), preemptible=False)
    s.run()
    s.tick(60)
    s.submit("big", queue="b", ranks=2, gpus_per_rank=8, time_limit_s=3600)
    for i in range(16):
        s.submit(f"w{i:02d}", queue="a", gpus_per_rank=1, time_limit_s=100_000, preemptible=False)
    s.run()
    return s


def test_a_queue_below_its_guarantee_reserves_for_its_young_big_gang() -> None:
    """A young big gang holds no reservation (shorter claims may use the GPUs), unless its queue holds less than
    its guarantee: then the GPUs that come back are kept for it, not taken by the other queue's small claims
    (issue #29: the light teams' 128-GPU gangs waited out the bound, the worst-queue share error)."""
    owed = _big_behind_small_claims(guarantee=16)
    assert owed.state.holders == ["big"]
    owed.tick(600)
    owed.finish("s00")
    owed.run()
    assert owed.job("w00").status == "pending", "a's small claim took a GPU kept for b's gang"
    assert owed.holding("a") == 15

    plain = _big_behind_small_claims(guarantee=0)
    assert "big" not in plain.state.holders  # (a's waiting 1-GPU jobs hold the reservations)
    plain.tick(600)
    plain.finish("s00")
    plain.run()
    assert plain.job("w00").status != "pending"  # the freed GPU goes to a's next small claim


def test_alike_starving_gangs_search_for_victims_once_while_the_plan_stands_still() -> None:
    """A search that found nothing is not repeated for an alike ask in the same cycle (issue #29: a backlog of
    starving gangs, judged first every cycle, made the same fruitless search each; the sim's speed)."""
    calls: list[str] = []

    def counted(ask: PreemptionAsk, *rest: Any) -> Any:
        calls.append(ask.req.job_id)
        return find_victims(ask, *rest)

    # The fixed bound: under the relative one (the default) a starving gang that finds no victims takes a
    # backfill reservation, which changes the plan, so the next alike gang searches again (rightly).
    s = Sim(policies=replace(BOUND, victims=counted, starvation_bound_factor=0.0))
    s.node("n0")
    s.node("n1")
    s.queue("a")
    s.queue("b")
    for i in range(16):
        s.submit(f"s{i:02d}", queue="a", gpus_per_rank=1, time_limit_s=100_000, preemptible=False)
    s.run()
    s.submit("big1", queue="b", ranks=2, gpus_per_rank=8, time_limit_s=3600)
    s.submit("big2", queue="b", ranks=2, gpus_per_rank=8, time_limit_s=3600)
    s.run()
    s.tick(T)
    calls.clear()
    s.decide()
    assert calls == ["big1"], calls  # big2, alike, got big1's answer: nobody may be stopped
    assert s.job("big1").status == s.job("big2").status == "pending"


def test_a_relative_bound_is_the_gangs_run_time_within_floor_and_bound() -> None:
    """Issue #42 (`starvation_bound_factor`): a gang of known run time starves after factor x that run time, at
    least the floor, at most T; off (factor 0), every big gang's bound is T."""
    relative = replace(DEFAULT_POLICIES, starvation_bound_s=10 * T, starvation_bound_factor=1.0,
                       starvation_bound_floor_s=T / 2)
    s = _full(relative)
    assert not _preempted(s.run())
    big = s.job("big")  # 16 GPUs, time limit 1 h: its claim is 16 GPU-hours, a run time of 1 h
    assert starving_from(big, 10 * T, 1.0, T / 2) == big.waiting_since + T
    assert starving_from(big, 10 * T, 0.25, T / 2) == big.waiting_since + T / 2, "not held to the floor"
    assert starving_from(big, T / 4, 1.0, T / 8) == big.waiting_since + T / 4, "past the fixed bound"
    assert starving_from(big, 10 * T) == big.waiting_since + 10 * T, "factor 0: the fixed bound"
    s.tick(T - 1)
    assert not _preempted(s.run()), "stopped others before its relative bound"
    s.tick(1)
    stops = _preempted(s.run())
    assert {p.job_id for p in stops} == {f"s{i:02d}" for i in range(16)}
    assert all(p.preemptor_job_id == "big" and "pending 1.0 h >= 1 h" in p.reason for p in stops)
    s.submit("unknown", queue="b", ranks=2, gpus_per_rank=8)  # no time limit, nothing like it ran: T
    s.run()
    assert s.job("unknown").claim_from == ""
    assert starving_from(s.job("unknown"), 10 * T, 1.0, T / 2) == s.job("unknown").waiting_since + 10 * T
    fixed = _full(replace(relative, starvation_bound_factor=0.0))
    fixed.tick(T)
    assert not _preempted(fixed.run()), "the fixed bound (10 h) stopped others after 1 h"
