"""Preemption and reclaim: which running gangs make room for a pending one.

Two reasons to preempt, both only of `preemptible` gangs that have run for at
least the cluster's min_runtime_s:

* priority -- a pending job may preempt strictly lower-priority gangs of its
  own queue;
* reclaim -- a queue that stays within its guarantee with this job may take
  GPUs back from other queues that hold more than their guarantee
  (borrowers), never pushing one below its guarantee.

The victim set is minimal in Kueue's sense: candidates are ordered (other
queues' borrowers first, then lowest priority, then newest start, then id),
removed one by one until the gang fits topology-feasibly (and within quota),
then each removed one except the last is added back, newest removal first,
if the gang still fits without it.

Anti-thrash: a preemption never lets its victim preempt the preemptor back.
(This is the default rule, `PRIORITY_AND_RECLAIM`. Another `PreemptionRule`
in `Policies.preemption` -- least attained service, below -- states its own.)

Proof. Let P (queue Q) preempt V (queue W).
(1) Priority, Q == W: priority(V) < priority(P). For V to preempt P back by
    priority it would need priority(P) < priority(V): contradiction. V cannot
    reclaim from its own queue (reclaim only takes from *other* queues).
(2) Reclaim, Q != W: P is admitted only if usage(Q) + gpus(P) <= guarantee(Q),
    so after P runs Q holds at most its guarantee and is not a borrower. V
    could take P back only by reclaim (P is in another queue), which needs a
    borrower victim: Q is none. Moreover W kept usage(W) >= guarantee(W)
    after losing V, so W asking for V's gpus(V) > 0 has
    usage(W) + gpus(V) > guarantee(W): W is not owed anything and may not
    reclaim at all.
Both cases compare only current GPU counts and priorities, never decayed
usage or time, so the argument holds at every later log position until
usage changes by other jobs' admissions -- which are then new decisions,
each under the same rules. Tested by `test_anti_thrash` in tests/core.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from orchestrator.core.capacity import FreeIndex
from orchestrator.core.plan import QueueLoad
from orchestrator.core.topology import ROOT
from orchestrator.policies.placement import GangRequest
from schemas.events import RankPlacement

FitsFn = Callable[[GangRequest, FreeIndex], bool]


class Candidate(NamedTuple):
    """A running gang that could give its GPUs back."""

    job_id: str
    attempt: int
    queue: str
    priority: int
    preemptible: bool
    started_at: float
    gpus: int
    placement: tuple[RankPlacement, ...]
    #: GPU-seconds it has held GPUs so far, this attempt included (state.attained_service).
    attained: float = 0.0


class PreemptionAsk(NamedTuple):
    req: GangRequest
    queue: str
    priority: int
    #: The preemptor's queue stays within its guarantee with this job (it may reclaim).
    owed: bool
    now: float
    min_runtime_s: float
    #: GPU-seconds the preemptor has held GPUs in earlier attempts.
    attained: float = 0.0


def why_preemptible(ask: PreemptionAsk, c: Candidate, loads: Mapping[str, QueueLoad]) -> str | None:
    """"priority" or "reclaim" if `ask` may preempt `c`, else None."""
    if not c.preemptible or c.gpus <= 0 or ask.now - c.started_at < ask.min_runtime_s:
        return None
    if c.queue == ask.queue:
        return "priority" if c.priority < ask.priority else None
    load = loads.get(c.queue)
    if ask.owed and load is not None and load.gpus > load.guaranteed:
        return "reclaim"
    return None


def victim_order(ask: PreemptionAsk) -> Callable[[Candidate], tuple[int, int, float, str]]:
    """Other queues' borrowers first, then lowest priority, then newest start, then id."""

    def key(c: Candidate) -> tuple[int, int, float, str]:
        return (0 if c.queue != ask.queue else 1, c.priority, -c.started_at, c.job_id)

    return key


ReasonFn = Callable[[PreemptionAsk, Candidate, Mapping[str, QueueLoad]], str | None]
OrderFn = Callable[[PreemptionAsk], Callable[[Candidate], tuple[Any, ...]]]


class PreemptionRule(NamedTuple):
    """Who may preempt whom (`reason`: why, or None), and which victims go first (`order`)."""

    reason: ReasonFn
    order: OrderFn
    #: The admission stage may skip a search when no candidate has a lower priority in the
    #: preemptor's queue and none can be reclaimed: true only of rules that need one of those.
    priority_or_reclaim_only: bool = False


PRIORITY_AND_RECLAIM = PreemptionRule(why_preemptible, victim_order, priority_or_reclaim_only=True)


def _give(idx: FreeIndex, c: Candidate) -> None:
    for rp in c.placement:
        idx.give(rp.node_id, rp.gpus)


def _take(idx: FreeIndex, c: Candidate) -> None:
    for rp in c.placement:
        idx.take(rp.node_id, rp.gpus)


def _could_fit(
    ask: PreemptionAsk,
    pool: list[Candidate],
    index: FreeIndex,
    fits: FitsFn,
    quota_ok: Callable[[Sequence[Candidate]], bool],
) -> bool:
    """Would the gang fit with every candidate gone? If not, no victim set exists: skip the search.

    (Every valid victim set is a subset of the pool, and fitting only gets easier with more GPUs.)
    """
    if not quota_ok(pool):
        return False
    idx = index.copy()
    for c in pool:
        _give(idx, c)
    return idx.free_gpus(ROOT) >= ask.req.gpus and fits(ask.req, idx)


def find_victims(
    ask: PreemptionAsk,
    candidates: Sequence[Candidate],
    index: FreeIndex,
    loads: Mapping[str, QueueLoad],
    fits: FitsFn,
    quota_ok: Callable[[Sequence[Candidate]], bool],
    rule: PreemptionRule = PRIORITY_AND_RECLAIM,
) -> list[Candidate] | None:
    """A minimal set of victims after which `ask` fits (and stays within quota), or None.

    Whatever the rule, a victim of another queue is never taken below its guarantee.
    """
    pool = sorted((c for c in candidates if rule.reason(ask, c, loads)), key=rule.order(ask))
    if not pool or not _could_fit(ask, pool, index, fits, quota_ok):
        return None
    idx = index.copy()
    removed: list[Candidate] = []
    taken: dict[str, int] = {}
    need = ask.req.gpus
    for c in pool:
        if c.queue != ask.queue:
            load = loads[c.queue]
            if load.gpus - taken.get(c.queue, 0) - c.gpus < load.guaranteed:
                continue  # would push the victim's queue below its guarantee
        _give(idx, c)
        removed.append(c)
        taken[c.queue] = taken.get(c.queue, 0) + c.gpus
        # Cheap necessary condition first: enough free GPUs at all.
        if idx.free_gpus(ROOT) >= need and fits(ask.req, idx) and quota_ok(removed):
            break
    else:
        return None
    for c in reversed(removed[:-1]):
        _take(idx, c)
        rest = [x for x in removed if x is not c]
        if fits(ask.req, idx) and quota_ok(rest):
            removed = rest
        else:
            _give(idx, c)
    return removed
