"""Read-only questions agents and the CLI ask of a folded state.

An agent's desired state for its node is `node_work(state, node_id)`: every
rank placed there of each gang holding GPUs, at the gang's current attempt,
with what to do about it (nodeagent.rank_env builds each rank's environment).
"""

from __future__ import annotations

from typing import Literal

from orchestrator.core.plan import QueueLoad
from orchestrator.core.state import FREE, ClusterState, Waiting
from orchestrator.core.usage import average_gpus

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
        intent: Intent = "checkpoint" if job.status == "preempting" else "stop" if job.stop is not None else "run"
        for p in job.placement:
            if p.node_id != node_id:
                continue
            rank = ranks.get(p.rank)
            if rank is not None and rank.status == "exited":
                continue
            out[(job_id, job.attempt, p.rank)] = intent
    return out


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
