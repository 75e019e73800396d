"""Order: queues by weighted fair share, then priority, then the smallest claim, then waiting time, then job id.

Inside a queue the default order (higher priority, smaller remaining claim in
GPU-seconds, longer wait, job id: issue #29, estimates.claim_of) is kept
sorted by the fold itself (`ClusterState.lines`; `Policies.job_key` None
declares it), so a cycle never sorts the backlog; a `job_key` function works
too, at the price of a sort per cycle.

A queue's share is its usage divided by its weight; usage is the GPUs it holds
(or, with a half-life configured, its decayed average GPUs) plus what it got
earlier in this cycle and the GPUs its backfill reservations hold, so one
decide call already interleaves queues fairly, and on a full cluster -- where
every GPU that comes back is reserved -- reservations follow fair share too.
In a hierarchy, shares compare from the root down: children split their
parent's share by weight.
Queues below their guarantee go first: idle GPUs are lent to others, but a
queue that is owed GPUs gets the next free ones.
"""

from __future__ import annotations

import math
from typing import Any

from orchestrator.core.model.plan import QueueLoad
from orchestrator.core.model.state import Job

#: Any comparable tuple; the default is the fold's line key (-priority, claim, waiting_since, job_id).
JobKey = tuple[Any, ...]
#: Any comparable tuple; the default is (owed, shares from the root down, name).
QueueKey = tuple[Any, ...]


def job_order_key(job: Job) -> JobKey:
    """Inside a queue: higher priority first, then the smallest remaining claim (`Job.claim`: GPUs x time
    limit or learned run time, less the service attained, fixed when it joined the line), then the
    longest waiting (submit or preemption), then job id.

    Shortest claim first, as Helios' QSSF: under a backlog a queue's many small jobs no longer
    wait out each big gang at its head (issue #29: team-a's 1-GPU jobs waited 8.2 h on average
    in arrival order); big gangs are bounded by the starvation preemption (core/starving.py).

    The order `Policies.job_key` None declares (the fold keeps its lines in it); as a
    `job_key` function it gives the same order through a sort per cycle.
    """
    return job.line_key


def arrival_order_key(job: Job) -> JobKey:
    """Inside a queue: higher priority, then the longest waiting, then job id -- the order without claims."""
    return (-job.spec.priority, job.waiting_since, job.job_id)


def fair_share_key(load: QueueLoad) -> QueueKey:
    """Across queues: owed GPUs first, then the smallest weighted share, then the name.

    A queue's share counts half of what its next job asks for: the share it
    would have halfway through taking it. Compared on usage alone, a queue gets
    its next gang while it is below its share and then holds the whole gang
    above it, so a light queue of big gangs ends up with its share plus half a
    gang on average (measured: weight 1 of 3:2:1 with 1-8 GPU jobs got 1.15x
    its share, weight 3 0.83x); at the midpoint the overshoot and the
    undershoot cancel.

    In a hierarchy the shares are compared from the root down (a fair tree): the
    top-level subtree with the smallest share goes first, and inside it the child
    with the smallest share, so children split their parent's share by weight.
    """
    owed = 0 if load.gpus < load.guaranteed else 1
    return (owed, (*load.ancestor_shares, (load.usage + load.asks / 2) / max(load.weight, 1e-9)), load.name)


def run_time_tilted(key: QueueKey, run_h: float, tilt: float, most: float = math.inf) -> QueueKey:
    """`fair_share_key`'s key with the queue's own share (the last of its shares) times (1 + run_h) ** tilt, at
    most `most` times (`Policies.share_tilt`, `share_tilt_max`); a key of another shape (a baseline's) as it is."""
    shares = key[1]
    if len(key) != 3 or not isinstance(shares, tuple) or not shares or tilt <= 0.0:
        return key
    return (key[0], (*shares[:-1], shares[-1] * min(most, (1.0 + max(0.0, run_h)) ** tilt)), key[2])
