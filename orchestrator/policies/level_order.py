"""Service-aware order inside a queue (issue #20 point 2): discretised service levels with bounded delay.

Opt-in (`Policies(job_key=service_order_key)`); the default order stays the
fold's line (priority, then the smallest claim, then arrival: issue #29),
which needs no per-cycle sort.

As in Tiresias's discretised 2D-LAS, a job's GPU-service puts it in a level
(SERVICE_LEVELS_GPU_S: 1, 8, 64 GPU-hours); what the log knows of its service
is what it attained so far (`Job.attained_s`, earlier attempts) or, if more,
what its time limit claims (GPUs x time limit: a job that says it needs more
is served later). Inside a priority, a job of level L lines up as though it
arrived L x LEVEL_DELAY_S later. That is the starvation protection, without a
clock in the key: a job can only be overtaken by lower-level jobs that
arrived less than L x LEVEL_DELAY_S after it, never by an endless stream of
small ones (Tiresias promotes a job after it starved for a while; here the
bound is built into the order).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable

from orchestrator.core.model.state import Job
from orchestrator.policies.fairshare import JobKey

#: Level boundaries in GPU-seconds: 1, 8 and 64 GPU-hours.
SERVICE_LEVELS_GPU_S: tuple[float, ...] = (3_600.0, 8 * 3_600.0, 64 * 3_600.0)
#: How much later each level counts a job's arrival (the most a lower-level arrival may overtake it by).
#: 2 h: the best of 30 min / 1 h / 2 h at load 1.2 on the 3,000-job trace (bench/RESULTS.md, session 14).
LEVEL_DELAY_S = 7_200.0


def expected_service(job: Job) -> float:
    """GPU-seconds the log says the job needs: what it attained, or what its time limit claims if more."""
    limit = job.spec.time_limit_s
    claimed = job.spec.total_gpus * limit if limit is not None else 0.0
    return max(job.attained_s, claimed)


def service_level(job: Job, levels: tuple[float, ...] = SERVICE_LEVELS_GPU_S) -> int:
    return bisect_right(levels, expected_service(job))


def service_order(delay_s: float = LEVEL_DELAY_S,
                  levels: tuple[float, ...] = SERVICE_LEVELS_GPU_S) -> Callable[[Job], JobKey]:
    """A `Policies.job_key`: higher priority, then arrival delayed by `delay_s` per service level, then id."""

    def key(job: Job) -> JobKey:
        return (-job.spec.priority, job.waiting_since + delay_s * bisect_right(levels, expected_service(job)), job.job_id)

    return key


#: The order with the module's levels and delay.
service_order_key = service_order()
