"""Stage 5: the queue heads admitted in fair-share order, each through its decision chain.

One cycle's admission, in the order `admit` runs it:
  1. quota: per limited queue, the head its limit blocks first keeps the quota
     the queue frees (reservations.quota_holds);
  2. first the preemptors whose GPUs are earmarked (wherever they are in
     line), then the gangs past the starvation bound, oldest first, which
     may stop the cheapest running gangs (starving.py), then the gangs the
     log says hold backfill reservations -- each starts, or keeps holding
     (reservations.holders; reservations are sticky);
  3. free reservations out of turn: while one is free, an aged head blocked by
     capacity is judged next, after the aged heads before it that fit now
     (reservations.reservation_turn: bounded aging);
  4. fair share: the other heads in fair-share order across queues
     (lines.queue_rank), each queue's in line order; a placement re-ranks its
     queue (its share grew), a blocked head does not, and after
     `heads_per_queue` blocked heads a queue is done for this cycle;
  5. the heads looked at first that still wait go back to their lines
     (explain tells them why);
  6. the skip certificate: heads judged before a later change of the plan are
     told their verdict on the final plan, and `Admitted.complete` says
     whether a repeat call may skip admission (completeness.py).
Every head goes through the same chain (heads.py): wait on victims, allocate,
preempt / reclaim (preemption.py), backfill reservation (reservations.py),
else the reason it waits. What the heads share lives in one AdmitContext
(context.py), dropped with the cycle.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush
from typing import NamedTuple

from orchestrator.core.completeness import Certificate, complete, final_verdicts, note_verdict
from orchestrator.core.context import AdmitContext
from orchestrator.core.cycle import Cycle
from orchestrator.core.explain import PLACED, PREEMPTING, Outcome
from orchestrator.core.heads import admit_one
from orchestrator.core.lines import Line, Ranks, queue_rank
from orchestrator.core.model.plan import Plan
from orchestrator.core.model.state import Job
from orchestrator.core.reservations import holders, quota_holds, reservation_turn
from orchestrator.core.starving import earmarked, starving_gangs
from schemas.events import Event


class Admitted(NamedTuple):
    events: list[Event]
    outcomes: dict[str, Outcome]
    #: Admitting again, once these events and the workers' WorkerStarted answers are folded, at the
    #: same `now` with nothing else changed, decides nothing: see `completeness.complete`.
    complete: bool
    #: The fair-share loop stopped at `Policies.placements_per_cycle`: the next cycle goes on.
    capped: bool = False


def admit(c: Cycle, plan: Plan, lines: dict[str, Line]) -> Admitted:
    adm = AdmitContext(c, plan, Certificate())
    # 1. Quota: the quota a limit frees is kept for the head it blocked first.
    adm.quota_holds = quota_holds(adm, lines)
    # 2. Preemptors with earmarked GPUs, then the gangs past the starvation bound, oldest first;
    #    then the gangs holding backfill reservations: each starts, or keeps holding.
    first = _earmarked_first(adm, lines)
    first += _starving_first(adm, lines)
    first += _holders_first(adm, lines)
    # 3. Free reservations: the aged heads blocked by capacity first, in reservation order,
    #    after the heads before them in that order that start now.
    first += _aged_first(adm, lines)
    # 4. Fair-share order across queues, then the heads' line order (priority, claim, waiting since, id).
    _in_fair_share_order(adm, lines)
    # 5. A head looked at first that still waits is pending again: explain tells it why.
    for jid in first:
        if adm.outcomes[jid].code != PLACED:
            plan.busy.discard(jid)
    # 6. Tell early verdicts on the final plan; certify whether a repeat call may be skipped.
    settled = final_verdicts(adm)
    return Admitted(adm.events, adm.outcomes, settled and complete(adm), adm.cert.capped)


def _judged(adm: AdmitContext, job: Job, queue: str, *, looked_first: bool = False) -> Outcome:
    o = adm.outcomes[job.job_id] = admit_one(adm, job, queue)
    note_verdict(adm, job, queue, o.code, looked_first=looked_first)
    return o


def _look_first(adm: AdmitContext, lines: dict[str, Line], job: Job, queue: str, *, looked_first: bool = True) -> None:
    """Judge `job` before the fair-share loop (its line skips it during that loop)."""
    adm.plan.busy.add(job.job_id)
    line = lines.get(queue)
    if line is not None and line.head is not None and line.head[1].job_id == job.job_id:
        line.pop()
    _judged(adm, job, queue, looked_first=looked_first)


def _earmarked_first(adm: AdmitContext, lines: dict[str, Line]) -> list[str]:
    """Step 2a: the preemptors whose GPUs are earmarked (starving.earmarked), wherever they are in line.

    A preemptor still waiting on its victims gets the same verdict in a repeat call, like a
    head of the loop; one that does not start now makes the cycle incomplete (it was looked at
    out of the loop's order).
    """
    first: list[str] = []
    if not adm.c.policies.earmarked_first:
        return first
    for job, q in earmarked(adm.c.state, adm.plan.busy):
        _look_first(adm, lines, job, q, looked_first=False)
        first.append(job.job_id)
        if adm.outcomes[job.job_id].code not in (PLACED, PREEMPTING):
            adm.cert.holders_differ = True
    return first


def _starving_first(adm: AdmitContext, lines: dict[str, Line]) -> list[str]:
    """Step 2b: the gangs past the starvation bound (core/starving.py), oldest first."""
    first: list[str] = []
    for job, q in starving_gangs(adm.c, adm.plan.busy):
        adm.starving_now(job)  # (the list is `is_starving`'s answer: its heads ask again)
        _look_first(adm, lines, job, q)
        first.append(job.job_id)
    return first


def _holders_first(adm: AdmitContext, lines: dict[str, Line]) -> list[str]:
    """Step 2: the fold's holders, oldest reservation first, while reservations are left."""
    first: list[str] = []
    for job, q in holders(adm):
        if len(adm.plan.holds) >= adm.c.policies.reservations:
            break
        _look_first(adm, lines, job, q)
        first.append(job.job_id)
    return first


def _aged_first(adm: AdmitContext, lines: dict[str, Line]) -> list[str]:
    """Step 3: the heads whose turn it is out of fair-share order, while a reservation is free."""
    plan, pol = adm.plan, adm.c.policies
    first: list[str] = []
    tries = pol.reservations + len(lines)  # each try takes a head off its line: bounded anyway
    while len(plan.holds) < pol.reservations and tries > 0:
        chosen = reservation_turn(adm, lines)
        if chosen is None:
            break
        _look_first(adm, lines, *chosen)
        first.append(chosen[0].job_id)
        if adm.outcomes[chosen[0].job_id].code != PLACED:
            tries -= 1  # a placement takes GPUs and a head: it ends on its own
    return first


def _in_fair_share_order(adm: AdmitContext, lines: dict[str, Line]) -> None:
    """Step 4: pop the best-ranked queue's head, judge it, re-rank its queue; a queue stops after
    `heads_per_queue` blocked heads, the loop after `placements_per_cycle` placements.

    The cap bounds a cycle's work on an empty cluster (#34: 5,200 placements, 0.5 CPU s, at
    4,096 nodes), and stopping there changes no order: the next cycle, which the placements'
    own events wake at once, starts from the plan this one ends with.
    """
    c, plan = adm.c, adm.plan
    ranks: Ranks = {}
    order = [(queue_rank(c, plan, q, line, ranks), line.head[0], q) for q, line in lines.items() if line.head]
    heapify(order)
    blocked = adm.cert.blocked_heads = dict.fromkeys(lines, 0)
    # The plan's charges when each queue was ranked: its rank (its head's and the loads' function) stands until a charge.
    ranked_at = dict.fromkeys(lines, plan.charges)
    while order:
        rank, head_key, q = heappop(order)
        line = lines[q]
        assert line.head is not None
        if ranked_at[q] != plan.charges:
            now_rank = queue_rank(c, plan, q, line, ranks)
            ranked_at[q] = plan.charges
            if now_rank > rank:  # a charge to another queue moved it (a sibling in a hierarchy): look again
                heappush(order, (now_rank, head_key, q))
                continue
        job = line.pop()
        outcome = _judged(adm, job, q)
        if outcome.code == PLACED and len(adm.placed) >= c.policies.placements_per_cycle:
            adm.cert.capped = True
            return
        if outcome.code != PLACED:
            blocked[q] += 1
            if blocked[q] >= c.policies.heads_per_queue:
                continue
        if line.head is not None:
            heappush(order, (queue_rank(c, plan, q, line, ranks), line.head[0], q))
            ranked_at[q] = plan.charges
