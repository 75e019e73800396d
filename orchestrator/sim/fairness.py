"""What each queue *should* get, and how evenly the queues got it.

Fair share here is weighted max-min ("water-filling"): capacity is split by
weight among the queues that want GPUs; a queue that asks for less than its
split (or is capped by its limit) keeps only what it asks for, and the rest is
split again among the others. A queue's fair share therefore never exceeds
its demand, so an idle team does not make a busy scheduler look unfair.

Jain's index over the queues' ratios received / fair share is 1 when every
queue got the same fraction of its fair share, and 1/n when one got it all.
"""

from __future__ import annotations

from collections.abc import Sequence


def water_fill(demand: Sequence[float], weights: Sequence[float], capacity: float,
               limits: Sequence[float | None] | None = None) -> list[float]:
    """Weighted max-min fair allocation of `capacity` to queues asking for `demand`."""
    n = len(demand)
    want = [max(0.0, d if limits is None or limits[i] is None else min(d, limits[i] or 0.0)) for i, d in enumerate(demand)]
    out = [0.0] * n
    active = [i for i in range(n) if want[i] > 0 and weights[i] > 0]
    left = float(capacity)
    while active and left > 1e-9:
        total_w = sum(weights[i] for i in active)
        # Queues whose remaining want is below their weighted split are satisfied first.
        satisfied = [i for i in active if want[i] - out[i] <= left * weights[i] / total_w]
        if not satisfied:
            for i in active:
                out[i] += left * weights[i] / total_w
            break
        for i in satisfied:
            left -= want[i] - out[i]
            out[i] = want[i]
        active = [i for i in active if i not in satisfied]
    return out


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index (sum x)^2 / (n * sum x^2); 1.0 for an empty or all-zero input."""
    xs = [float(v) for v in values]
    sq = sum(x * x for x in xs)
    if not xs or sq == 0:
        return 1.0
    return sum(xs) ** 2 / (len(xs) * sq)
