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

from orchestrator.core.context import AdmitContext, candidate_of
from orchestrator.core.explain import Outcome
from orchestrator.core.model.capacity import FreeIndex
from orchestrator.core.model.state import HOLDING, Job
from orchestrator.core.preemption import preempt
from orchestrator.policies.in_queue_service import SERVICE_LEVELS_GPU_S, service_level, service_rule
from orchestrator.policies.placement import GangRequest
from orchestrator.policies.victims import STOPS_MAX, Candidate, protected_for

#: `Memo.service`: (running gangs, revision, victim size, per queue the times each level is reached, ids).
Table = tuple[object, int, int, dict[str, list[float]], dict[str, list[str]]]


def _table(adm: AdmitContext, victim_gpus: int) -> Table:
    """Per queue: the earliest time one of its preemptible gangs stopped fewer than STOPS_MAX times (of at most
    `victim_gpus` GPUs; 0: any size) reaches each service level past its protection, and those gangs' ids.

    Built once per change of the running gangs (`RunningGangs.rev`, kept in `Memo.service`): their service so
    far and their protection change only with it; the level one reaches at a time is then a comparison.
    """
    c = adm.c
    running = adm.running()
    memo = c.memo.service
    if memo is not None and memo[0] is running and memo[1] == running.rev and memo[2] == victim_gpus:
        return memo
    state, min_runtime = c.state, c.state.config.min_runtime_s
    bounds = SERVICE_LEVELS_GPU_S
    tops: dict[str, list[float]] = {}
    ids: dict[str, list[str]] = {}
    for jid in sorted(running.preemptible):  # (the order AdmitContext.candidates has)
        j = state.jobs.get(jid)
        if j is None or j.status not in HOLDING or j.gpus <= 0 or (0 < victim_gpus < j.gpus):
            continue
        stops = max(0, j.attempt - 1 - j.restarts)
        if stops >= STOPS_MAX:
            continue
        protected = j.reserved_at + protected_for(min_runtime, stops)
        row = tops.setdefault(j.queue, [math.inf] * len(bounds))
        for b, at in enumerate(bounds):  # it has `at` GPU-seconds of service from this time on
            t = max(protected, j.reserved_at + max(0.0, at - j.attained_s) / j.gpus)
            if t < row[b]:
                row[b] = t
        ids.setdefault(j.queue, []).append(jid)
    found: Table = (running, running.rev, victim_gpus, tops, ids)
    c.memo.service = found
    return found


def service_top(adm: AdmitContext, queue: str, victim_gpus: int) -> int:
    """An upper bound on the service level of the queue's running gangs a service stop could take now (-1: none).

    It counts gangs stopping already or chosen this cycle too: it only says when a search cannot find anybody.
    """
    row = _table(adm, victim_gpus)[3].get(queue)
    if row is None:
        return -1
    now = adm.c.now
    return sum(1 for t in row if t <= now)


def queue_candidates(adm: AdmitContext, queue: str, victim_gpus: int) -> list[Candidate]:
    """The queue's running gangs a service stop could take, as `AdmitContext.candidates` has them (its eligible
    gangs of the queue, in its order), built once per cycle and queue: a search reads these, not every gang."""
    key = ("service candidates", queue, victim_gpus)
    found = adm.answers.get(key)
    if not isinstance(found, list):
        state, now = adm.c.state, adm.c.now
        found = [candidate_of(j, now) for jid in _table(adm, victim_gpus)[4].get(queue, ())
                 if (j := state.jobs[jid]).status in ("reserved", "running") and j.stop is None]
        adm.answers[key] = found
    busy = adm.plan.busy
    return [x for x in found if x.job_id not in busy]


def service_preempt(adm: AdmitContext, job: Job, queue: str, req: GangRequest, base: FreeIndex) -> Outcome | None:
    """Stop jobs of `job`'s queue with more service to make room for it, or None (off, nobody, or nothing fits)."""
    pol = adm.c.policies
    if pol.service_preemption <= 0 or pol.preemption_searches <= 0:
        return None
    cap = 0 if pol.service_bigger_victims else pol.service_victim_gpus
    if service_top(adm, queue, cap) <= service_level(job.attained_s):
        return None
    rule = service_rule(pol.service_victim_gpus, bool(pol.service_bigger_victims))
    return preempt(adm, job, queue, req, base, rule, queue_candidates(adm, queue, cap))
