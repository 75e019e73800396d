"""What this node should be running, read from the shared cluster state.

Pure: the agent compares this with the workers it actually has and acts on
the difference. A rank is identified by (job, attempt, rank): a worker of a
superseded attempt is never "wanted", whatever its job's fate.
"""

from __future__ import annotations

from typing import Literal

from orchestrator.core.state import ClusterState

#: run: keep it running (start it if missing); checkpoint: preemption asked for
#: a checkpoint, then exit within the grace period; stop: cancel/time limit.
Intent = Literal["run", "checkpoint", "stop"]
WorkerKey = tuple[str, int, int]  # job id, attempt, rank


def node_work(state: ClusterState, node_id: str) -> dict[WorkerKey, Intent]:
    """Every rank of the current attempts placed on `node_id` that has not exited, with its intent."""
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
