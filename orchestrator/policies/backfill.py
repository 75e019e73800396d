"""Backfill: a blocked gang holds the GPUs it will start on.

A holder (a queue head blocked by capacity, not by quota, chosen as admit.py
says and kept until it starts; `Policies.reservations` of them) gets a reservation
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
on never come free for it (admit.py filters them out of the running gangs).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import NamedTuple

from orchestrator.core.capacity import FreeIndex
from orchestrator.core.plan import Hold
from orchestrator.core.state import Job
from orchestrator.core.topology import ROOT
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
    """
    idx = index.copy()
    until = -math.inf
    for e in ending:
        until = max(until, e.ends_at)
        for rp in e.placement:
            idx.give(rp.node_id, rp.gpus)
        # Cheap necessary conditions first: enough GPUs at all, then enough whole ranks.
        if idx.free_gpus(ROOT) < req.gpus or idx.capacity(ROOT, req.gpus_per_rank, req.ranks) < req.ranks:
            continue
        if not fits(req, idx):
            continue
        p = place(req, idx, links_of)
        if p is not None:
            return Hold(job_id=req.job_id, until=until, ranks=p.ranks)
    return None


def longest_waiting(job: Job) -> tuple[float, str]:
    """Reservation order: the gang submitted first (so every gang's turn comes, whatever its queue's share)."""
    return (job.submitted_at, job.job_id)


def may_use_held(ends_at: float, hold: Hold) -> bool:
    """A job may run on held GPUs only if it is sure to end (time limit) before the reservation starts."""
    return math.isfinite(hold.until) and ends_at <= hold.until
