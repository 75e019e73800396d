"""Order: queues by weighted fair share, then priority, then submit time, then job id.

Inside a queue the default order (higher priority, earlier submit, job id) is
kept sorted by the fold itself (`ClusterState.lines`), so a cycle never sorts
the backlog; a custom `job_key` works too, at the price of a sort per cycle.

A queue's share is its usage divided by its weight; usage is the GPUs it holds
(or, with a half-life configured, its decayed average GPUs) plus what it got
earlier in this cycle, so one decide call already interleaves queues fairly.
Queues below their guarantee go first: idle GPUs are lent to others, but a
queue that is owed GPUs gets the next free ones.
"""

from __future__ import annotations

from typing import Any

from orchestrator.core.plan import QueueLoad
from orchestrator.core.state import Job

#: Any comparable tuple; the default is the fold's line key (-priority, waiting_since, job_id).
JobKey = tuple[Any, ...]
QueueKey = tuple[int, float, str]


def job_order_key(job: Job) -> JobKey:
    """Inside a queue: higher priority first, then the longest waiting (submit or preemption), then job id."""
    return job.line_key


def fair_share_key(load: QueueLoad) -> QueueKey:
    """Across queues: owed GPUs first, then the smallest weighted share, then the name."""
    owed = 0 if load.gpus < load.guaranteed else 1
    return (owed, load.usage / max(load.weight, 1e-9), load.name)
