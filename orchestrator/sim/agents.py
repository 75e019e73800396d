"""The node agents' side of the log, as the simulator plays it: workers start, exit, checkpoint.

Real agents watch the log and append what their workers did; the simulated
ones answer at once and never crash, so the core sees the protocol of
DESIGN.md ("who appends what") with zero latency. Event ids are made of what
they are about (job, attempt, rank), so they are unique and deterministic
without a counter.
"""

from __future__ import annotations

from orchestrator.core.model.state import ClusterState, Job
from schemas.events import Checkpointed, WorkerExited, WorkerStarted


def workers_started(job: Job, now: float) -> list[WorkerStarted]:
    return [
        WorkerStarted(event_id=f"sim:start:{job.job_id}:{job.attempt}:{rp.rank}", occurred_at=now, job_id=job.job_id,
                      attempt=job.attempt, rank=rp.rank, node_id=rp.node_id, worker_id=f"{job.job_id}.{job.attempt}.{rp.rank}")
        for rp in job.placement
    ]


def workers_exited(state: ClusterState, job: Job, now: float, reason: str) -> list[WorkerExited]:
    """Every live worker of the job's current attempt exits: 0 when completed, killed by a signal otherwise."""
    book = state.ranks.get(job.job_id, {})
    ok = reason == "completed"
    out = []
    for rp in job.placement:
        rank = book.get(rp.rank)
        if rank is not None and rank.status == "exited":
            continue
        out.append(WorkerExited(event_id=f"sim:exit:{job.job_id}:{job.attempt}:{rp.rank}", occurred_at=now,
                                job_id=job.job_id, attempt=job.attempt, rank=rp.rank, node_id=rp.node_id,
                                exit_code=0 if ok else None, signal=None if ok else 9, reason=reason))
    return out


def checkpointed(job: Job, now: float, progress_s: float) -> Checkpointed | None:
    """Rank 0's newest checkpoint at `progress_s` seconds of work (None if there is none, or the log has it)."""
    step = int(progress_s)
    if step <= 0 or (job.checkpoint is not None and step <= job.checkpoint.step):
        return None
    return Checkpointed(event_id=f"sim:ckpt:{job.job_id}:{job.attempt}:{step}", occurred_at=now, job_id=job.job_id,
                        attempt=job.attempt, rank=0, step=step, path=f"sim://{job.job_id}/step-{step}")
