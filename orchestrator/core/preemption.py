"""Step c of a head's chain: ask the victims policy for a minimal set, and request their preemption.

The victims are chosen by `Policies.victims` (policies/victims.py); this
module decides whether a search is worth its budget, builds the ask, and
turns a found set into PreemptionRequested events whose GPUs are earmarked
for the preemptor.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from orchestrator.core.context import AdmitContext, shape_of
from orchestrator.core.explain import PREEMPTING, Outcome
from orchestrator.core.model.capacity import FreeIndex
from orchestrator.core.model.state import Job
from orchestrator.core.starving import bound_for
from orchestrator.policies import Candidate, PreemptionAsk, PreemptionRule
from orchestrator.policies.placement import GangRequest
from schemas.events import PreemptionRequested


def waiting_for(victims: list[str]) -> str:
    ids = sorted(victims)
    more = f" and {len(ids) - 1} more" if len(ids) > 1 else ""
    return f"waiting for preemption of job {ids[0]}{more}"


def preempt(adm: AdmitContext, job: Job, queue: str, req: GangRequest, base: FreeIndex,
            rule: PreemptionRule | None = None, among: Sequence[Candidate] | None = None) -> Outcome | None:
    """`rule`: who `job` may stop (default `Policies.preemption`; the starvation bound passes its own).
    `among`: the only candidates `rule` can take (None: every running gang), built by the caller."""
    c, plan, pol = adm.c, adm.plan, adm.c.policies
    if pol.preemption_searches <= 0:
        return None
    priority = job.spec.priority
    owed = plan.owed(queue, req.gpus)
    rule = pol.preemption if rule is None else rule
    if rule.priority_or_reclaim_only and not adm.could_preempt(queue, priority, owed):
        return None  # nobody it could preempt: do not spend a search
    # Candidates and free GPUs only shrink during a cycle: a shape that found no victims
    # at some priority finds none at that priority or lower later on (for rules that read
    # only priority and guarantees).
    hopeless: tuple[object, ...] = ("no victims", req.cls, req.ranks, req.gpus_per_rank, req.level, req.required,
                                    req.only, queue, owed)
    if rule.monotone:  # (its own entries: its candidates are not the default rule's; they depend on the service)
        hopeless = (*hopeless, rule, job.attained_s)
    memo = (rule.priority_or_reclaim_only or rule.monotone) and not job.earmark
    if memo and priority <= adm.hopeless.get(hopeless, -math.inf):
        return None
    if adm.searches <= 0:
        adm.cert.out_of_searches = True  # the next cycle may search: admission is not complete
        return None
    adm.searches -= 1
    ask = PreemptionAsk(
        req=req,
        queue=queue,
        priority=priority,
        owed=owed,
        now=c.now,
        min_runtime_s=c.state.config.min_runtime_s,
        attained=job.attained_s,
    )
    cands: Sequence[Candidate]
    if among is None:
        cands, loads = adm.candidates(), adm.candidate_loads()
    else:
        cands, loads = among, {q: plan.load(q) for q in dict.fromkeys(x.queue for x in among)}

    def quota_ok(victims: Sequence[Candidate]) -> bool:
        freed: dict[str, int] = {}
        for v in victims:
            freed[v.queue] = freed.get(v.queue, 0) + v.gpus
        return plan.limit_blocker(queue, req.gpus, freed) is None

    # A search that found nothing finds nothing again for an alike ask (same gang shape, queue, priority,
    # owed, attained) while the plan stands still: the starving gangs are judged first every cycle, and a
    # backlog of them searched the same candidates over and over (issue #29: sim speed). Only the search
    # is skipped: its budget and bookkeeping are spent as before, so every decision stays the same.
    again = None if job.earmark else ("no victims for", rule, pol.victims, shape_of(req), ask[1:],
                                       plan.version, plan.charges)
    if again is not None and again in adm.answers:
        victims = None
    else:
        victims = pol.victims(ask, cands, base, loads, pol.fits, quota_ok, rule)
        if not victims and again is not None:
            adm.answers[again] = True
    if not victims:
        if memo:  # (an earmark view is not the shared index)
            adm.hopeless[hopeless] = max(ask.priority, adm.hopeless.get(hopeless, -math.inf))
        else:
            adm.unremembered_searches += 1
        return None
    after = base.copy()
    for v in victims:
        for rp in v.placement:
            after.give(rp.node_id, rp.gpus)
    p = pol.place(req, after, adm.links_of)
    if p is None:
        adm.unremembered_searches += 1
        return None
    # What the whole set costs, on each victim's reason: "why me" is answered next to "why anyone".
    stopped = sum(v.gpus for v in victims)
    room = f"stops {len(victims)} gang{'s' if len(victims) > 1 else ''} ({stopped} GPUs) to make room for {req.gpus} GPUs"
    for v in victims:
        victim = c.state.jobs[v.job_id]
        kind = rule.reason(ask, v, loads)
        if kind == "priority":
            why = f"priority {job.spec.priority} > {v.priority} in queue {queue}; {room}"
        elif kind == "reclaim":
            q = c.state.queues.get(queue)
            guaranteed = q.guaranteed_gpus if q is not None else 0
            why = f"queue {queue} reclaims its guarantee {guaranteed} from {v.queue}; {room}"
        elif kind == "starvation":
            waited = c.now - job.waiting_since
            bound = bound_for(job, pol.starvation_bound_s, pol.starvation_bound_factor, pol.starvation_bound_floor_s)
            why = (f"job {job.job_id} ({req.gpus} GPUs) is past the starvation bound: pending {waited / 3600:.1f} h"
                   f" >= {bound / 3600:g} h; {room}")
        elif kind == "service":
            why = (f"job {job.job_id} of queue {queue} has had less service ({job.attained_s / 3600:.1f} GPU-h) than"
                   f" this job ({v.attained / 3600:.1f} GPU-h); {room}")
        else:
            why = f"{kind}: job {job.job_id} goes before it; {room}"
        adm.events.append(
            PreemptionRequested(
                event_id=c.event_id("preempt", victim),
                occurred_at=c.now,
                job_id=v.job_id,
                attempt=v.attempt,
                preemptor_job_id=job.job_id,
                reason=why,
                grace_s=victim.spec.grace_period_s,
                epoch=c.epoch,
                earmark=p.ranks,
            )
        )
        plan.busy.add(v.job_id)
        plan.victims.add(v.job_id)
        # Its GPUs leave its queue's guarantee and share now; its limit only once it is gone.
        plan.charge(v.queue, -v.gpus, tree=False)
    adm.preempted()
    # The planned GPUs that are free now are earmarked: nobody else takes them this cycle either.
    plan.take(p.ranks)
    plan.charge(queue, req.gpus)
    return Outcome(PREEMPTING, waiting_for([v.job_id for v in victims]))
