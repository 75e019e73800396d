"""Least attained service inside one queue (issue #42, opt-in `Policies.service_preemption`).

LAS (policies/las.py) preempts across the whole cluster: GPUs move between
teams and fair-share weights stop meaning anything. Here Tiresias' idea stays
inside one team's share: a pending job may stop a running job *of its own
queue* whose attained service (GPU-seconds, `state.attained_service`) is in a
higher coarse level (SERVICE_LEVELS_GPU_S: 4 and 64 GPU-hours) than the
preemptor's, so a queue's GPUs go to its short and new jobs before its long
ones, and the queues' shares are what fair share gives them.

Who may be stopped (`why_service_victim`): a preemptible gang of the same
queue, of no higher priority, in a higher level, protected as the default rule
protects (`protected_for`, doubling with each stop), stopped fewer than
STOPS_MAX times, holding at most max(SERVICE_VICTIM_GPUS, the preemptor's GPUs)
GPUs (a 1-GPU job never stops a 64-GPU gang). Cheapest first (`victim_cost`:
the work since its newest checkpoint, a restart per GPU, times its stops).

Anti-thrash. Let P (level p) stop V (level v > p), both of queue Q. While V
waits its service does not grow, so its level stays v; it may stop P back
only once P's level exceeds v, i.e. after P was served up to the next level
boundary and its protection ran out -- time slices bounded below, never a loop
within one instant -- and each job is stopped at most STOPS_MAX times.

The order inside a queue (`service_line_key`, opt-in `Policies.line_order` 1):
priority, then level, then the fold's line (remaining claim, waiting since, id):
a stopped job, whose remaining claim is small, no longer goes before the new
jobs that stopped it.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Mapping
from functools import cache

from orchestrator.core.model.plan import QueueLoad
from orchestrator.core.model.state import Job
from orchestrator.policies.fairshare import JobKey
from orchestrator.policies.victims import (
    STOPS_MAX,
    Candidate,
    PreemptionAsk,
    PreemptionRule,
    cheapest_first,
    protected_for,
)

#: Level boundaries in GPU-seconds: 4 and 64 GPU-hours.
SERVICE_LEVELS_GPU_S: tuple[float, ...] = (4 * 3_600.0, 64 * 3_600.0)
#: A victim holds at most max(this, the preemptor's GPUs) GPUs.
SERVICE_VICTIM_GPUS = 8


def service_level(attained_gpu_s: float) -> int:
    return bisect_right(SERVICE_LEVELS_GPU_S, attained_gpu_s)


def service_rule(victim_gpus: int = SERVICE_VICTIM_GPUS, up_to_preemptor: bool = True) -> PreemptionRule:
    """The rule stopping jobs of the preemptor's queue with more service; a victim holds at most
    `victim_gpus` GPUs, or as many as the preemptor asks for if more and `up_to_preemptor`.
    One record per setting (cached): the searches' memos key on the rule."""
    return _service_rule(int(victim_gpus), bool(up_to_preemptor))


@cache
def _service_rule(victim_gpus: int, up_to_preemptor: bool) -> PreemptionRule:
    def why_service_victim(ask: PreemptionAsk, c: Candidate, loads: Mapping[str, QueueLoad]) -> str | None:
        """"service" if `ask` may stop `c` for its attained service (module docstring), else None."""
        del loads
        most = max(victim_gpus, ask.req.gpus) if up_to_preemptor else victim_gpus
        if (c.queue != ask.queue or not c.preemptible or c.gpus <= 0 or c.priority > ask.priority
                or c.interruptions >= STOPS_MAX or c.gpus > most):
            return None
        if service_level(c.attained) <= service_level(ask.attained):
            return None
        if ask.now - c.started_at < protected_for(ask.min_runtime_s, c.interruptions):
            return None
        return "service"

    # A search that finds no victims finds none this cycle for an alike ask of no higher priority
    # (`monotone`): candidates and free GPUs only shrink during a cycle.
    return PreemptionRule(why_service_victim, cheapest_first, level=_one_level, monotone=True)


def _one_level(ask: PreemptionAsk) -> Callable[[Candidate], tuple[int]]:
    """Every victim of the rule is alike in importance: the node-by-node search may pick among all."""
    del ask
    return lambda c: (0,)


#: The rule with the module's victim size: max(8, the preemptor's GPUs).
IN_QUEUE_SERVICE = service_rule()


def service_line_key(job: Job) -> JobKey:
    """Inside a queue: higher priority, then the lower service level, then the fold's line order."""
    key = job.line_key
    return (key[0], service_level(job.attained_s), *key[1:])


def stopped_first_key(job: Job) -> JobKey:
    """Inside a queue: higher priority, then the jobs stopped before (preempted or requeued, so their attempt
    was cut), then the fold's line order: a victim gets its queue's next GPUs instead of waiting behind every
    smaller claim that arrived meanwhile."""
    key = job.line_key
    return (key[0], 0 if job.attempt > 1 + job.restarts else 1, *key[1:])


def run_time_key(job: Job) -> JobKey:
    """Inside a queue: higher priority, then the smallest remaining claim per GPU -- the run time, where the
    fold's line orders by GPU-hours and puts a big gang of one hour behind every 1-GPU job of eight."""
    key = job.line_key
    return (key[0], key[1] / max(1, job.spec.total_gpus), *key[2:])


#: `Policies.line_order` N > 0 -> the key of each queue's line, LINE_ORDERS[N - 1] (0: the fold's own order).
LINE_ORDERS: tuple[Callable[[Job], JobKey], ...] = (service_line_key, stopped_first_key, run_time_key)
