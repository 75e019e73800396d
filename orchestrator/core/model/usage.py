"""Queue accounting shared by evolve (charging) and decide (shares, limits).

Usage is charged to the queue a job resolved to when it was reserved, and to
every ancestor's `tree_gpus`, so a limit check is one walk up the parents.
Decayed usage integrates GPUs over time with an exponential half-life; the
closed form below keeps it exact however irregular the events are.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from orchestrator.core.model.state import ClusterState, Queue, Usage

#: Deepest queue hierarchy walked; deeper (or cyclic) parent chains are cut here.
MAX_DEPTH = 16

_LN2 = math.log(2.0)


def tree_gpus(state: ClusterState) -> Callable[[str], int]:
    """The fold's per-queue subtree totals, as `first_over_limit` reads them."""
    usage = state.usage

    def held(name: str) -> int:
        u = usage.get(name)
        return u.tree_gpus if u is not None else 0

    return held


def resolve_queue(state: ClusterState, name: str) -> str:
    """The queue a job named `name` runs in: itself, else the default queue, else itself (implicit)."""
    if name in state.queues:
        return name
    default = state.config.default_queue
    if default in state.queues:
        return default
    return name


def ancestors(queues: dict[str, Queue], name: str) -> list[str]:
    """`name` and its parents, child first; stops at unknown parents and cycles."""
    chain = [name]
    q = queues.get(name)
    while q is not None and q.parent is not None and q.parent not in chain and len(chain) < MAX_DEPTH:
        chain.append(q.parent)
        q = queues.get(q.parent)
    return chain


def decayed_at(u: Usage, now: float, half_life_s: float) -> float:
    """GPU-seconds integral as of `now`: decayed with the half-life (plain when it is 0)."""
    dt = max(0.0, now - u.at)
    if half_life_s <= 0:
        return u.decayed + u.gpus * dt
    f = math.exp(-_LN2 * dt / half_life_s)
    return u.decayed * f + u.gpus * (half_life_s / _LN2) * (1.0 - f)


def average_gpus(u: Usage, now: float, half_life_s: float) -> float:
    """Decayed usage in GPUs: what a queue holding g GPUs forever converges to (g)."""
    if half_life_s <= 0:
        return float(u.gpus)
    return decayed_at(u, now, half_life_s) * _LN2 / half_life_s


def charge(state: ClusterState, queue: str, delta: int, at: float) -> None:
    """Add `delta` GPUs to `queue` (and its ancestors' tree totals) at time `at`."""
    half_life = state.config.fairshare_half_life_s
    usage = state.usage
    for i, name in enumerate(ancestors(state.queues, queue)):
        u = usage.get(name) or Usage(at=at)
        if i == 0:
            usage[name] = Usage(
                gpus=u.gpus + delta,
                tree_gpus=u.tree_gpus + delta,
                decayed=decayed_at(u, at, half_life),
                at=max(u.at, at),
            )
        else:
            usage[name] = Usage(gpus=u.gpus, tree_gpus=u.tree_gpus + delta, decayed=u.decayed, at=u.at)


def recompute_trees(state: ClusterState) -> None:
    """Rebuild every `tree_gpus` after the hierarchy changed (rare: QueueDefined)."""
    totals: dict[str, int] = {}
    for name, u in state.usage.items():
        for a in ancestors(state.queues, name):
            totals[a] = totals.get(a, 0) + u.gpus
    # Dict order, never set order: snapshots must not depend on string hashing.
    for name in [*state.usage, *(n for n in totals if n not in state.usage)]:
        u = state.usage.get(name) or Usage()
        t = totals.get(name, 0)
        if u.tree_gpus != t or name not in state.usage:
            state.usage[name] = Usage(gpus=u.gpus, tree_gpus=t, decayed=u.decayed, at=u.at)


def first_over_limit(
    queues: dict[str, Queue], held: Callable[[str], int], queue: str, extra: int
) -> tuple[str, int, int] | None:
    """(name, limit, held) of the first queue in `queue`'s chain that `extra` more GPUs would overflow.

    `held(name)` is the GPUs a queue's subtree holds: the fold's tree totals,
    decide's tentative ones, or 0 to ask "even when idle".
    """
    for name in ancestors(queues, queue):
        q = queues.get(name)
        if q is None or q.limit_gpus is None:
            continue
        used = held(name)
        if used + extra > q.limit_gpus:
            return name, q.limit_gpus, used
    return None
