"""Which GPUs of one node a gang's ranks get: the set with the best pairwise links.

On an all-to-all NVSwitch box every set is as good as any other and the lowest
indices win. On partial-NVLink boxes (a DGX-1's hybrid cube mesh) it matters:
four GPUs forming an NVLink-connected quad beat four that talk over SYS.
Scores come from `Inventory.links` (see `schemas.inventory.link_score`).
"""

from __future__ import annotations

from functools import lru_cache
from itertools import combinations
from math import comb

Links = tuple[tuple[int, ...], ...]

#: Above this many candidate sets, grow a set greedily instead of trying all.
EXHAUSTIVE_LIMIT = 4096


def _score(links: Links, a: int, b: int) -> int:
    if a < len(links) and b < len(links[a]):
        return links[a][b]
    return 0


def set_score(links: Links, gpus: tuple[int, ...]) -> int:
    """Sum of pairwise link scores inside `gpus`."""
    return sum(_score(links, a, b) for i, a in enumerate(gpus) for b in gpus[i + 1 :])


def _uniform(links: Links, gpus: tuple[int, ...]) -> bool:
    first: int | None = None
    for i, a in enumerate(gpus):
        for b in gpus[i + 1 :]:
            s = _score(links, a, b)
            if first is None:
                first = s
            elif s != first:
                return False
    return True


@lru_cache(maxsize=8192)
def best_gpu_set(free: tuple[int, ...], count: int, links: Links) -> tuple[int, ...]:
    """`count` GPUs of `free` (sorted) maximising the pairwise link score; ties: lexicographically first."""
    if count >= len(free):
        return free
    if count <= 0:
        return ()
    if not links or count == 1 or _uniform(links, free):
        return free[:count]
    if comb(len(free), count) <= EXHAUSTIVE_LIMIT:
        best = free[:count]
        best_score = set_score(links, best)
        for cand in combinations(free, count):
            s = set_score(links, cand)
            if s > best_score:
                best, best_score = cand, s
        return best
    # Greedy: the best pair, then the GPU adding the most link score, until full.
    pair = max(combinations(free, 2), key=lambda p: (_score(links, p[0], p[1]), -p[0], -p[1]))
    chosen = list(pair)
    rest = [g for g in free if g not in chosen]
    while len(chosen) < count:
        g = max(rest, key=lambda c: (sum(_score(links, c, x) for x in chosen), -c))
        chosen.append(g)
        rest.remove(g)
    return tuple(sorted(chosen))


def split_ranks(gpus: tuple[int, ...], per_rank: int, links: Links) -> list[tuple[int, ...]]:
    """Cut a node's chosen GPUs into ranks, each rank's GPUs as well linked as possible."""
    if per_rank <= 0:
        return []
    k = len(gpus) // per_rank
    if k <= 1 or per_rank == 1 or not links or _uniform(links, gpus):
        return [gpus[i * per_rank : (i + 1) * per_rank] for i in range(k)]
    out: list[tuple[int, ...]] = []
    rest = gpus
    for _ in range(k):
        pick = best_gpu_set(rest, per_rank, links)
        out.append(pick)
        rest = tuple(g for g in rest if g not in pick)
    return out
