"""Step c for least attained service inside a queue (issue #42, opt-in `Policies.service_preemption`).

A head that is not placed and not starving may stop running jobs of its own
queue with more attained service (policies/in_queue_service.py). A search
costs O(running gangs) and the per-cycle budget is small (`preemption_searches`),
so it is spent only where it can find something: the queue has a candidate of
a higher service level than the head's (`service_top`, once per cycle and
queue from the cycle's candidates), and an alike ask found nothing yet this
cycle (preemption.py remembers a hopeless search for a `monotone` rule, so a
queue's hundred alike 1-GPU heads cost one search, not the budget).
"""

from __future__ import annotations

import math

from orchestrator.core.context import AdmitContext
from orchestrator.core.explain import Outcome
from orchestrator.core.model.capacity import FreeIndex
from orchestrator.core.model.state import HOLDING, Job
from orchestrator.core.preemption import preempt
from orchestrator.policies.in_queue_service import SERVICE_LEVELS_GPU_S, service_level, service_rule
from orchestrator.policies.placement import GangRequest
from orchestrator.policies.victims import STOPS_MAX, protected_for


def service_top(adm: AdmitContext, queue: str, victim_gpus: int) -> int:
    """An upper bound on the service level of the queue's running gangs that a service stop could take now
    (-1: none; victims of at most `victim_gpus` GPUs, 0: any size).

    Built once per change of the running gangs (`RunningGangs.rev`, kept in `Memo.service`): per queue and
    level, the earliest time one of its preemptible gangs stopped fewer than STOPS_MAX times reaches that
    level and is past its protection. It counts gangs that are stopping already or were chosen this
    cycle: it only says when a search cannot find anybody.
    """
    c = adm.c
    running = adm.running()
    memo = c.memo.service
    if memo is None or memo[0] is not running or memo[1] != running.rev or memo[2] != victim_gpus:
        state, min_runtime = c.state, c.state.config.min_runtime_s
        bounds = SERVICE_LEVELS_GPU_S
        tops: dict[str, list[float]] = {}
        for jid in running.preemptible:
            j = state.jobs.get(jid)
            if j is None or j.status not in HOLDING or j.gpus <= 0 or (0 < victim_gpus < j.gpus):
                continue
            stops = max(0, j.attempt - 1 - j.restarts)
            if stops >= STOPS_MAX:
                continue
            protected = j.reserved_at + protected_for(min_runtime, stops)
            row = tops.setdefault(j.queue, [math.inf] * len(bounds))
            for b, at in enumerate(bounds):  # reaches `at` GPU-seconds of service at this time
                t = max(protected, j.reserved_at + max(0.0, at - j.attained_s) / j.gpus)
                if t < row[b]:
                    row[b] = t
        memo = c.memo.service = (running, running.rev, victim_gpus, tops)
    row = memo[3].get(queue)
    if row is None:
        return -1
    now = c.now
    return sum(1 for t in row if t <= now)


def service_preempt(adm: AdmitContext, job: Job, queue: str, req: GangRequest, base: FreeIndex) -> Outcome | None:
    """Stop jobs of `job`'s queue with more service to make room for it, or None (off, nobody, or nothing fits)."""
    pol = adm.c.policies
    if pol.service_preemption <= 0 or pol.preemption_searches <= 0:
        return None
    cap = 0 if pol.service_bigger_victims else pol.service_victim_gpus
    if service_top(adm, queue, cap) <= service_level(job.attained_s):
        return None
    return preempt(adm, job, queue, req, base, service_rule(pol.service_victim_gpus, bool(pol.service_bigger_victims)))
