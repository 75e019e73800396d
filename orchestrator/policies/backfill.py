"""Backfill: a blocked gang holds the GPUs it will start on.

A holder (a queue head blocked by capacity, not by quota, chosen as
core/reservations.py says and kept until it starts; `Policies.reservations` of them) gets a reservation
at the earliest time enough GPUs free up: running gangs are released in order
of their expected end (start + time limit; gangs without a limit never end in
this estimate, so they come last, oldest first) until the head fits
topology-feasibly; the placement it would get then is the reservation, and
its time the latest expected end among the gangs released. Its GPUs that are
free now are held: later jobs may use them only if their own time limit ends
before the reservation (before every reservation, when there are several).
Every other GPU stays open to everyone. So a 64-GPU gang accumulates the GPUs
it waits for instead of losing each freed one to a stream of small jobs. A
second holder is planned the same way, except that GPUs the first will start
on never come free for it (core/reservations.py filters them out of the running gangs).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from orchestrator.core.model.capacity import FreeIndex
from orchestrator.core.model.plan import Hold
from orchestrator.core.model.state import Job
from orchestrator.core.model.topology import ROOT
from orchestrator.policies import placement
from orchestrator.policies.placement import GangRequest, LinksOf, Placement
from schemas.events import RankPlacement

FitsFn = Callable[[GangRequest, FreeIndex], bool]
PlaceFn = Callable[[GangRequest, FreeIndex, LinksOf], Placement | None]


class Ending(NamedTuple):
    """A running gang and when it is expected to free its GPUs."""

    job_id: str
    ends_at: float
    started_at: float
    placement: tuple[RankPlacement, ...]


def earliest_start(
    req: GangRequest,
    index: FreeIndex,
    ending: Iterable[Ending],
    fits: FitsFn,
    place: PlaceFn,
    links_of: LinksOf,
) -> Hold | None:
    """The reservation for the blocked head `req`, or None if it never fits.

    `ending` comes in order of expected end (the caller's order; read only as far as needed).
    Gangs are released in that order until the head fits; after each, `fits` and
    `place` are asked only if enough GPUs and enough whole ranks are free. A call
    typically releases 15-30 gangs before that holds, and giving each one's GPUs
    back to a copied index (histograms per domain) was about 40% of the call, so
    a first pass counts on plain per-node sets (`_released_until_enough`) and the
    index is updated once, where the counts first suffice: the state the
    gang-by-gang loop (`_release`, which takes over from there) would be in, so
    the answer is the same.
    """
    endings = iter(ending)
    if req.gpus_per_rank <= 0:  # CPU-only ranks: nothing to count
        return _release(req, index.copy(), -math.inf, endings, fits, place, links_of)
    found = _released_until_enough(req, index, endings)
    if found is None:
        return None
    idx, until = found
    hold = _ask(req, idx, until, fits, place, links_of)
    return hold if hold is not None else _release(req, idx, until, endings, fits, place, links_of)


_NO_GPUS: frozenset[int] = frozenset()


def _released_until_enough(req: GangRequest, index: FreeIndex, endings: Iterator[Ending]) -> tuple[FreeIndex, float] | None:
    """Read endings until the free GPUs and whole ranks (root of `index`) first suffice for `req`.

    Returns a copy of `index` with every GPU read given back, and the latest end
    read; None if the endings run out first. The counts are exactly the index's
    (`give` semantics: only eligible GPUs of indexed nodes, a GPU freed twice
    counts once). An index outside what the counts mirror (a free GPU listed
    twice, more free GPUs than its width) is given back gang by gang instead.
    """
    g = req.gpus_per_rank
    free, eligible, top = index.free, index.eligible, index.width - 1
    gpus, ranks = index.free_gpus(ROOT), index.capacity(ROOT, g, sys.maxsize)
    need_gpus, need_ranks = req.gpus, req.ranks
    grown: dict[str, set[int]] = {}  # node touched -> its free GPUs so far
    read: list[Ending] = []
    until = -math.inf
    for e in endings:
        if e.ends_at > until:  # max(until, e.ends_at), NaN and all
            until = e.ends_at
        read.append(e)
        odd = False
        for rp in e.placement:
            node = rp.node_id
            have = grown.get(node)
            if have is None:
                cur = free.get(node)
                if cur is None:  # not indexed
                    continue
                have = grown[node] = set(cur)
                if len(have) != len(cur):
                    odd = True
                    break
            before = len(have)
            if eligible is None:
                have.update(rp.gpus)
            else:
                allowed = eligible.get(node, _NO_GPUS)
                have.update(x for x in rp.gpus if x in allowed)
            after = len(have)
            if after != before:
                if after > top:
                    odd = True
                    break
                gpus += after - before
                ranks += after // g - before // g
        if odd:
            idx = index.copy()
            for r in read:
                for rp in r.placement:
                    idx.give(rp.node_id, rp.gpus)
            return idx, until
        if gpus >= need_gpus and ranks >= need_ranks:
            idx = index.copy()
            for node, have in grown.items():
                if len(have) != len(free[node]):  # the state `give` leaves, whatever the order
                    if eligible is None:
                        idx.reset(node, tuple(sorted(have)))
                    else:
                        idx.give(node, have)
            return idx, until
    return None


def _ask(req: GangRequest, idx: FreeIndex, until: float, fits: FitsFn, place: PlaceFn, links_of: LinksOf) -> Hold | None:
    # Cheap necessary conditions first: enough GPUs at all, then enough whole ranks.
    if idx.free_gpus(ROOT) < req.gpus or idx.capacity(ROOT, req.gpus_per_rank, req.ranks) < req.ranks:
        return None
    # place_gang begins with the very search placement.fits makes (and gives None where it fails): skip the repeat.
    if not (fits is placement.fits and place is placement.place_gang) and not fits(req, idx):
        return None
    p = place(req, idx, links_of)
    return None if p is None else Hold(job_id=req.job_id, until=until, ranks=p.ranks)


def _release(
    req: GangRequest, idx: FreeIndex, until: float, endings: Iterator[Ending], fits: FitsFn, place: PlaceFn, links_of: LinksOf
) -> Hold | None:
    """Give the endings' GPUs back to `idx` one gang at a time, asking after each."""
    for e in endings:
        until = max(until, e.ends_at)
        for rp in e.placement:
            idx.give(rp.node_id, rp.gpus)
        hold = _ask(req, idx, until, fits, place, links_of)
        if hold is not None:
            return hold
    return None


def longest_waiting(job: Job) -> tuple[float, str]:
    """Reservation order: the gang waiting longest (so every gang's turn comes, whatever its queue's share)."""
    return (job.waiting_since, job.job_id)


def may_use_held(ends_at: float, hold: Hold) -> bool:
    """A job may run on held GPUs only if it is sure to end (time limit) before the reservation starts.

    The rule `Policies.may_use_held` None declares (admission then compares with the earliest
    start at once); as a `may_use_held` function it decides the same, asked per reservation.
    """
    return math.isfinite(hold.until) and ends_at <= hold.until
