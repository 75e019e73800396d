"""Stages 4-5: each queue's line of pending jobs, heads admitted in fair-share order.

For one head, in this order:
  a. a preemptor still waiting on its victims keeps waiting;
  b. allocate: place the whole gang on free GPUs (a preemptor also on the
     GPUs earmarked for it; a job that ends before the backfill reservation
     also on the GPUs held for it);
  c. preempt / reclaim: a minimal victim set, whose GPUs are earmarked;
  d. a queue at its limit waits ("quota");
  e. backfill: a gang blocked by capacity, while fewer than
     `Policies.reservations` gangs hold GPUs, holds the GPUs it will start on
     (planned around the earlier holders' GPUs); later ones are told why
     they wait.
A placement re-ranks its queue (its share grew); a blocked head does not, and
after `heads_per_queue` blocked heads a queue is done for this cycle.

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
one. A gang blocked by its own queue's limit keeps the quota its queue frees
(`_quota_holds`). Measured in bench/RESULTS.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from heapq import heapify, heappop, heappush, merge
from operator import attrgetter
from typing import NamedTuple

from orchestrator.core.capacity import FreeIndex
from orchestrator.core.cycle import Cycle
from orchestrator.core.estimates import estimated_end
from orchestrator.core.explain import (
    BACKFILL,
    BACKFILL_HEAD,
    PLACED,
    PREEMPTING,
    QUOTA,
    Outcome,
    capacity_outcome,
)
from orchestrator.core.plan import Hold, Plan
from orchestrator.core.running import RunningGangs, ends_at, running_gangs
from orchestrator.core.state import FREE, HOLDING, RESERVING, Job, LineKey, Waiting, attained_service
from orchestrator.core.usage import ancestors, resolve_queue
from orchestrator.policies import Candidate, Ending, PreemptionAsk
from orchestrator.policies.backfill import may_use_held
from orchestrator.policies.fairshare import JobKey, job_order_key
from orchestrator.policies.links import Links
from orchestrator.policies.placement import GangRequest, Placement
from schemas.events import Event, GangReserved, PreemptionRequested, RankPlacement


class Line:
    """One queue's pending jobs in order, read lazily: a cycle looks at a few heads, not the whole backlog."""

    __slots__ = ("_busy", "_items", "head")

    def __init__(self, items: Iterator[tuple[JobKey, Job]], busy: set[str]) -> None:
        self._items = items
        self._busy = busy
        self.head: tuple[JobKey, Job] | None = None
        self._advance()

    def _advance(self) -> None:
        for key, job in self._items:
            if job.job_id not in self._busy:
                self.head = (key, job)
                return
        self.head = None

    def pop(self) -> Job:
        assert self.head is not None
        job = self.head[1]
        self._advance()
        return job


def queue_lines(c: Cycle, plan: Plan) -> dict[str, Line]:
    """Each queue's line of pending jobs (jobs already decided on this cycle are skipped).

    With the default order the fold's sorted lines are read as they are (several
    spec queue names may resolve to one queue: their lines merge); a custom
    `job_key` sorts the backlog once per cycle.
    """
    state, busy = c.state, plan.busy
    if c.policies.job_key is job_order_key:
        by_queue: dict[str, list[list[LineKey]]] = {}
        for name, keys in state.lines.items():
            by_queue.setdefault(resolve_queue(state, name), []).append(keys)
        jobs = state.jobs
        return {
            q: Line(((k, jobs[k[2]]) for k in (ks[0] if len(ks) == 1 else merge(*ks))), busy)
            for q, ks in by_queue.items()
        }
    key = c.policies.job_key
    custom: dict[str, list[tuple[JobKey, Job]]] = {}
    for jid in state.pending:
        job = state.jobs[jid]
        custom.setdefault(resolve_queue(state, job.spec.queue), []).append((key(job), job))
    return {q: Line(iter(sorted(items, key=lambda kj: kj[0])), busy) for q, items in custom.items()}


class _Admission:
    """What the admission of one cycle shares between heads (built lazily)."""

    def __init__(self, c: Cycle, plan: Plan) -> None:
        self.c = c
        self.plan = plan
        self.events: list[Event] = []
        self.searches = c.policies.preemption_searches
        self._eligible_jobs: list[Job] | None = None
        self._running: RunningGangs | None = None
        self._candidates: list[Candidate] | None = None
        self._victims_of: dict[str, list[str]] | None = None
        #: Gangs placed earlier in this cycle: they end too (backfill estimates).
        self.placed: list[Ending] = []
        self._memo: dict[tuple[object, ...], object] = {}
        #: Victim searches that found nothing: shape/queue -> highest priority that failed.
        self.hopeless: dict[tuple[object, ...], float] = {}
        #: Victim searches that spent the budget without a `hopeless` entry (the next alike head searches too).
        self.unremembered_searches = 0
        #: (holds counted, the earliest start among them): the default may_use_held rule's bound.
        self.held_until: tuple[int, float] = (0, math.inf)
        #: A reservation of this cycle was planned afresh: a later holder cannot keep its told one past returns.
        self.replanned = False
        # What `Admitted.complete` is judged on: each blocked head (and its queue) with the plan's
        # (version, charges) it was judged at, a placement on held GPUs, a victim search the budget refused.
        self.blocked: list[tuple[int, int, Job, str]] = []
        self.through_hold = False
        self.out_of_searches = False
        #: A head looked at first is not holding (or one holding was not looked at first).
        self.holders_differ = False
        #: Limited queue -> the queue head its limit blocked first (in line order): its quota is
        #: kept for that gang (set once per cycle, before any head is judged: see _quota_holds).
        self.quota_holds: dict[str, tuple[LineKey, str]] = {}
        #: A reservation was given in the fair-share loop (not to a head looked at first).
        self.loop_holds = False
        #: Per queue, the blocked heads the fair-share loop judged.
        self.blocked_heads: dict[str, int] = {}
        #: A head waits for GPUs (not placed, preempting or over quota).
        self.capacity_blocked = False

    # Free GPUs only shrink during admission (placements take, holds take, victims' GPUs go to
    # their preemptor), so a gang shape that found no room in the plan's shared index finds
    # none later in the cycle either: remember it instead of searching 64 leaves again.

    def _shape(self, req: GangRequest) -> tuple[object, ...]:
        return (req.cls, req.ranks, req.gpus_per_rank, req.level, req.required)

    def place(self, req: GangRequest, index: FreeIndex, *, shared: bool) -> Placement | None:
        key = ("no room", self._shape(req))
        if shared and key in self._memo:
            return None
        p = self.c.policies.place(req, index, self.links_of)
        if p is None and shared:
            self._memo[key] = None
        return p

    def place_through_hold(self, req: GangRequest) -> Placement | None:
        """Place on free and held GPUs (held ones only shrink too, so a shape that found no room finds none later)."""
        key = ("no room through hold", self._shape(req))
        if key in self._memo:
            return None
        p = self.c.policies.place(req, self.plan.index(req.cls, through_hold=True), self.links_of)
        if p is None:
            self._memo[key] = None
        else:
            self.through_hold = True
        return p

    def fits_now(self, req: GangRequest) -> bool:
        key = ("fits", self._shape(req), self.plan.version)
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self.c.policies.fits(req, self.plan.index(req.cls))
        return bool(found)

    def fits_through_hold(self, req: GangRequest) -> bool:
        key = ("through hold", self._shape(req), self.plan.version)
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self.c.policies.fits(req, self.plan.index(req.cls, through_hold=True))
        return bool(found)

    def capacity_outcome(self, req: GangRequest, index: FreeIndex, model: str | None, *, shared: bool) -> Outcome:
        """Why it does not fit; the numbers are computed once per shape until the plan changes."""
        if not shared:
            return capacity_outcome(req, index, model)
        key = ("why", self._shape(req), model, self.plan.version)
        found = self._memo.get(key)
        if not isinstance(found, Outcome):
            found = self._memo[key] = capacity_outcome(req, index, model)
        return found

    def links_of(self, node: str) -> Links:
        return self.c.state.nodes[node].inventory.links

    def running(self) -> RunningGangs:
        if self._running is None:
            self._running = running_gangs(self.c.state, self.c.memo)
        return self._running

    def _eligible(self) -> list[Job]:
        """Running preemptible gangs not yet decided on this cycle (rebuilt after each preemption)."""
        if self._eligible_jobs is None:
            state, busy = self.c.state, self.plan.busy
            jobs = state.jobs
            self._eligible_jobs = [
                j
                for jid in sorted(self.running().preemptible)
                if jid not in busy and (j := jobs[jid]).status in ("reserved", "running") and j.stop is None
            ]
            self._candidates = None
        return self._eligible_jobs

    def candidates(self) -> list[Candidate]:
        if self._candidates is None:
            now = self.c.now
            self._candidates = [
                Candidate(
                    job_id=j.job_id,
                    attempt=j.attempt,
                    queue=j.queue,
                    priority=j.spec.priority,
                    preemptible=j.spec.preemptible,
                    started_at=j.reserved_at,
                    gpus=j.gpus,
                    placement=j.placement,
                    attained=attained_service(j, now),
                    interruptions=max(0, j.attempt - 1 - j.restarts),
                    at_risk=j.gpus * max(0.0, now - j.reserved_at),
                )
                for j in self._eligible()
            ]
        return self._candidates

    def could_preempt(self, queue: str, priority: int, owed: bool) -> bool:
        """Cheap necessary condition for a victim search: someone it may preempt at all.

        (It counts gangs already decided on this cycle too: a search then finds out.)
        """
        lowest = self.running().lowest
        if lowest.get(queue, priority) < priority:
            return True
        return owed and any(q != queue for q in lowest)

    def preempted(self) -> None:
        self._eligible_jobs = None
        self._candidates = None

    def victims_of(self, preemptor: str) -> list[str]:
        if self._victims_of is None:
            self._victims_of = {}
            for jid in self.c.state.watch:  # every preempting gang is watched
                j = self.c.state.jobs[jid]
                if j.status == "preempting" and j.preemptor:
                    self._victims_of.setdefault(j.preemptor, []).append(jid)
        return self._victims_of.get(preemptor, [])

    def endings(self) -> Iterator[Ending]:
        """Every gang that will give GPUs back, by expected end (backfill's estimate), read lazily.

        Running gangs come in the fold's `ends` order (start + time limit); a gang
        being stopped ends sooner than that, which only makes the estimate
        cautious (backfill takes the latest end among the gangs it released).
        """
        state, margin, plan = self.c.state, self.c.policies.stop_margin_s, self.plan
        gone = plan.ended | plan.victims
        jobs = state.jobs

        def running() -> Iterator[Ending]:
            for _, started, jid in state.ends:
                if jid in gone:
                    continue
                j = jobs[jid]
                if j.status != "preempting":  # its GPUs go to its preemptor
                    yield Ending(jid, ends_at(j, margin), started, j.placement)

        placed = sorted(self.placed, key=_BY_END)
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


class Admitted(NamedTuple):
    events: list[Event]
    outcomes: dict[str, Outcome]
    #: Admitting again, once these events and the workers' WorkerStarted answers are folded, at the
    #: same `now` with nothing else changed, decides nothing: see `_complete`.
    complete: bool


def admit(c: Cycle, plan: Plan, lines: dict[str, Line]) -> Admitted:
    pol = c.policies
    adm = _Admission(c, plan)
    outcomes: dict[str, Outcome] = {}

    def judged(job: Job, q: str, *, looked_first: bool = False) -> Outcome:
        o = outcomes[job.job_id] = _admit_one(adm, job, q)
        code = o.code
        if code not in _UNMOVED:
            adm.blocked.append((plan.version, plan.charges, job, q))
        if code == BACKFILL_HEAD and not looked_first:
            adm.loop_holds = True  # the next cycle looks at it first (see _complete)
        elif code != PLACED and (code == BACKFILL_HEAD) != looked_first:
            adm.holders_differ = True  # the next cycle looks at other heads first
        if code not in (PLACED, QUOTA, PREEMPTING):
            adm.capacity_blocked = True
        return o
    # Fair-share order across queues, then the heads' line order (priority, submit time, id).
    # 0. The gangs holding backfill reservations go first: each starts, or keeps holding.
    #    Free reservations: the queue heads blocked by capacity first in reservation order,
    #    after the heads before them in that order that start now.
    first: list[str] = []

    def look_first(job: Job, q: str) -> None:
        plan.busy.add(job.job_id)  # its line skips it during this loop
        line = lines.get(q)
        if line is not None and line.head is not None and line.head[1].job_id == job.job_id:
            line.pop()
        judged(job, q, looked_first=True)
        first.append(job.job_id)

    adm.quota_holds = _quota_holds(adm, lines)
    for job, q in _holders(adm):
        if len(plan.holds) >= pol.reservations:
            break
        look_first(job, q)
    tries = pol.reservations + len(lines)  # each try takes a head off its line: bounded anyway
    while len(plan.holds) < pol.reservations and tries > 0:
        chosen = _reservation_turn(adm, lines)
        if chosen is None:
            break
        look_first(*chosen)
        if outcomes[chosen[0].job_id].code != PLACED:
            tries -= 1  # a placement takes GPUs and a head: it ends on its own
    ranks: dict[tuple[str, int, int], tuple[object, ...]] = {}
    order = [(_rank(c, plan, q, line, ranks), line.head[0], q) for q, line in lines.items() if line.head]
    heapify(order)
    blocked = adm.blocked_heads = dict.fromkeys(lines, 0)
    while order:
        rank, head_key, q = heappop(order)
        line = lines[q]
        assert line.head is not None
        now_rank = _rank(c, plan, q, line, ranks)
        if now_rank > rank:  # a charge to another queue moved it (a sibling in a hierarchy): look again
            heappush(order, (now_rank, head_key, q))
            continue
        job = line.pop()
        outcome = judged(job, q)
        if outcome.code != PLACED:
            blocked[q] += 1
            if blocked[q] >= pol.heads_per_queue:
                continue
        if line.head is not None:
            heappush(order, (_rank(c, plan, q, line, ranks), line.head[0], q))
    for jid in first:
        if outcomes[jid].code != PLACED:
            plan.busy.discard(jid)  # explain tells it why it still waits
    settled = _final_verdicts(adm, outcomes)
    return Admitted(adm.events, outcomes, settled and _complete(adm))


#: Verdicts that later changes of the plan in the same cycle leave as they are: a placement, a
#: preemptor's (its victims are named in the state), a holder's (its reservation is told, and
#: placements take held GPUs only through `place_through_hold`, which `_complete` checks).
_UNMOVED = (PLACED, PREEMPTING, BACKFILL_HEAD)


def _complete(adm: _Admission) -> bool:
    """Whether admitting again after this cycle's events are folded (same `now`) would decide nothing.

    The next cycle's plan starts where this one ends: the fold takes the GPUs
    placed and earmarked, the plan counts preemptions in flight, and the told
    reservations are kept (no GPU came back). Each head judged again gets the
    verdict it got here if it was judged on that final plan, with the same
    budget (no victim search refused for want of one); one judged before a
    later placement, hold or charge was told its verdict on the final plan
    (`_final_verdicts`, whose result `admit` checks). More ways to differ:
    gangs placed now may be victims next time (not while min_runtime_s
    keeps them), a placement on held GPUs ends after a reservation's start
    (not under the default `may_use_held`: the told reservation stands, and
    its changed count of free GPUs is no reason to tell it again),
    a preemption or a preemptor's start moves `freed_seq` (its reservations
    are planned again), and a free reservation goes to a head blocked by
    capacity (none left over, or reservations chosen in the loop, where this
    cycle gave them). And the heads looked at first must be the next
    cycle's holders -- each placed or holding; a reservation given in the
    loop makes the next cycle look at its holder first, which only changes
    a queue's count of blocked heads, so it matters only for a queue that
    ran out of heads -- or a queue's count of blocked heads differs. Strict mode in
    the simulator checks every use of it.
    """
    c, plan = adm.c, adm.plan
    if adm.out_of_searches or (adm.placed and c.state.config.min_runtime_s <= 0):
        return False
    if adm.through_hold and c.policies.may_use_held is not may_use_held:
        return False  # another rule may let a gang outlast a reservation's start: it is planned again
    if plan.victims or any(c.state.jobs[p.job_id].earmark for p in adm.placed):
        return False  # folded, these move freed_seq: told reservations are planned again
    if adm.holders_differ:
        return False
    if adm.loop_holds and any(n >= c.policies.heads_per_queue - 1 for n in adm.blocked_heads.values()):
        # The next cycle looks at the new holders first, so their queues' lines count one
        # blocked head fewer: only a queue that ran out of heads sees a difference. Otherwise
        # the same heads are judged on the same final plan (blocked ones only see fewer free
        # GPUs, charges move no verdict but the order, and `_final_verdicts` told them).
        return False
    pol = c.policies
    return len(plan.holds) >= pol.reservations or pol.reservation_order is None or not adm.capacity_blocked


def _final_verdicts(adm: _Admission, outcomes: dict[str, Outcome]) -> bool:
    """Tell the heads judged before a later change of the plan why they wait on the cycle's final plan.

    A head judged early heard "the largest free node has 7" before a later
    placement took one of those GPUs; the log should say what holds after the
    cycle, and the next cycle -- which judges on that plan -- then has nothing
    new to tell it. (Before, 2,231 such cycles of a 20,000-job simulation were
    followed by a full decide call that told the new reasons; now that call
    is skipped, and the log is 1.6% shorter with the same placements.)
    Fewer GPUs are free on the final plan (the plan only takes them), so it
    still does not fit; victims are the same gangs with less room, so none
    appear -- unless its queue is owed its guarantee on the final plan (a
    victim's queue gave GPUs back, another queue became a borrower). With the
    reservations all given, what is left is the quota, backfill or capacity
    reason, reached as `_judge` reaches it. False if some head's verdict could
    not be re-derived so (it keeps the one it got; admission is not complete).
    """
    c, plan = adm.c, adm.plan
    final = (plan.version, plan.charges)
    stale = [(job, q) for version, charges, job, q in adm.blocked if (version, charges) != final]
    if not stale:
        return True
    if len(plan.holds) < c.policies.reservations:
        return False
    settled = True
    alike: dict[tuple[object, ...], Outcome | None] = {}  # heads of one queue, shape and model are told alike
    for job, queue in stale:
        if job.earmark:
            settled = False
            continue
        req = c.policies.request(job)
        key = (queue, adm._shape(req), job.spec.gpu_model)
        if key not in alike:
            alike[key] = _final_verdict(adm, job, queue, req)
        verdict = alike[key]
        if verdict is None:
            settled = False
        else:
            outcomes[job.job_id] = verdict
    return settled


def _final_verdict(adm: _Admission, job: Job, queue: str, req: GangRequest) -> Outcome | None:
    """A blocked head's verdict on the final plan (see `_final_verdicts`), or None if it may be another."""
    c, plan = adm.c, adm.plan
    q = c.state.queues.get(queue)
    if plan.gpus.get(queue, 0) + req.gpus <= (q.guaranteed_gpus if q is not None else 0):
        return None
    return _blocked_verdict(adm, job, queue, req, plan.index(req.cls), plan.limit_blocker(queue, req.gpus))


def _rank(c: Cycle, plan: Plan, queue: str, line: Line, ranks: dict[tuple[str, int, int], tuple[object, ...]]) -> tuple[object, ...]:
    """A queue's place in this cycle's order: its head's age once it starves, else the fair-share key.

    Aging, as in Slurm's multifactor priority: a head pending longer than
    `Policies.starving_after_s` goes before every queue in fair-share order,
    oldest first, so a heavy queue's gang does not wait on light queues'
    streams of small jobs forever.
    """
    assert line.head is not None
    head = line.head[1]
    if c.now - head.waiting_since > c.policies.starving_after_s:
        return (0, head.waiting_since)
    # A queue's load changes only with a charge: its key is kept until then (per head size).
    asks = head.spec.total_gpus
    key = (queue, plan.charges, asks)
    found = ranks.get(key)
    if found is None:
        found = ranks[key] = (1, c.policies.queue_key(plan.load(queue)._replace(asks=asks)))
    return found


def _reservation_turn(adm: _Admission, lines: dict[str, Line]) -> tuple[Job, str] | None:
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
        req = pol.request(job)
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


def _quota_holds(adm: _Admission, lines: dict[str, Line]) -> dict[str, tuple[LineKey, str]]:
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
    first: dict[str, tuple[LineKey, str]] = {}
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
        if found is None or job.line_key < found[0]:
            first[over[0]] = (job.line_key, job.job_id)
    return first


def _quota_kept(adm: _Admission, job: Job, queue: str) -> tuple[str, str] | None:
    """(limited queue, gang) when a queue in `job`'s chain keeps its quota for a gang ahead of `job` in line."""
    holds = adm.quota_holds
    if not holds:
        return None
    for name in ancestors(adm.c.state.queues, queue):
        holder = holds.get(name)
        if holder is not None and holder[0] < job.line_key:
            return name, holder[1]
    return None


def _holders(adm: _Admission) -> Iterator[tuple[Job, str]]:
    """The pending gangs the fold says hold reservations, oldest reservation first, with their queues."""
    c, plan = adm.c, adm.plan
    for jid in list(c.state.holders):
        job = c.state.jobs.get(jid)
        if job is None or job.status != "pending" or job.earmark or jid in plan.busy:
            continue
        yield job, resolve_queue(c.state, job.spec.queue)


def _hold(adm: _Admission, job: Job, queue: str, req: GangRequest, base: FreeIndex) -> Outcome | None:
    """Give `job` the backfill reservation, if the backfill policy finds one."""
    plan, pol = adm.plan, adm.c.policies
    hold = _told_hold(adm, job)
    replanned = _came_back(adm, job)  # told again: planned afresh, or confirmed (see _told_hold)
    if hold is None:
        adm.replanned = True
        hold = pol.backfill(req, base, adm.endings(), pol.fits, pol.place, adm.links_of)
        if hold is None:
            return None
    held = sum(len(set(rp.gpus) & set(plan.free.get(rp.node_id, ()))) for rp in hold.ranks)
    plan.add_hold(hold)
    # Charged to its queue's share: a queue does not get the next GPUs as well as a reservation
    # for its gang, so on a full cluster, where every freed GPU is reserved, fair share still holds.
    plan.charge_share(queue, req.gpus)
    when = f"at t={hold.until:.0f}" if math.isfinite(hold.until) else _estimated_start(adm, hold)
    return Outcome(BACKFILL_HEAD, f"first in line for {req.gpus} GPUs: holding {held} free, expected to start {when}",
                   hold if math.isfinite(hold.until) else None, replanned)


def _estimated_start(adm: _Admission, hold: Hold) -> str:
    """When a reservation behind gangs without a time limit should start, by their learned run times.

    Each GPU it will start on that is not free now comes free when its gang ends:
    by the gang's time limit if it has one, else by its estimate (`Policies.estimate`,
    core/estimates.py). The latest of those ends, with the estimate it came from; no
    estimate for one of the gangs: "when running jobs end", as without history.
    """
    c, plan = adm.c, adm.plan
    state, now, margin = c.state, c.now, c.policies.stop_margin_s
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
    start, source = now, ""
    for jid in gangs:
        job = state.jobs.get(jid)
        if job is None:
            continue
        if job.status in HOLDING:
            end = ends_at(job, margin)
        else:  # placed in this cycle
            limit = job.spec.time_limit_s
            end = now + limit + job.spec.grace_period_s + margin if limit is not None else math.inf
        if not math.isfinite(end):
            est = c.policies.estimate(state, job, job.queue or resolve_queue(state, job.spec.queue))
            if est is None:
                return "when running jobs end"
            end = estimated_end(est, job, now)
            if end >= start:
                source = f" (job {jid} ends then by its learned run time: {est.describe()})"
        elif end >= start:
            source = f" (job {jid} ends then by its time limit)"
        start = max(start, end)
    return f"at about t={start:.0f}{source}"


def _admit_one(adm: _Admission, job: Job, queue: str) -> Outcome:
    """`_judge`, remembering a blocked head's outcome for the next head alike until the plan changes.

    At a busy moment a cycle looks at hundreds of blocked heads, most of them
    alike (1-GPU jobs of one queue): for a head without an earmark the answer
    depends only on its shape, GPU model, queue, priority and whether it may
    use held GPUs -- and on the plan, which `version` and `charges` track. An
    outcome that changed nothing (no GPUs taken, nothing charged, no events,
    no victim search left unremembered) is the answer for the next such head.
    """
    plan, pol = adm.plan, adm.c.policies
    req = pol.request(job)
    if job.earmark or not pol.preemption.priority_or_reclaim_only:
        return _judge(adm, job, queue, req)
    key = ("outcome", adm._shape(req), job.spec.gpu_model, queue, job.spec.priority, bool(plan.holds) and
           _may_use_held(adm, job), plan.version, plan.charges)
    found = adm._memo.get(key)
    if isinstance(found, Outcome):
        return found
    before = (plan.version, plan.charges, len(adm.events), adm.unremembered_searches)
    outcome = _judge(adm, job, queue, req)
    if (plan.version, plan.charges, len(adm.events), adm.unremembered_searches) == before:
        adm._memo[key] = outcome
    return outcome


def _judge(adm: _Admission, job: Job, queue: str, req: GangRequest) -> Outcome:
    plan, pol = adm.plan, adm.c.policies
    # a. A preemptor waits for its victims; afterwards it may use its earmarked GPUs.
    if job.earmark:
        waiting_on = adm.victims_of(job.job_id)
        if waiting_on:
            return Outcome(PREEMPTING, _waiting_for(waiting_on))
        # The plan counted its claim for its queue; judge it afresh (placing charges it again).
        plan.charge(queue, -job.spec.total_gpus)
        base = plan.earmark_view(job, req.cls)
    else:
        base = plan.index(req.cls)
    over = plan.limit_blocker(queue, req.gpus)
    kept = over is None and _quota_kept(adm, job, queue) is not None
    # b. Allocate.
    if over is None and not kept:
        p = adm.place(req, base, shared=not job.earmark)
        if p is None and plan.holds and _may_use_held(adm, job):
            p = adm.place_through_hold(req)
        if p is not None:
            _reserve(adm, job, queue, p)
            return Outcome(PLACED, p.reason)
    # c. Preempt lower priority in the queue, or reclaim a guarantee from borrowers.
    outcome = _preempt(adm, job, queue, req, base)
    if outcome is not None:
        return outcome
    # e. Backfill: the first gang blocked by capacity holds what it will start on.
    if over is None and not kept and len(plan.holds) < pol.reservations:
        outcome = _hold(adm, job, queue, req, base)
        if outcome is not None:
            return outcome
    return _blocked_verdict(adm, job, queue, req, base, over)


def _blocked_verdict(adm: _Admission, job: Job, queue: str, req: GangRequest, base: FreeIndex,
                     over: tuple[str, int, int] | None) -> Outcome:
    """Why a head that was not placed, is not preempting and holds no reservation waits."""
    plan = adm.plan
    # d. Quota: over a limit, or the limit's freed quota is kept for an older gang.
    if over is not None:
        name, limit, used = over
        return Outcome(QUOTA, f"queue {name} at its limit {limit}: holds {used}, needs {req.gpus} more")
    kept = _quota_kept(adm, job, queue)
    if kept is not None:
        name, holder = kept
        return Outcome(QUOTA, f"queue {name}'s quota is kept for job {holder}, first blocked by its limit")
    if plan.holds and adm.fits_through_hold(req):
        ids = [h.job_id for h in plan.holds]
        more = f" and {len(ids) - 1} more" if len(ids) > 1 else ""
        return Outcome(BACKFILL, f"free GPUs are reserved by backfill for job {ids[0]}{more}")
    return adm.capacity_outcome(req, base, job.spec.gpu_model, shared=not job.earmark)


def _told_hold(adm: _Admission, job: Job) -> Hold | None:
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


def _came_back(adm: _Admission, job: Job) -> bool:
    """GPUs came back since `job`'s reservation was told: in the log, or with a gang ending in this cycle."""
    w = job.waiting
    return w is not None and (adm.c.state.freed_seq > w.seq or bool(adm.plan.ended))


def _back_early(adm: _Admission, w: Waiting) -> bool:
    """GPUs came back since the reservation `w` was told that may start it before its told start.

    In the log (or an end moved earlier) since `w`: any. In this cycle: a gang
    ending now whose expected end was before the told start does not -- the
    plan released its GPUs by then, so at each earlier moment the free GPUs
    are still a subset of what the plan had by some moment before the start,
    where the gang did not fit (free GPUs only grow with time, and fitting
    only gets easier with more) -- unless an earlier reservation of this
    cycle was planned afresh and may have let go of GPUs. The reservation is
    then told again (`_hold`), so the next cycle knows these are accounted for.
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


def _may_use_held(adm: _Admission, job: Job) -> bool:
    """A job may run on held GPUs only if it ends before every reservation of this cycle starts."""
    ends, holds, rule = _ends_if_started(adm, job), adm.plan.holds, adm.c.policies.may_use_held
    if rule is may_use_held:  # the default rule: ends before the earliest reservation starts
        if adm.held_until[0] != len(holds):
            untils = [h.until for h in holds]
            adm.held_until = (len(holds), min(untils) if all(map(math.isfinite, untils)) else -math.inf)
        return ends <= adm.held_until[1]
    return all(rule(ends, h) for h in holds)


def _ends_if_started(adm: _Admission, job: Job) -> float:
    limit = job.spec.time_limit_s
    if limit is None:
        return math.inf
    return adm.c.now + limit + job.spec.grace_period_s + adm.c.policies.stop_margin_s


def _reserve(adm: _Admission, job: Job, queue: str, p: Placement) -> None:
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


def _waiting_for(victims: list[str]) -> str:
    ids = sorted(victims)
    more = f" and {len(ids) - 1} more" if len(ids) > 1 else ""
    return f"waiting for preemption of job {ids[0]}{more}"


def _preempt(adm: _Admission, job: Job, queue: str, req: GangRequest, base: FreeIndex) -> Outcome | None:
    c, plan, pol = adm.c, adm.plan, adm.c.policies
    if pol.preemption_searches <= 0:
        return None
    priority = job.spec.priority
    q = c.state.queues.get(queue)
    guaranteed = q.guaranteed_gpus if q is not None else 0
    owed = plan.gpus.get(queue, 0) + req.gpus <= guaranteed
    rule = pol.preemption
    if rule.priority_or_reclaim_only and not adm.could_preempt(queue, priority, owed):
        return None  # nobody it could preempt: do not spend a search
    # Candidates and free GPUs only shrink during a cycle: a shape that found no victims
    # at some priority finds none at that priority or lower later on (for rules that read
    # only priority and guarantees).
    hopeless = ("no victims", req.cls, req.ranks, req.gpus_per_rank, req.level, req.required, queue, owed)
    memo = rule.priority_or_reclaim_only and not job.earmark
    if memo and priority <= adm.hopeless.get(hopeless, -math.inf):
        return None
    if adm.searches <= 0:
        adm.out_of_searches = True  # the next cycle may search: admission is not complete
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
    cands = adm.candidates()
    loads = {q: plan.load(q) for q in dict.fromkeys(x.queue for x in cands)}

    def quota_ok(victims: Sequence[Candidate]) -> bool:
        freed: dict[str, int] = {}
        for v in victims:
            freed[v.queue] = freed.get(v.queue, 0) + v.gpus
        return plan.limit_blocker(queue, req.gpus, freed) is None

    victims = pol.victims(ask, cands, base, loads, pol.fits, quota_ok, rule)
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
            why = f"queue {queue} reclaims its guarantee {guaranteed} from {v.queue}; {room}"
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
    return Outcome(PREEMPTING, _waiting_for([v.job_id for v in victims]))
