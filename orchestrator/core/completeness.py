"""The skip certificate: when admitting again, at the same `now`, would decide nothing (`Admitted.complete`).

The simulator calls `decide` again after each placement; where this
certificate holds it may skip the repeat call's admission (decide.py's
`after_complete`; its strict mode checks every use). Admission records what
the certificate is judged on as each head is judged (`note_verdict`), tells
the heads judged early their verdict on the cycle's final plan
(`final_verdicts`), and then asks `complete`.
"""

from __future__ import annotations

from orchestrator.core.context import AdmitContext, shape_of
from orchestrator.core.explain import BACKFILL_HEAD, PLACED, PREEMPTING, QUOTA, Outcome
from orchestrator.core.heads import blocked_verdict
from orchestrator.core.model.state import Job
from orchestrator.policies.placement import GangRequest


class Certificate:
    """What `complete` is judged on, recorded as admission judges heads (one per cycle, `AdmitContext.cert`).

    Kept apart from the rest of the cycle's context so the certificate's inputs are in one place: a
    new way for a repeat call to differ needs a field here and a line in `complete`.
    """

    __slots__ = (
        "blocked",
        "blocked_heads",
        "capacity_blocked",
        "capped",
        "holders_differ",
        "loop_holds",
        "out_of_searches",
        "through_hold",
    )

    def __init__(self) -> None:
        #: Each blocked head (and its queue) with the plan's (version, charges) it was judged at.
        self.blocked: list[tuple[int, int, Job, str]] = []
        #: A gang was placed on held GPUs (`AdmitContext.place_through_hold`).
        self.through_hold = False
        #: A victim search the budget refused (the next cycle may search).
        self.out_of_searches = False
        #: The fair-share loop stopped at `Policies.placements_per_cycle` (admit._in_fair_share_order).
        self.capped = False
        #: A head looked at first is not holding (or one holding was not looked at first).
        self.holders_differ = False
        #: A reservation was given in the fair-share loop (not to a head looked at first).
        self.loop_holds = False
        #: Per queue, the blocked heads the fair-share loop judged.
        self.blocked_heads: dict[str, int] = {}
        #: A head waits for GPUs (not placed, preempting or over quota).
        self.capacity_blocked = False


#: Verdicts that later changes of the plan in the same cycle leave as they are: a placement, a
#: preemptor's (its victims are named in the state), a holder's (its reservation is told, and
#: placements take held GPUs only through `place_through_hold`, which `complete` checks).
_UNMOVED = (PLACED, PREEMPTING, BACKFILL_HEAD)


def note_verdict(adm: AdmitContext, job: Job, queue: str, code: str, *, looked_first: bool) -> None:
    """Record what `complete` needs to know of a head just judged (on the plan as it is now)."""
    plan = adm.plan
    if code not in _UNMOVED:
        adm.cert.blocked.append((plan.version, plan.charges, job, queue))
    if code == BACKFILL_HEAD and not looked_first:
        adm.cert.loop_holds = True  # the next cycle looks at it first (see complete)
    elif code != PLACED and (code == BACKFILL_HEAD) != looked_first:
        adm.cert.holders_differ = True  # the next cycle looks at other heads first
    if code not in (PLACED, QUOTA, PREEMPTING):
        adm.cert.capacity_blocked = True


def complete(adm: AdmitContext) -> bool:
    """Whether admitting again after this cycle's events are folded (same `now`) would decide nothing.

    The next cycle's plan starts where this one ends: the fold takes the GPUs
    placed and earmarked, the plan counts preemptions in flight, and the told
    reservations are kept (no GPU came back). Each head judged again gets the
    verdict it got here if it was judged on that final plan, with the same
    budget (no victim search refused for want of one); one judged before a
    later placement, hold or charge was told its verdict on the final plan
    (`final_verdicts`, whose result `admit` checks). More ways to differ:
    gangs placed now may be victims next time (not while min_runtime_s
    keeps them), a placement on held GPUs ends after a reservation's start
    (not under the declared default rule, `Policies.may_use_held` None: the
    told reservation stands, and its changed count of free GPUs is no reason
    to tell it again), a preemption or a preemptor's start moves
    `freed_seq` (its reservations are planned again), and a free reservation
    goes to a head blocked by capacity (none left over, or reservations
    chosen in the loop, where this cycle gave them). And the heads looked at
    first must be the next cycle's holders -- each placed or holding; a
    reservation given in the loop makes the next cycle look at its holder
    first, which only changes a queue's count of blocked heads, so it matters
    only for a queue that ran out of heads -- or a queue's count of blocked
    heads differs, or the cycle stopped at its placement cap (the next one goes on). Strict mode in the simulator checks every use of it.
    """
    c, plan = adm.c, adm.plan
    if adm.cert.out_of_searches or adm.cert.capped or (adm.placed and c.state.config.min_runtime_s <= 0):
        return False
    if adm.cert.through_hold and c.policies.may_use_held is not None:
        return False  # another rule may let a gang outlast a reservation's start: it is planned again
    if plan.victims or any(c.state.jobs[p.job_id].earmark for p in adm.placed):
        return False  # folded, these move freed_seq: told reservations are planned again
    if adm.cert.holders_differ:
        return False
    if adm.cert.loop_holds and any(n >= c.policies.heads_per_queue - 1 for n in adm.cert.blocked_heads.values()):
        # The next cycle looks at the new holders first, so their queues' lines count one
        # blocked head fewer: only a queue that ran out of heads sees a difference. Otherwise
        # the same heads are judged on the same final plan (blocked ones only see fewer free
        # GPUs, charges move no verdict but the order, and `final_verdicts` told them).
        return False
    pol = c.policies
    return len(plan.holds) >= pol.reservations or pol.reservation_order is None or not adm.cert.capacity_blocked


def final_verdicts(adm: AdmitContext) -> bool:
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
    reason, reached as `heads.judge` reaches it. False if some head's verdict
    could not be re-derived so (it keeps the one it got; admission is not complete).
    """
    c, plan = adm.c, adm.plan
    final = (plan.version, plan.charges)
    stale = [(job, q) for version, charges, job, q in adm.cert.blocked if (version, charges) != final]
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
        req = adm.request(job)
        key = (queue, shape_of(req), job.spec.gpu_model)
        if key not in alike:
            alike[key] = _final_verdict(adm, job, queue, req)
        verdict = alike[key]
        if verdict is None:
            settled = False
        else:
            adm.outcomes[job.job_id] = verdict
    return settled


def _final_verdict(adm: AdmitContext, job: Job, queue: str, req: GangRequest) -> Outcome | None:
    """A blocked head's verdict on the final plan (see `final_verdicts`), or None if it may be another."""
    plan = adm.plan
    if plan.owed(queue, req.gpus):
        return None
    return blocked_verdict(adm, job, queue, req, plan.index(req.cls), plan.limit_blocker(queue, req.gpus))
