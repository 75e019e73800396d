"""The decision chain for one queue head: what it gets, in this order (the code's order).

  a. a preemptor still waiting on its victims keeps waiting;
  b. allocate: place the whole gang on free GPUs (a preemptor also on the
     GPUs earmarked for it; a job that ends before the backfill reservations
     start also on the GPUs held for them);
  c. preempt / reclaim: a minimal victim set, whose GPUs are earmarked
     (preemption.py); a gang past the starvation bound may also stop the
     cheapest running gangs (starving.py);
  d. backfill: a gang blocked by capacity, while fewer than
     `Policies.reservations` gangs hold GPUs, holds the GPUs it will start on
     (planned around the earlier holders' GPUs: reservations.py) -- a gang of
     BIG_GANG_GPUS or more only once it waited `Policies.reserve_after_s`
     (the starvation bound serves the young ones: starving.py), or at once
     while its queue holds less than its guarantee;
  e. otherwise it is told why it waits (`blocked_verdict`): its queue is at
     its limit or its freed quota is kept for an older gang ("quota"), the
     free GPUs it would fit are held by backfill, or capacity.
A head over quota skips b and d (and keeps c: reclaiming may free its limit).
"""

from __future__ import annotations

import math

from orchestrator.core.context import AdmitContext, shape_of
from orchestrator.core.explain import BACKFILL, CAPACITY, PLACED, PREEMPTING, QUOTA, Outcome
from orchestrator.core.locality import locality_outcome
from orchestrator.core.model.capacity import FreeIndex
from orchestrator.core.model.state import BIG_GANG_GPUS, Job
from orchestrator.core.preemption import preempt, waiting_for
from orchestrator.core.reservations import give_reservation, quota_kept
from orchestrator.core.reserved_nodes import waiting_note
from orchestrator.core.service_preemption import service_preempt
from orchestrator.policies import Ending, PreemptionAsk
from orchestrator.policies.placement import GangRequest, Placement, request_of
from orchestrator.policies.victims import find_victims, longest_remaining_first
from schemas.events import GangReserved


def admit_one(adm: AdmitContext, job: Job, queue: str) -> Outcome:
    """`judge`, remembering a blocked head's outcome for the next head alike until the plan changes.

    At a busy moment a cycle looks at hundreds of blocked heads, most of them
    alike (1-GPU jobs of one queue): for a head without an earmark the answer
    depends only on its shape, GPU model, queue, priority and whether it may
    use held GPUs -- and on the plan, which `version` and `charges` track. An
    outcome that changed nothing (no GPUs taken, nothing charged, no events,
    no victim search left unremembered) is the answer for the next such head.
    """
    plan, pol = adm.plan, adm.c.policies
    if job.earmark or not pol.preemption.priority_or_reclaim_only:
        return judge(adm, job, queue, adm.request(job))
    spec = job.spec
    gpus = spec.total_gpus
    starving = gpus >= BIG_GANG_GPUS and adm.starving(job)  # (only big gangs starve: most heads are small)
    if pol.request is request_of and (not starving or (adm.searches <= 0 < pol.preemption_searches
                                      and not pol.starvation_rule.priority_or_reclaim_only)):
        # Its queue's limit blocks it and it can stop nobody (`_quota_verdict`; its GPUs are the spec's).
        at_limit = ("quota blocked", queue, gpus, spec.priority, plan.charges)
        verdict = adm.answers.get(at_limit, False)
        if verdict is False:
            verdict = adm.answers[at_limit] = _quota_verdict(adm, queue, gpus, spec.priority)
        if isinstance(verdict, Outcome):
            if starving:
                adm.cert.out_of_searches = True  # (what `preempt` records of the starving gang's refused search)
            return verdict
    req = adm.request(job)
    if starving:
        return _starving_at_limit(adm, job, queue, req)
    key: tuple[object, ...] = ("outcome", shape_of(req), job.spec.gpu_model, queue, job.spec.priority,
                               bool(plan.holds) and _may_use_held(adm, job), plan.version, plan.charges)
    if pol.service_preemption:  # (opt-in) its outcome depends on its service too
        key = (*key, job.attained_s)
    found = adm.answers.get(key)
    if isinstance(found, Outcome):
        return found
    before = (plan.version, plan.charges, len(adm.events), adm.unremembered_searches)
    outcome = judge(adm, job, queue, req)
    if (plan.version, plan.charges, len(adm.events), adm.unremembered_searches) == before:
        adm.answers[key] = outcome
    return outcome


def _quota_verdict(adm: AdmitContext, queue: str, gpus: int, priority: int) -> Outcome | None:
    """`blocked_verdict`'s quota reason for a head of `gpus` GPUs, if its queue's limit blocks it and it can stop nobody.

    Most heads a busy cycle judges are of queues at their limit (isolated queues: 99%, issue #42's
    sim speed), and for such a head `judge` goes: over quota, so no allocation and no backfill; no
    victim search, since no priority or reclaim rule lets it preempt (`could_preempt`) -- and a
    starving gang's search is refused while the cycle has no searches left (which `preempt` records
    and `admit_one` too); so "queue at its limit". That depends only on its queue, GPUs and priority,
    and on the plan's charges (limits, guarantees and `could_preempt`'s owed read only the charged
    GPUs; the running gangs stand still all cycle): `admit_one` keeps it per (queue, GPUs, priority,
    charges) -- None too, for a head this does not decide. A starving gang with searches left goes
    the whole way (`_starving_at_limit`).
    """
    plan = adm.plan
    over = plan.limit_blocker(queue, gpus)
    if over is None:
        return None
    if adm.could_preempt(queue, priority, plan.owed(queue, gpus)):
        return None
    return over_limit(over, gpus)


def over_limit(over: tuple[str, int, int], gpus: int) -> Outcome:
    name, limit, used = over
    return Outcome(QUOTA, f"queue {name} at its limit {limit}: holds {used}, needs {gpus} more")


def _starving_at_limit(adm: AdmitContext, job: Job, queue: str, req: GangRequest) -> Outcome:
    """`judge` of a starving gang, remembering the outcome for the next alike gang while its queue is at its limit.

    Under a limit every starving gang of the queue is judged first in every cycle (isolated queues: ~16 a
    cycle, issue #42's sim speed), and one that its queue's limit blocks, that no priority or reclaim
    rule lets preempt (`could_preempt`), goes the same way each time: its starvation victim search (a
    search budget spent, or none left) finds nothing it can start on, so it waits on the quota. That
    verdict depends on its shape, queue, priority and attained service (the search's ask; not the
    attained service under the default search and starvation rule, which do not read it) and on the
    plan, which `version` and `charges` track; an alike gang gets it again, and the budget is spent as
    the real search would spend it, so every later decision is the same.
    """
    plan, pol = adm.plan, adm.c.policies
    # (Asked first: an answer is kept only where the checks below held, and they read only the queue, the
    # gang's size and priority, the plan's charges and the cycle's running gangs, all in the key or fixed.)
    # (Its attained service only where the search may read it: `PreemptionRule.reads_attained`.)
    attained = job.attained_s if pol.starvation_rule.reads_attained or pol.victims is not find_victims else None
    key = ("starving at limit", shape_of(req), queue, job.spec.priority, attained, plan.version, plan.charges)
    found = adm.answers.get(key)
    if isinstance(found, Outcome):
        # What `preempt` does for a search whose answer is known to be none (it is told so, or finds it again).
        if adm.searches <= 0:
            adm.cert.out_of_searches = True
        else:
            adm.searches -= 1
            adm.unremembered_searches += 1
        return found
    owed = plan.owed(queue, req.gpus)
    if (pol.preemption_searches <= 0 or pol.starvation_rule.priority_or_reclaim_only
            or plan.limit_blocker(queue, req.gpus) is None or adm.could_preempt(queue, job.spec.priority, owed)):
        return judge(adm, job, queue, req)
    before = (plan.version, plan.charges, len(adm.events))
    outcome = _no_starvation_victims(adm, job, queue, req, owed)
    if outcome is None:
        outcome = judge(adm, job, queue, req)
    if outcome.code == QUOTA and (plan.version, plan.charges, len(adm.events)) == before:
        adm.answers[key] = outcome
    return outcome


def _no_starvation_victims(adm: AdmitContext, job: Job, queue: str, req: GangRequest, owed: bool) -> Outcome | None:
    """`judge`'s verdict on a starving gang at its limit that stops nobody, when `find_victims` would answer none
    at once: no candidate the starvation rule lets it stop, or too few to bring its queue within its limits.

    That answer reads only what the rule reads of the ask and the gang's GPUs, so the candidates the rule
    allows are kept per cycle (`victim_pool`) instead of a search per gang shape. The search's budget and
    bookkeeping are spent as `preempt` spends them on a search that found nothing; None: judge it.
    """
    c, plan, pol = adm.c, adm.plan, adm.c.policies
    if adm.searches <= 0 or pol.victims is not find_victims or job.earmark:
        return None
    ask = PreemptionAsk(req=req, queue=queue, priority=job.spec.priority, owed=owed, now=c.now,
                        min_runtime_s=c.state.config.min_runtime_s, attained=job.attained_s)
    found = adm.victim_pool(ask, pol.starvation_rule)
    if found is None:
        return None
    pool, freed = found
    if pool and plan.limit_blocker(queue, req.gpus, freed) is None:
        return None  # (`find_victims` would search: it may find some)
    over = plan.limit_blocker(queue, req.gpus)
    assert over is not None  # (`_starving_at_limit` checked)
    adm.searches -= 1
    adm.unremembered_searches += 1
    return over_limit(over, req.gpus)


def judge(adm: AdmitContext, job: Job, queue: str, req: GangRequest) -> Outcome:
    plan, pol = adm.plan, adm.c.policies
    # a. A preemptor waits for its victims; afterwards it may use its earmarked GPUs.
    if job.earmark:
        waiting_on = adm.victims_of(job.job_id)
        if waiting_on:
            return Outcome(PREEMPTING, waiting_for(waiting_on))
        # The plan counted its claim for its queue; judge it afresh (placing charges it again).
        plan.charge(queue, -job.spec.total_gpus)
        base = plan.earmark_view(job, req.cls)
    else:
        base = plan.index(req.cls)
    over = plan.limit_blocker(queue, req.gpus)
    kept = over is None and quota_kept(adm, job, queue) is not None
    # b. Allocate.
    if over is None and not kept:
        p = adm.place(req, base, shared=not job.earmark)
        if p is None and plan.holds and _may_use_held(adm, job):
            p = adm.place_through_hold(req)
        if p is not None:
            _reserve(adm, job, queue, p)
            return Outcome(PLACED, p.reason)
    # c. Preempt lower priority in the queue, or reclaim a guarantee from borrowers.
    outcome = preempt(adm, job, queue, req, base)
    if outcome is None and adm.starving(job):  # past the starvation bound: it may stop the cheapest
        if pol.starvation_hold_factor > 0.0 and over is None and not kept and len(plan.holds) < pol.reservations:
            outcome = _near_reservation(adm, job, queue, req, base)  # (opt-in) a near start stops nobody
        if outcome is None:
            rule = pol.starvation_rule
            if pol.starvation_longest_first_s > 0.0:  # (opt-in) low-loss victims by remaining time
                rule = longest_remaining_first(pol.starvation_longest_first_s)
            outcome = preempt(adm, job, queue, req, base, rule)
    elif outcome is None and pol.service_preemption:  # (opt-in) stop jobs of its queue with more service
        outcome = service_preempt(adm, job, queue, req, base)
    if outcome is not None:
        return outcome
    # d. Backfill: the first gang blocked by capacity holds what it will start on.
    if (over is None and not kept and len(plan.holds) < pol.reservations
            and (req.gpus < BIG_GANG_GPUS or adm.c.now - job.waiting_since >= pol.reserve_after_s
                 or _below_guarantee(adm, queue) or (pol.starvation_bound_factor > 0.0 and adm.starving(job)))):
        outcome = give_reservation(adm, job, queue, req, base)
        if outcome is not None:
            return outcome
    # e. It waits: quota, backfill or capacity.
    return blocked_verdict(adm, job, queue, req, base, over)


def _near_reservation(adm: AdmitContext, job: Job, queue: str, req: GangRequest, base: FreeIndex) -> Outcome | None:
    """A starving gang's reservation, if it starts within `Policies.starvation_hold_factor` x its run time.

    Issue #42: most of the gap to LAS at high load is victims of the bound re-waiting after their
    stop. A gang that backfill would start soon anyway waits for it, holding the GPUs it will start
    on, and stops nobody; only one whose start is far preempts. Run time: its line claim per GPU
    (`Job.claim`), none known: no hold (it preempts as before).
    """
    if not job.claim_from or job.spec.total_gpus <= 0:
        return None
    within = adm.c.policies.starvation_hold_factor * job.claim / job.spec.total_gpus
    return give_reservation(adm, job, queue, req, base, within)


def blocked_verdict(adm: AdmitContext, job: Job, queue: str, req: GangRequest, base: FreeIndex,
                    over: tuple[str, int, int] | None) -> Outcome:
    """Why a head that was not placed, is not preempting and holds no reservation waits."""
    plan = adm.plan
    # Quota: over a limit, or the limit's freed quota is kept for an older gang.
    if over is not None:
        return over_limit(over, req.gpus)
    kept = quota_kept(adm, job, queue)
    if kept is not None:
        name, holder = kept
        return Outcome(QUOTA, f"queue {name}'s quota is kept for job {holder}, first blocked by its limit")
    if plan.holds and adm.fits_through_hold(req):
        ids = [h.job_id for h in plan.holds]
        more = f" and {len(ids) - 1} more" if len(ids) > 1 else ""
        return Outcome(BACKFILL, f"free GPUs are reserved by backfill for job {ids[0]}{more}")
    note = waiting_note(adm.c.state, job, adm.c.now) if req.only is not None else None
    if note is not None:  # node reservations keep it off nodes (core/reserved_nodes.py)
        return Outcome(CAPACITY, note)
    if req.only is not None:  # locality: require, and the nodes holding its datasets have no room
        return locality_outcome(req, job.spec, base)
    return adm.capacity_outcome(req, base, job.spec.gpu_model, shared=not job.earmark)


def _below_guarantee(adm: AdmitContext, queue: str) -> bool:
    """Whether `queue` holds fewer GPUs than its guarantee: its young big gangs may hold a reservation.

    Without one, a light queue's big gang waits out the starvation bound: the heavy queues' small
    claims take every GPU that comes back, so 16 free nodes never gather (issue #29: the light
    teams' 128-GPU gangs waited 10-12 h on average against DRF's 2-5 h, the worst-queue share
    error). A queue below its guarantee is owed GPUs (fair_share_key's `owed`); it cannot reclaim
    a gang that would take it past its guarantee, but it may keep the GPUs that come back.
    """
    q = adm.c.state.queues.get(queue)
    return q is not None and adm.plan.gpus.get(queue, 0) < q.guaranteed_gpus


def _may_use_held(adm: AdmitContext, job: Job) -> bool:
    """A job may run on held GPUs only if it ends before every reservation of this cycle starts.

    Under the declared default rule (`Policies.may_use_held` None: `backfill.may_use_held`
    for each reservation) that is one comparison with the earliest start.
    """
    ends, holds, rule = _ends_if_started(adm, job), adm.plan.holds, adm.c.policies.may_use_held
    if rule is None:
        if adm.held_until[0] != len(holds):
            untils = [h.until for h in holds]
            adm.held_until = (len(holds), min(untils) if all(map(math.isfinite, untils)) else -math.inf)
        return ends <= adm.held_until[1]
    return all(rule(ends, h) for h in holds)


def _ends_if_started(adm: AdmitContext, job: Job) -> float:
    limit = job.spec.time_limit_s
    if limit is None:
        return math.inf
    return adm.c.now + limit + job.spec.grace_period_s + adm.c.policies.stop_margin_s


def _reserve(adm: AdmitContext, job: Job, queue: str, p: Placement) -> None:
    c, plan = adm.c, adm.plan
    port = plan.master_port(job.job_id, job.attempt, p.ranks[0].node_id)
    adm.events.append(
        GangReserved(
            event_id=c.event_id("reserve", job),
            occurred_at=c.now,
            job_id=job.job_id,
            attempt=job.attempt,
            epoch=c.epoch,
            ranks=p.ranks,
            master_port=port,
            reason=p.reason,
        )
    )
    plan.take(p.ranks)
    plan.charge(queue, job.spec.total_gpus)
    plan.busy.add(job.job_id)
    adm.placed.append(Ending(job_id=job.job_id, ends_at=_ends_if_started(adm, job), started_at=c.now, placement=p.ranks))
