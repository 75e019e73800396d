"""What a blocked head keeps: sticky backfill reservations of GPUs, and the quota its queue frees.

Reservations are sticky: the gangs that hold them (the fold's `holders`,
each named by its JobWaiting) are looked at first in every cycle, before the
fair-share order, and keep them until they start -- or until they cannot
hold them any more (over quota, never fits, preempting). Without that a
reservation went to whichever blocked gang came first in a fair-share order
that changes at nearly every event, and a big gang of a busy queue could wait
behind a new holder each time. A free reservation goes to the first gang the
fair-share loop finds blocked by capacity, and the GPUs a reservation is for
count in its queue's share for the rest of the cycle (`Plan.charge_share`):
on a full cluster every GPU that comes back is reserved, so who gets
reservations is who gets GPUs, and fair share must decide it (issue #20:
handed out in submit order, 2:1 queues held 16 and 16 GPUs). Bounded aging
(`Policies.reservation_aging_s`, `reservation_order`): a gang larger than the
smallest head that has waited longer than that takes a free reservation
before the fair-share order, oldest first, after the older heads that fit now
-- so a heavy queue's big gang, whose turn comes last at a peak, still gets
one (`reservation_turn`). A gang blocked by its own queue's limit keeps the
quota its queue frees (`quota_holds`). Measured in bench/RESULTS.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from heapq import merge
from operator import attrgetter

from orchestrator.core.context import AdmitContext
from orchestrator.core.explain import BACKFILL_HEAD, Outcome
from orchestrator.core.lines import Line
from orchestrator.core.locality import locality_note
from orchestrator.core.model.capacity import FreeIndex
from orchestrator.core.model.plan import Hold
from orchestrator.core.model.running import ends_at
from orchestrator.core.model.state import FREE, RESERVING, Job, Waiting
from orchestrator.core.model.usage import ancestors, resolve_queue
from orchestrator.core.reserved_nodes import waiting_note
from orchestrator.policies import Ending
from orchestrator.policies.fairshare import JobKey, arrival_order_key
from orchestrator.policies.placement import GangRequest
from schemas.events import RankPlacement


def holders(adm: AdmitContext) -> Iterator[tuple[Job, str]]:
    """The pending gangs the fold says hold reservations, oldest reservation first, with their queues."""
    c, plan = adm.c, adm.plan
    for jid in list(c.state.holders):
        job = c.state.jobs.get(jid)
        if job is None or job.status != "pending" or job.earmark or jid in plan.busy:
            continue
        yield job, resolve_queue(c.state, job.spec.queue)


def reservation_turn(adm: AdmitContext, lines: dict[str, Line]) -> tuple[Job, str] | None:
    """The queue head whose turn it is, out of fair-share order, while a reservation is free.

    Bounded aging: only heads pending longer than `Policies.reservation_aging_s`
    compete, and only gangs larger than the smallest head looked at (the
    smallest jobs take freed GPUs one by one; a gang no smaller job can
    overtake needs no reservation to start, only its queue's turn). Among
    them, in `reservation_order`, the first head the free GPUs cannot take
    reserves -- or, before it, an aged head they can take starts first: EASY
    backfill starts every job ahead of the one that reserves. Else the
    younger gang's hold would be planned on the very GPUs the older head would
    start on, and the older one would wait behind a job submitted after it.
    Heads that are preemptors or over a quota wait for something else than
    GPUs. None when no aged head is blocked: the free reservations then go in
    fair-share order, to the first gang the loop finds blocked by capacity.
    (Before, every free reservation went in submit order whatever the share:
    on a full cluster, where every freed GPU is reserved, admission was
    global FIFO and queue weights did nothing -- issue #20.)
    """
    c, pol, plan = adm.c, adm.c.policies, adm.plan
    key = pol.reservation_order
    if key is None or not math.isfinite(pol.reservation_aging_s):
        return None
    aged_before = c.now - pol.reservation_aging_s
    heads: list[tuple[Job, str, GangRequest]] = []
    smallest = math.inf
    for q, line in lines.items():
        if line.head is None:
            continue
        job = line.head[1]
        if job.earmark:
            continue
        req = adm.request(job)
        smallest = min(smallest, req.gpus)
        if job.waiting_since < aged_before:
            heads.append((job, q, req))
    blocked: tuple[JobKey, Job, str] | None = None
    fitting: tuple[JobKey, Job, str] | None = None
    for job, q, req in heads:
        k = key(job)
        if blocked is not None and k >= blocked[0]:
            continue  # neither reserves nor goes before the one that does
        if plan.limit_blocker(q, req.gpus) is not None:
            continue
        if not adm.fits_now(req):
            if req.gpus > smallest:
                blocked = (k, job, q)
        elif fitting is None or k < fitting[0]:
            fitting = (k, job, q)
    if blocked is None:
        return None
    turn = fitting if fitting is not None and fitting[0] < blocked[0] else blocked
    return turn[1], turn[2]


def give_reservation(adm: AdmitContext, job: Job, queue: str, req: GangRequest, base: FreeIndex,
                     within_s: float = math.inf) -> Outcome | None:
    """Give `job` the backfill reservation, if the backfill policy finds one (starting within `within_s` from now)."""
    plan, pol = adm.plan, adm.c.policies
    hold = _told_hold(adm, job)
    replanned = _came_back(adm, job)  # told again: planned afresh, or confirmed (see _told_hold)
    if hold is None:
        adm.replanned = True
        hold = pol.backfill(req, base, _endings(adm), pol.fits, pol.place, adm.links_of)
        if hold is None:
            return None
    if hold.until - adm.c.now > within_s:  # (`within_s` finite: Policies.starvation_hold_factor)
        return None
    held = sum(len(set(rp.gpus) & set(plan.free.get(rp.node_id, ()))) for rp in hold.ranks)
    plan.add_hold(hold)
    # Charged to its queue's share: a queue does not get the next GPUs as well as a reservation
    # for its gang, so on a full cluster, where every freed GPU is reserved, fair share still holds.
    plan.charge_share(queue, req.gpus)
    # No place in line ("first in line": two holders of a queue both said so) and no start in the message:
    # readers tell both from the state as it is when asked (estimates.py: `line_place`, `expected_start`).
    why = f"a reservation for {req.gpus} GPUs: holding {held} free"
    if req.only is not None:  # node reservations keep it off nodes, or it waits for the nodes holding its datasets
        note = waiting_note(adm.c.state, job, adm.c.now)
        why += f"; {note or locality_note(req, job.spec, adm.c.topo.order)}"
    finite = math.isfinite(hold.until)
    return Outcome(BACKFILL_HEAD, why, hold if finite else None, replanned, () if finite else _behind(adm, hold))


def _endings(adm: AdmitContext) -> Iterator[Ending]:
    """Every gang that will give GPUs back, by expected end (backfill's estimate), read lazily.

    Running gangs come in the fold's `ends` order (start + time limit); a gang
    being stopped ends sooner than that, which only makes the estimate
    cautious (backfill takes the latest end among the gangs it released).
    """
    state, margin, plan = adm.c.state, adm.c.policies.stop_margin_s, adm.plan
    gone = plan.ended | plan.victims
    jobs = state.jobs

    def running() -> Iterator[Ending]:
        for _, started, jid in state.ends:
            if jid in gone:
                continue
            j = jobs[jid]
            if j.status != "preempting":  # its GPUs go to its preemptor
                yield Ending(jid, ends_at(j, margin), started, j.placement)

    placed = sorted(adm.placed, key=_BY_END)
    out = merge(running(), placed, key=_BY_END)
    if not plan.holds:
        return out
    # A later reservation is planned around the earlier ones: GPUs they will start on
    # never come free for it.
    held = plan.held_gpus()
    return (_without(e, held) for e in out)


_BY_END = attrgetter("ends_at", "started_at", "job_id")


def _without(e: Ending, held: dict[str, set[int]]) -> Ending:
    if not any(rp.node_id in held for rp in e.placement):
        return e
    ranks = tuple(
        RankPlacement(rank=rp.rank, node_id=rp.node_id, gpus=tuple(g for g in rp.gpus if g not in held[rp.node_id]))
        if rp.node_id in held
        else rp
        for rp in e.placement
    )
    return e._replace(placement=ranks)


def _behind(adm: AdmitContext, hold: Hold) -> tuple[str, ...]:
    """The gangs a reservation without a time-limited start waits for: those holding (or placed this cycle on)
    the GPUs it will start on that are not free now, in placement order. Readers tell its start from their
    ends as they are when asked (core/model/estimates.py: `expected_start`), not from a moment in the message."""
    c, plan = adm.c, adm.plan
    state = c.state
    placed: dict[tuple[str, int], str] | None = None
    gangs: dict[str, None] = {}
    for rp in hold.ranks:
        free = plan.free.get(rp.node_id, ())
        owners = state.owners.get(rp.node_id, ())
        for g in rp.gpus:
            if g in free:
                continue
            owner = owners[g] if g < len(owners) else FREE
            if owner == FREE:  # placed earlier in this cycle (or earmarked: free for the estimate)
                if placed is None:
                    placed = {(p.node_id, x): e.job_id for e in adm.placed for p in e.placement for x in p.gpus}
                owner = placed.get((rp.node_id, g), FREE)
            if owner != FREE:
                gangs[owner] = None
    return tuple(gangs)


def _told_hold(adm: AdmitContext, job: Job) -> Hold | None:
    """The reservation the log last told for `job`, while it is still the one to plan.

    It is: if no GPU came back earlier than expected (`_back_early`) -- gangs
    that started since only take GPUs away, so no earlier start exists,
    however long ago it was told -- and each of its GPUs is free now or held
    by a gang expected to end by its start, on a schedulable node, not held
    for an earlier holder. Most decide calls follow a start, not an end, so
    most keep it. Read from the log: a restarted scheduler keeps it too.
    """
    w, c, plan = job.waiting, adm.c, adm.plan
    if w is None or w.code != RESERVING or not w.hold_ranks or job.earmark or _back_early(adm, w):
        return None
    state = c.state
    held = plan.held_gpus() if plan.holds else {}
    busy: set[str] = set()
    for rp in w.hold_ranks:
        node = state.nodes.get(rp.node_id)
        if node is None or not node.schedulable:
            return None
        owners, free = state.owners[rp.node_id], plan.free.get(rp.node_id, ())
        taken = held.get(rp.node_id)
        for g in rp.gpus:
            if g >= len(owners) or (taken is not None and g in taken):
                return None
            if g not in free:
                busy.add(owners[g])
    margin = c.policies.stop_margin_s
    for jid in busy:
        owner = state.jobs.get(jid)
        if (owner is None or owner.status == "preempting" or jid in plan.ended or jid in plan.victims
                or ends_at(owner, margin) > w.hold_until):
            return None  # (a GPU taken earlier in this cycle has no owner yet: plan again)
    return Hold(job_id=job.job_id, until=w.hold_until, ranks=w.hold_ranks)


def _came_back(adm: AdmitContext, job: Job) -> bool:
    """GPUs came back since `job`'s reservation was told: in the log, or with a gang ending in this cycle."""
    w = job.waiting
    return w is not None and (adm.c.state.freed_seq > w.seq or bool(adm.plan.ended))


def _back_early(adm: AdmitContext, w: Waiting) -> bool:
    """GPUs came back since the reservation `w` was told that may start it before its told start.

    In the log (or an end moved earlier) since `w`: any. In this cycle: a gang
    ending now whose expected end was before the told start does not -- the
    plan released its GPUs by then, so at each earlier moment the free GPUs
    are still a subset of what the plan had by some moment before the start,
    where the gang did not fit (free GPUs only grow with time, and fitting
    only gets easier with more) -- unless an earlier reservation of this
    cycle was planned afresh and may have let go of GPUs. The reservation is
    then told again (`give_reservation`), so the next cycle knows these are accounted for.
    """
    c, plan = adm.c, adm.plan
    if c.state.freed_seq > w.seq:
        return True
    if not plan.ended:
        return False
    if adm.replanned:
        return True
    jobs, margin, start = c.state.jobs, c.policies.stop_margin_s, w.hold_until
    return any((j := jobs[jid]).status == "preempting" or ends_at(j, margin) >= start for jid in plan.ended)


# The quota a limit frees is kept for the gang it blocked first.


def quota_holds(adm: AdmitContext, lines: dict[str, Line]) -> dict[str, tuple[JobKey, str]]:
    """Per limited queue, the head its limit blocks that is first in line order: the quota it frees is kept.

    Without that, a gang blocked by its own queue's limit never starts while
    the queue (or a sibling under the same limit) has smaller jobs: each GPU
    its queue gives back is taken at once by one of them (issue #20: a 32-GPU
    gang waited longer than under FIFO). Read from the heads as the cycle
    starts, so every head of the cycle, in whatever order it is judged, gets
    the same answer; a gang only blocked after this cycle's placements keeps
    the quota from the next cycle on.
    """
    plan, pol = adm.plan, adm.c.policies
    first: dict[str, tuple[JobKey, str]] = {}
    for q, line in lines.items():
        if line.head is None:
            continue
        job = line.head[1]
        if job.earmark:
            continue
        over = plan.limit_blocker(q, pol.request(job).gpus)
        if over is None:
            continue
        found = first.get(over[0])
        key = _in_line(adm, job)
        if found is None or key < found[0]:
            first[over[0]] = (key, job.job_id)
    return first


def _in_line(adm: AdmitContext, job: Job) -> JobKey:
    """`job`'s place in line for the quota: the fold's line key, or -- for a policy ordering its own
    way (`Policies.job_key`) -- priority then arrival, the fold's line order before claims (#29)."""
    return job.line_key if adm.c.policies.job_key is None else arrival_order_key(job)


def quota_kept(adm: AdmitContext, job: Job, queue: str) -> tuple[str, str] | None:
    """(limited queue, gang) when a queue in `job`'s chain keeps its quota for a gang ahead of `job` in line."""
    holds = adm.quota_holds
    if not holds:
        return None
    for name in ancestors(adm.c.state.queues, queue):
        holder = holds.get(name)
        if holder is not None and holder[0] < _in_line(adm, job):
            return name, holder[1]
    return None
