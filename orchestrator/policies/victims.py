"""Preemption and reclaim: which running gangs make room for a pending one.

Two reasons to preempt, both only of `preemptible` gangs that have run for at
least the cluster's min_runtime_s (doubled with each earlier stop) and were
stopped fewer than STOPS_MAX times:

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

Preemption pays for itself (issue #20). Inside a level the cheapest victim
goes first: `victim_cost` = the GPU-seconds it would lose (its GPUs x its
attempt's run time since its newest checkpoint -- what the log cannot vouch
for -- plus a restart, RESTART_COST_S per GPU) times one plus the times it was already
stopped. So a reclaim for a 1-GPU job stops a
borrower that has run a few minutes, not a 1-GPU job that has run for hours,
and a job stopped before costs double, triple... Its protection grows too:
an attempt may be preempted only after `protected_for` = min_runtime_s x 2^k
(k = earlier stops) -- before, one job was preempted 30 times, each attempt
cut just after min_runtime_s by a single 1-GPU job of another queue.

It is also cheap in GPUs. The order alone does not look at where a
candidate runs or how big it is, so a 4x8 job could stop a 128-GPU gang --
all of its GPUs lose their work since the checkpoint, and it waits hours for
16 free nodes again -- where four 8-GPU gangs would have made room. So a
second set is built node by node (`_by_nodes`) among the candidates of the
levels the first set reached (for the default rule: the same class and
priorities -- never a more important victim): each step frees the node that
costs the fewest GPUs to host one more rank. The set with the lower cost
(lost work, then GPUs stopped) is taken (ties: the ordered one). Measured in
bench/RESULTS.md ("Big gangs, session 7"): half the GPU-hours lost to
preemption.

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

Bounded thrash of one job by third parties (not a back-and-forth, which the
proof above excludes, but a stream of different preemptors). A job stopped
k times is preemptible only after its attempt ran min_runtime_s x 2^k, and
it is the costlier victim by a factor k + 1 beside any other of its level.
So in a window of T seconds a job is preempted at most
1 + log2(T / min_runtime_s) times, each attempt runs at least as long as all
earlier ones together, and the work it loses per stop is at most what the
next attempt is protected for. With min_runtime_s = 600 s a fourth
preemption would need an attempt of 80 min -- and there is none: a job
stopped STOPS_MAX (3) times is no longer a victim (issue #29), of this rule
or of the starvation bound's. Tested by
`test_protection_doubles_with_each_preemption` and
`test_reclaim_stops_the_borrower_with_less_work_at_risk` in
tests/core/test_victims.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from operator import attrgetter
from typing import Any, NamedTuple

from orchestrator.core.model.capacity import FreeIndex
from orchestrator.core.model.plan import QueueLoad
from orchestrator.core.model.topology import ROOT
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
    #: Times it was already stopped and put back in line (preempted or requeued): its attempts - 1 - gang restarts.
    interruptions: int = 0
    #: GPU-seconds a stop now would throw away: its GPUs x the time since this attempt started,
    #: less what its newest checkpoint of this attempt holds (the work the log cannot vouch for).
    at_risk: float = 0.0
    #: When this attempt is expected to end by its time limit (math.inf: no limit): its remaining time is this - now.
    expected_end: float = math.inf


#: Stops after which a job is no longer a victim of the default rule or of the starvation bound: it
#: runs to its end like a non-preemptible one (issue #29: <= 3 preemptions per job; the doubling
#: protection alone let a job be stopped 6 times once the starvation bound stopped gangs too).
STOPS_MAX = 3

#: What any stop costs a GPU besides the work lost: the restart, reloading the checkpoint, the
#: rendezvous (the simulator charges 120 s; real jobs minutes). Without it a gang that has just
#: started looks free to stop, whatever its size: a 4x8 gang would go for an 8-GPU preemptor.
RESTART_COST_S = 300.0


def victim_cost(c: Candidate) -> float:
    """What stopping `c` costs: the work it would lose plus a restart per GPU, times one plus its earlier stops."""
    return (c.at_risk + c.gpus * RESTART_COST_S) * (1 + c.interruptions)


def protected_for(min_runtime_s: float, interruptions: int) -> float:
    """How long an attempt runs before it may be preempted: min_runtime_s, doubled with each earlier stop."""
    return min_runtime_s * float(1 << min(interruptions, 16))


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
    """"priority" or "reclaim" if `ask` may preempt `c`, else None.

    (Who `ask` may stop at all is asked first: most candidates of a search fail there, and it is
    the cheaper question -- every search asks it of every running gang, #34.)
    """
    if c.queue == ask.queue:
        if c.priority >= ask.priority:
            return None
        kind = "priority"
    else:
        load = loads.get(c.queue)
        if not ask.owed or load is None or load.gpus <= load.guaranteed:
            return None
        kind = "reclaim"
    if (not c.preemptible or c.gpus <= 0 or c.interruptions >= STOPS_MAX
            or ask.now - c.started_at < protected_for(ask.min_runtime_s, c.interruptions)):
        return None
    return kind


def victim_order(ask: PreemptionAsk) -> Callable[[Candidate], tuple[int, int, float, float, str]]:
    """Other queues' borrowers first, then lowest priority, then the cheapest (`victim_cost`), newest start, id."""

    def key(c: Candidate) -> tuple[int, int, float, float, str]:
        return (0 if c.queue != ask.queue else 1, c.priority, victim_cost(c), -c.started_at, c.job_id)

    return key


ReasonFn = Callable[[PreemptionAsk, Candidate, Mapping[str, QueueLoad]], str | None]
OrderFn = Callable[[PreemptionAsk], Callable[[Candidate], tuple[Any, ...]]]


def victim_level(ask: PreemptionAsk) -> Callable[[Candidate], tuple[int, int]]:
    """Victims alike in importance: other queues' borrowers or not, and priority."""

    def key(c: Candidate) -> tuple[int, int]:
        return (0 if c.queue != ask.queue else 1, c.priority)

    return key


class PreemptionRule(NamedTuple):
    """Who may preempt whom (`reason`: why, or None), and which victims go first (`order`)."""

    reason: ReasonFn
    order: OrderFn
    #: The admission stage may skip a search when no candidate has a lower priority in the
    #: preemptor's queue and none can be reclaimed: true only of rules that need one of those.
    priority_or_reclaim_only: bool = False
    #: Candidates of one level are alike to the rule (a prefix of `order`'s levels): the search
    #: may stop the ones that cost fewest GPUs among the levels it reached. None: `order` alone.
    level: OrderFn | None = None
    #: Whether `reason`, `order` or `level` read the preemptor's attained service (`PreemptionAsk.attained`):
    #: False lets admission give a gang the answer of an alike one whose attained service differs
    #: (core/heads.py `_starving_at_limit`, with `find_victims`, which reads it only through the rule).
    reads_attained: bool = True
    #: What of the ask `reason` reads, as a key (None: anything): admission keeps the candidates the rule
    #: allows per such key for a cycle, and skips a `find_victims` search that they cannot satisfy
    #: (none, or too few to bring the preemptor's queue within its limits: core/context.py `victim_pool`).
    reason_reads: Callable[[PreemptionAsk], tuple[object, ...]] | None = None
    #: A search that found no victims finds none again this cycle for an alike ask (gang shape, queue,
    #: attained service) of no higher priority, so `core/preemption.py` may remember it as it does for
    #: `priority_or_reclaim_only` rules (true of rules whose victims only shrink with the ask's priority).
    monotone: bool = False


PRIORITY_AND_RECLAIM = PreemptionRule(why_preemptible, victim_order, priority_or_reclaim_only=True,
                                      level=victim_level)

#: The starvation bound's cap is the same as the default rule's (`STOPS_MAX`).
STARVATION_STOPS_MAX = STOPS_MAX


def why_starvation_victim(ask: PreemptionAsk, c: Candidate, loads: Mapping[str, QueueLoad]) -> str | None:
    """"starvation" if a starving gang (`ask`, core/starving.py) may stop `c`, else None.

    Any preemptible gang of no higher priority, in a queue at or above its
    guarantee (find_victims never takes one below it), protected as the
    default rule protects (`protected_for`, doubling with each stop), and
    stopped fewer than STARVATION_STOPS_MAX times before.

    Anti-thrash. Let P (starving) stop V. V rejoins its line now, so it
    starves again only a whole bound later; by priority it cannot take P
    back (priority(V) <= priority(P), and priority preemption needs strictly
    lower), nor by reclaim (V's queue stayed at or above its guarantee, so it
    is owed nothing: the argument of the module docstring). And each job is
    stopped by the bound fewer than STARVATION_STOPS_MAX times, after attempts
    each protected twice as long as the one before.
    """
    if not c.preemptible or c.gpus <= 0 or c.priority > ask.priority or c.interruptions >= STOPS_MAX:
        return None
    if ask.now - c.started_at < protected_for(ask.min_runtime_s, c.interruptions):
        return None
    load = loads.get(c.queue)
    if load is None or load.gpus < load.guaranteed:
        return None
    return "starvation"


def cheapest_first(ask: PreemptionAsk) -> Callable[[Candidate], tuple[float, float, str]]:
    """The victim that loses least first (`victim_cost`: work since its checkpoint, restarts), newest start, id."""
    del ask

    def key(c: Candidate) -> tuple[float, float, str]:
        return (victim_cost(c), -c.started_at, c.job_id)

    return key


def _one_level(ask: PreemptionAsk) -> Callable[[Candidate], tuple[int]]:
    """Every starvation victim is alike in importance: the node-by-node search may pick among all."""
    del ask
    return lambda c: (0,)


def _starvation_reads(ask: PreemptionAsk) -> tuple[object, ...]:
    """What `why_starvation_victim` reads of the ask."""
    return (ask.priority, ask.now, ask.min_runtime_s)


#: The rule of the starvation bound: who a starving gang may stop, cheapest first.
STARVATION = PreemptionRule(why_starvation_victim, cheapest_first, level=_one_level, reads_attained=False,
                            reason_reads=_starvation_reads)


@lru_cache(maxsize=8)
def longest_remaining_first(loss_per_gpu_s: float) -> PreemptionRule:
    """The starvation bound's rule, victims that lose little first and among them the longest remaining.

    Issue #42 (`Policies.starvation_longest_first_s`): a victim that just checkpointed loses little
    whichever it is, but a short job near its end that is stopped re-waits and finishes much later,
    while a long one would hold its GPUs long anyway (SRPT's choice). Victims losing at most
    `loss_per_gpu_s` per GPU (`victim_cost` / GPUs) go first, latest expected end first; the others
    after them, cheapest first. Only the ordered set is taken (no `level`: the node-by-node search
    compares lost work only, which would undo the order).
    """

    def order(ask: PreemptionAsk) -> Callable[[Candidate], tuple[int, float, float, str]]:
        del ask

        def key(c: Candidate) -> tuple[int, float, float, str]:
            cost = victim_cost(c)
            if cost <= loss_per_gpu_s * c.gpus:
                return (0, -c.expected_end, -c.started_at, c.job_id)
            return (1, cost, -c.started_at, c.job_id)

        return key

    # Who may be stopped is STARVATION's (`why_starvation_victim`), and the order reads candidates only: the
    # same declarations, so admission's shortcuts for starving gangs hold for it too (core/heads.py).
    return PreemptionRule(why_starvation_victim, order, reads_attained=False, reason_reads=_starvation_reads)


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

    The ordered set, or -- for a rule with a `level` -- the node-by-node one if
    it stops fewer GPUs (see the module docstring). Whatever the rule, a
    victim of another queue is never taken below its guarantee.
    """
    pool = sorted((c for c in candidates if rule.reason(ask, c, loads)), key=rule.order(ask))
    if not pool or not _could_fit(ask, pool, index, fits, quota_ok):
        return None
    idx = index.copy()
    removed: list[Candidate] = []
    taken: dict[str, int] = {}
    need = ask.req.gpus
    for c in pool:
        if _below_guarantee(ask, c, loads, taken):
            continue
        _give(idx, c)
        removed.append(c)
        taken[c.queue] = taken.get(c.queue, 0) + c.gpus
        # Cheap necessary condition first: enough free GPUs at all.
        if idx.free_gpus(ROOT) >= need and fits(ask.req, idx) and quota_ok(removed):
            break
    else:
        return None
    removed = _pruned(ask, removed, idx, fits, quota_ok)
    if rule.level is not None and (len(removed) > 1 or removed[0].gpus > ask.req.gpus):
        level = rule.level(ask)
        top = max(level(c) for c in removed)
        cheaper = _by_nodes(ask, [c for c in pool if level(c) <= top], index, loads, fits, quota_ok)
        if cheaper is not None and _set_cost(cheaper) < _set_cost(removed):
            return cheaper
    return removed


def _set_cost(victims: Sequence[Candidate]) -> tuple[float, int]:
    """A victim set's lost work (weighted by earlier stops), then the GPUs it stops."""
    return sum(victim_cost(c) for c in victims), sum(c.gpus for c in victims)


def _below_guarantee(ask: PreemptionAsk, c: Candidate, loads: Mapping[str, QueueLoad], taken: dict[str, int]) -> bool:
    """Stopping `c` too would push its (other) queue below its guarantee."""
    if c.queue == ask.queue:
        return False
    load = loads[c.queue]
    return load.gpus - taken.get(c.queue, 0) - c.gpus < load.guaranteed


def _pruned(ask: PreemptionAsk, removed: list[Candidate], idx: FreeIndex, fits: FitsFn,
            quota_ok: Callable[[Sequence[Candidate]], bool]) -> list[Candidate]:
    """Add back each victim but the last, newest removal first, if the gang still fits without it (`idx`: all gone)."""
    for c in reversed(removed[:-1]):
        _take(idx, c)
        rest = [x for x in removed if x is not c]
        if fits(ask.req, idx) and quota_ok(rest):
            removed = rest
        else:
            _give(idx, c)
    return removed


def _by_nodes(
    ask: PreemptionAsk,
    pool: list[Candidate],
    index: FreeIndex,
    loads: Mapping[str, QueueLoad],
    fits: FitsFn,
    quota_ok: Callable[[Sequence[Candidate]], bool],
) -> list[Candidate] | None:
    """Victims chosen node by node: each step makes room for one more rank where that stops the fewest GPUs.

    On a node, the smallest candidates go first until a rank's GPUs are free
    there; a gang stops whole, so its size counts however few of its GPUs
    the node gets. Between nodes that cost the same, the one whose victims
    come first in the rule's order. Steps repeat until the gang fits (and quota allows), at
    most twice as many as it has ranks; then the set is pruned like the
    ordered one. None if it does not fit by then: the ordered set stands.
    """
    g = ask.req.gpus_per_rank
    if g <= 0:
        return None
    on: dict[str, list[tuple[Candidate, int]]] = {}  # node -> (candidate, its GPUs there), smallest first
    free = index.free
    for c in sorted(pool, key=attrgetter("gpus")):  # (stable: pool order among equal sizes)
        if len(c.placement) == 1:
            rp = c.placement[0]
            if rp.node_id in free:
                on.setdefault(rp.node_id, []).append((c, len(rp.gpus)))
            continue
        here: dict[str, int] = {}
        for rp in c.placement:
            here[rp.node_id] = here.get(rp.node_id, 0) + len(rp.gpus)
        for node, n in here.items():
            if node in free:
                on.setdefault(node, []).append((c, n))
    pos = {c.job_id: i for i, c in enumerate(pool)}  # equal costs: the rule's order decides
    idx = index.copy()
    removed: list[Candidate] = []
    gone: set[str] = set()
    taken: dict[str, int] = {}
    for _ in range(2 * ask.req.ranks + 1):  # (a required domain may cost a few steps more than ranks)
        if idx.free_gpus(ROOT) >= ask.req.gpus and fits(ask.req, idx) and quota_ok(removed):
            return _pruned(ask, removed, idx, fits, quota_ok) if removed else None  # (it needs no victims)
        best: tuple[int, int, list[Candidate]] | None = None  # (GPUs stopped, first in pool order, victims)
        for node, gangs in on.items():
            want = g - len(idx.free[node]) % g  # GPUs to free here for one more rank
            picked: list[Candidate] = []
            cost = got = 0
            also = taken  # copied before the first other queue's victim counts on it
            for c, n in gangs:
                if c.job_id in gone or _below_guarantee(ask, c, loads, also):
                    continue
                picked.append(c)
                if c.queue != ask.queue:
                    also = dict(also) if also is taken else also
                    also[c.queue] = also.get(c.queue, 0) + c.gpus
                cost += c.gpus
                got += n
                if got >= want or (best is not None and cost > best[0]):
                    break
            if got >= want:
                found = (cost, min(pos[c.job_id] for c in picked), picked)
                if best is None or found[:2] < best[:2]:
                    best = found
        if best is None:
            return None
        for c in best[2]:
            _give(idx, c)
            removed.append(c)
            gone.add(c.job_id)
            taken[c.queue] = taken.get(c.queue, 0) + c.gpus
    return None
