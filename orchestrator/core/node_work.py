"""What the log wants running on a node: the agent's desired state.

An agent's desired state for its node is `node_work(state, node_id)`: every
rank placed there of each gang holding GPUs, at the gang's current attempt,
with what to do about it (nodeagent.rank_env builds each rank's environment).
"""

from __future__ import annotations

from typing import Literal

from orchestrator.core.model.state import ClusterState, Job

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
        intent = intent_of(job)
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
    return intent_of(job)


def intent_of(job: Job) -> Intent:
    """What the nodes of a gang holding GPUs do with its ranks."""
    return "checkpoint" if job.status == "preempting" else "stop" if job.stop is not None else "run"
