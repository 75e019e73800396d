"""Read-only questions agents and the CLI ask of a folded state.

An agent's desired state for its node is `node_work(state, node_id)`: every
rank placed there of each gang holding GPUs, at the gang's current attempt,
with what to do about it (nodeagent.rank_env builds each rank's environment).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from orchestrator.core.plan import QueueLoad
from orchestrator.core.running import preemptions_in_flight
from orchestrator.core.state import FREE, ClusterState, Job, Waiting
from orchestrator.core.usage import average_gpus, resolve_queue

#: run: keep it running (start it if missing); checkpoint: preemption asked for
#: a checkpoint, then exit within the grace period; stop: cancel/time limit.
Intent = Literal["run", "checkpoint", "stop"]
WorkerKey = tuple[str, int, int]  # job id, attempt, rank


def node_work(state: ClusterState, node_id: str) -> dict[WorkerKey, Intent]:
    """Every rank of the current attempts placed on `node_id` that has not exited, with its intent.

    The agent compares this with the workers it has and acts on the difference; a
    worker of a superseded attempt is never "wanted", whatever its job's fate.
    """
    node = state.nodes.get(node_id)
    if node is None or node.failed:
        return {}  # a failed node's gangs are being requeued: nothing here is wanted any more
    out: dict[WorkerKey, Intent] = {}
    for job_id in state.active:
        job = state.jobs[job_id]
        ranks = state.ranks.get(job_id, {})
        intent = _intent(job)
        for p in job.placement:
            if p.node_id != node_id:
                continue
            rank = ranks.get(p.rank)
            if rank is not None and rank.status == "exited":
                continue
            out[(job_id, job.attempt, p.rank)] = intent
    return out


def rank_intent(state: ClusterState, node_id: str, key: WorkerKey) -> Intent | None:
    """`node_work(state, node_id).get(key)` for one rank, without walking every gang.

    An agent awaits between reading `node_work` and acting on each rank; it asks
    again here, on the state as it is by then, before it starts a worker.
    """
    job_id, attempt, rank = key
    node = state.nodes.get(node_id)
    job = state.jobs.get(job_id)
    if node is None or node.failed or job is None or job_id not in state.active or job.attempt != attempt:
        return None
    if not 0 <= rank < len(job.placement) or job.placement[rank].node_id != node_id:
        return None
    done = state.ranks.get(job_id, {}).get(rank)
    if done is not None and done.status == "exited":
        return None
    return _intent(job)


def _intent(job: Job) -> Intent:
    return "checkpoint" if job.status == "preempting" else "stop" if job.stop is not None else "run"


def why_pending(state: ClusterState, job_id: str) -> Waiting | None:
    """The scheduler's last structured reason for a pending job (None: not pending or not explained yet)."""
    job = state.jobs.get(job_id)
    if job is None or job.status != "pending":
        return None
    return job.waiting


def gpu_owners(state: ClusterState, node_id: str) -> tuple[str, ...]:
    """Per GPU index of a node, the job holding it ("" when free)."""
    return state.owners.get(node_id, ())


def free_gpu_count(state: ClusterState) -> int:
    """Free GPUs on schedulable nodes (earmarked ones included)."""
    return sum(
        sum(1 for o in state.owners[nid] if o == FREE) for nid, n in state.nodes.items() if n.schedulable
    )


def queue_loads(state: ClusterState, now: float) -> list[QueueLoad]:
    """Every queue (defined or charged) with its GPUs, guarantee, limit and fair-share usage."""
    names = [*state.queues, *(q for q in state.usage if q not in state.queues)]
    half_life = state.config.fairshare_half_life_s
    out = []
    for name in names:
        q = state.queues.get(name)
        u = state.usage.get(name)
        out.append(
            QueueLoad(
                name=name,
                weight=q.weight if q else 1.0,
                guaranteed=q.guaranteed_gpus if q else 0,
                limit=q.limit_gpus if q else None,
                gpus=u.gpus if u else 0,
                usage=average_gpus(u, now, half_life) if u else 0.0,
            )
        )
    return out


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
