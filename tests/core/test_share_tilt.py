"""Shortest run time across queues within fair share (issue #42, opt-in `Policies.share_tilt`)."""

from __future__ import annotations

from dataclasses import replace

from orchestrator.policies import DEFAULT_POLICIES
from orchestrator.policies.fairshare import run_time_tilted
from schemas.events import GangReserved
from tests.core.harness import Sim, of_type


def test_the_tilt_weighs_only_the_queues_own_share() -> None:
    key = (1, (0.5, 2.0), "a")
    assert run_time_tilted(key, 3.0, 2.0) == (1, (0.5, 32.0), "a")  # 2.0 x (1 + 3) ** 2
    assert run_time_tilted(key, 3.0, 0.0) == key
    assert run_time_tilted(key, 3.0, 2.0, most=4.0) == (1, (0.5, 8.0), "a")  # capped at 4x
    assert run_time_tilted((0, 1.5, "a"), 3.0, 2.0) == (0, 1.5, "a")  # a baseline's key (drf): as it is


def _race(b_holds: int, **tilt: float) -> str:
    """Queue a holds 1 GPU, b `b_holds` of one 8-GPU node. a's head runs 10 h, b's 1 h, each asking for
    what is free (room for one of them). Which starts, under the default record with `tilt`?"""
    s = Sim(policies=replace(DEFAULT_POLICIES, **tilt))
    s.node("n0")
    s.queue("a")
    s.queue("b")
    s.submit("a-run", queue="a", gpus_per_rank=1, time_limit_s=36_000.0)
    s.submit("b-run", queue="b", gpus_per_rank=b_holds, time_limit_s=36_000.0)
    s.run()
    s.tick(60)
    s.submit("a-long", queue="a", gpus_per_rank=7 - b_holds, time_limit_s=36_000.0)
    s.submit("b-short", queue="b", gpus_per_rank=7 - b_holds, time_limit_s=3_600.0)
    (g,) = of_type(s.decide(), GangReserved)
    return g.job_id


def test_the_queue_whose_next_job_is_short_goes_first_with_the_tilt() -> None:
    # a's share (1) is the lower; every queue's share is weighed (not only those above the mean).
    assert _race(2, share_tilt=0.0, share_tilt_above_mean=0) == "a-long"  # fair share alone: the lower share
    # (1 + 10) ** 2 against (1 + 1) ** 2: the short head, at a higher share
    assert _race(2, share_tilt=2.0, share_tilt_above_mean=0) == "b-short"


def test_a_queue_below_the_mean_share_is_not_tilted_further_below() -> None:
    # b holds 3: the mean share is 2, a (1) is below it.
    assert _race(3, share_tilt=2.0, share_tilt_above_mean=0) == "b-short"  # (1 + 10) ** 2 x (1 + 2) vs (1 + 1) ** 2 x (3 + 2)
    assert _race(3, share_tilt=2.0, share_tilt_above_mean=1) == "a-long"  # a's share is not weighed: it is the lower
