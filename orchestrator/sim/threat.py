"""Whether a gang becoming preemptible is worth a simulator wake-up: could anyone waiting preempt it?

The simulator skips the wake-up when the answer is False, so False must be
certain (tests/sim/test_preemption_threat.py).
"""

from __future__ import annotations

from collections.abc import Callable

from orchestrator.core.model.running import preemptions_in_flight
from orchestrator.core.model.state import ClusterState, Job
from orchestrator.core.model.usage import resolve_queue


def preemption_threat(state: ClusterState) -> Callable[[Job], bool]:
    """Whether a job pending now could preempt a gang, once it ran long enough, by priority or reclaim.

    The necessary conditions of the default rule (policies/victims.py,
    `why_preemptible`, with the GPUs decide's plan counts per queue): a pending
    job of higher priority in the gang's queue, or the gang's queue holds more
    than its guarantee while a queue with pending jobs holds less than its own
    (a job asks for a GPU at least: a CPU-only gang needs no victims). Counts
    are bounded the way that says True more often: GPUs of gangs being
    preempted may leave a queue, preemptors' claims may join it. Sizes,
    topology and quota are not looked at, so True may still find no victims;
    False is certain until the state changes. The simulator asks it before
    waking up for a gang that becomes preemptible.
    """
    low = {q: u.gpus for q, u in state.usage.items()}  # fewest GPUs decide may count for a queue
    high = dict(low)  # most
    victims, preemptors = preemptions_in_flight(state)  # what Plan counts on top of the fold
    for j in victims:
        low[j.queue] = low.get(j.queue, 0) - j.gpus
    for p in preemptors:
        q = resolve_queue(state, p.spec.queue)
        high[q] = high.get(q, 0) + p.spec.total_gpus
    top: dict[str, int] = {}
    owed = False
    for name, keys in state.lines.items():
        if not keys:
            continue
        q = resolve_queue(state, name)
        top[q] = max(top.get(q, -(2**63)), -keys[0][0])  # LineKey: (-priority, waiting_since, job_id)
        queue = state.queues.get(q)
        owed = owed or (queue is not None and low.get(q, 0) < queue.guaranteed_gpus)

    def threatened(job: Job) -> bool:
        if not job.spec.preemptible:
            return False
        if top.get(job.queue, -(2**63)) > job.spec.priority:
            return True
        queue = state.queues.get(job.queue)
        return owed and high.get(job.queue, 0) > (queue.guaranteed_gpus if queue is not None else 0)

    return threatened
