"""Service-aware order inside a queue (#20 point 2, policies/level_order.py): levels of service, bounded delay."""

from __future__ import annotations

from dataclasses import replace

from msgspec.structs import replace as sreplace

from orchestrator.policies import DEFAULT_POLICIES
from orchestrator.policies.fairshare import arrival_order_key
from orchestrator.policies.level_order import LEVEL_DELAY_S, service_level, service_order_key
from schemas.events import GangReserved
from tests.core.harness import Sim, of_type

# Reservations off: the order alone decides who gets the node that comes free.
SERVICE = replace(DEFAULT_POLICIES, job_key=service_order_key, reservations=0)


def _full_node(policies: object) -> Sim:
    s = Sim(policies=policies)  # type: ignore[arg-type]
    s.node("n0")
    s.submit("running", gpus_per_rank=8, time_limit_s=100_000)
    s.run()
    return s


def _started_when_freed(s: Sim) -> list[str]:
    s.finish("running")
    return [e.job_id for e in of_type(s.run(), GangReserved)]


def test_a_job_claiming_less_service_goes_first_inside_its_queue() -> None:
    s = _full_node(SERVICE)
    s.submit("big", gpus_per_rank=8, time_limit_s=10 * 3600)  # 80 GPU-hours: level 3
    s.tick(10)
    s.submit("small", gpus_per_rank=8, time_limit_s=1800)  # 4 GPU-hours: level 1
    assert (service_level(s.job("big")), service_level(s.job("small"))) == (3, 1)
    assert _started_when_freed(s)[:1] == ["small"]
    # Arrival order starts big: the test tells the two apart.
    s = _full_node(replace(DEFAULT_POLICIES, job_key=arrival_order_key, reservations=0))
    s.submit("big", gpus_per_rank=8, time_limit_s=10 * 3600)
    s.tick(10)
    s.submit("small", gpus_per_rank=8, time_limit_s=1800)
    assert _started_when_freed(s)[:1] == ["big"]


def test_a_big_job_is_overtaken_only_by_jobs_that_arrived_within_its_bound() -> None:
    """Starvation protection: level 3 lines up 3 x LEVEL_DELAY_S later, so a small job arriving after that waits."""
    s = _full_node(SERVICE)
    s.submit("big", gpus_per_rank=8, time_limit_s=10 * 3600)  # level 3
    s.tick(2 * LEVEL_DELAY_S + 1)  # a level-1 job arriving now lines up just after big (3 vs 1 delay)
    s.submit("late", gpus_per_rank=8, time_limit_s=1800)
    assert _started_when_freed(s)[:1] == ["big"]
    # One that arrived 2 s earlier still went ahead of it.
    s = _full_node(SERVICE)
    s.submit("big", gpus_per_rank=8, time_limit_s=10 * 3600)
    s.tick(2 * LEVEL_DELAY_S - 1)
    s.submit("late", gpus_per_rank=8, time_limit_s=1800)
    assert _started_when_freed(s)[:1] == ["late"]


def test_priority_still_goes_first_and_attained_service_counts() -> None:
    s = _full_node(SERVICE)
    s.submit("small", gpus_per_rank=8, time_limit_s=600)
    s.submit("urgent", gpus_per_rank=8, time_limit_s=10 * 3600, priority=5, preemptible=False)
    assert _started_when_freed(s)[:1] == ["urgent"]
    # No time limit: the level is what it attained (earlier attempts).
    job = s.job("small")
    unlimited = sreplace(job, spec=sreplace(job.spec, time_limit_s=None))
    assert service_level(unlimited) == 0
    assert service_level(sreplace(unlimited, attained_s=8 * 2 * 3600.0)) == 2
