"""Stage 4: each queue's line of pending jobs, and a queue's rank in this cycle's fair-share order."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from heapq import merge

from orchestrator.core.cycle import Cycle
from orchestrator.core.model.plan import Plan
from orchestrator.core.model.state import Job, LineKey
from orchestrator.core.model.usage import resolve_queue
from orchestrator.policies.fairshare import JobKey, run_time_tilted
from orchestrator.policies.in_queue_service import LINE_ORDERS

#: A queue's place in the order: (0, waiting since) for a starving head, else (1, `Policies.queue_key`).
Rank = tuple[object, ...]
#: Ranks already computed this cycle, by (queue, plan charges, GPUs its head asks[, its run time: the tilt]).
Ranks = dict[tuple[object, ...], Rank]


class Line:
    """One queue's pending jobs in order, read lazily: a cycle looks at a few heads, not the whole backlog."""

    __slots__ = ("_admissible", "_busy", "_items", "head")

    def __init__(self, items: Iterator[tuple[JobKey, Job]], busy: set[str],
                 admissible: Callable[[Job], bool] | None = None) -> None:
        self._items = items
        self._busy = busy
        #: Asked of each job before it becomes the head (None: all are): a new job the cycle did
        #: not check up front is checked here (reject.Rejecter.admissible).
        self._admissible = admissible
        self.head: tuple[JobKey, Job] | None = None
        self._advance()

    def _advance(self) -> None:
        busy, admissible = self._busy, self._admissible
        for key, job in self._items:
            if job.job_id not in busy and (admissible is None or admissible(job)):
                self.head = (key, job)
                return
        self.head = None

    def pop(self) -> Job:
        assert self.head is not None
        job = self.head[1]
        self._advance()
        return job


def queue_lines(c: Cycle, plan: Plan, admissible: Callable[[Job], bool] | None = None) -> dict[str, Line]:
    """Each queue's line of pending jobs (jobs already decided on this cycle, or not `admissible`, are skipped).

    With the fold's line order (`Policies.job_key` None) the fold's sorted lines
    are read as they are (several spec queue names may resolve to one queue:
    their lines merge); a `job_key` function sorts the backlog once per cycle.
    """
    state, busy = c.state, plan.busy
    key = c.policies.job_key
    if key is None and c.policies.line_order:  # (issue #42, opt-in, off by default: another order inside each queue)
        key = LINE_ORDERS[int(c.policies.line_order) - 1]
    if key is None:
        by_queue: dict[str, list[list[LineKey]]] = {}
        for name, keys in state.lines.items():
            by_queue.setdefault(resolve_queue(state, name), []).append(keys)
        jobs = state.jobs
        return {
            q: Line(((k, jobs[k[-1]]) for k in (ks[0] if len(ks) == 1 else merge(*ks))), busy, admissible)
            for q, ks in by_queue.items()
        }
    custom: dict[str, list[tuple[JobKey, Job]]] = {}
    for jid in state.pending:
        if jid in state.gated:
            continue  # held, waiting for other jobs or an array slot: in no line (core/gating.py)
        job = state.jobs[jid]
        custom.setdefault(resolve_queue(state, job.spec.queue), []).append((key(job), job))
    return {q: Line(iter(sorted(items, key=lambda kj: kj[0])), busy, admissible) for q, items in custom.items()}


def queue_rank(c: Cycle, plan: Plan, queue: str, line: Line, ranks: Ranks) -> Rank:
    """A queue's place in this cycle's order: its head's age once it starves, else the fair-share key.

    Aging, as in Slurm's multifactor priority: a head pending longer than
    `Policies.starving_after_s` goes before every queue in fair-share order,
    oldest first, so a heavy queue's gang does not wait on light queues'
    streams of small jobs forever.
    """
    assert line.head is not None
    head = line.head[1]
    aging = c.policies.starving_after_s
    if aging < math.inf and c.now - head.waiting_since > aging:  # (off by default: no wait to compute)
        return (0, head.waiting_since)
    # A queue's load changes only with a charge: its key is kept until then (per head size).
    asks = head.spec.total_gpus
    pol = c.policies
    tilt = pol.share_tilt
    if tilt > 0.0:  # (issue #42: the head's run time weighs the share; kept per run time too)
        run_h = head.claim / max(1, asks) / pol.share_tilt_unit_s if head.claim_from else 0.0
        tilted = (queue, plan.charges, asks, run_h)
        found = ranks.get(tilted)
        if found is None:
            load = plan.load(queue)._replace(asks=asks)
            if pol.share_tilt_above_mean and load.usage / max(load.weight, 1e-9) < _mean_share(plan, ranks):
                run_h = 0.0  # a queue below the mean weighted share keeps its share: the tilt never sinks it further
            found = ranks[tilted] = (1, run_time_tilted(pol.queue_key(load), run_h, tilt, pol.share_tilt_max))
        return found
    key = (queue, plan.charges, asks)
    found = ranks.get(key)
    if found is None:
        found = ranks[key] = (1, c.policies.queue_key(plan.load(queue)._replace(asks=asks)))
    return found


def _mean_share(plan: Plan, ranks: Ranks) -> float:
    """The top-level queues' usage per weight, over those using GPUs (`Policies.share_tilt_above_mean`; kept per charge)."""
    key = ("", plan.charges, -1)  # (no queue is named "")
    found = ranks.get(key)
    if found is None:
        queues, used, weight = plan.state.queues, 0.0, 0.0
        for name, q in queues.items():
            if q.parent is None and (u := plan.load(name).usage) > 0.0:
                used += u
                weight += q.weight
        found = ranks[key] = (used / weight if weight > 0.0 else 0.0,)
    mean = found[0]
    assert isinstance(mean, float)
    return mean
