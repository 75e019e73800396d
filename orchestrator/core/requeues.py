"""`corral requeue` (issue #41, like Slurm's `scontrol requeue`): a job goes back to the queue.

RequeueRequested is a user's request, folded here as CancelRequested is:
- a gang holding GPUs gets a stop marked `requeue` (its nodes stop its ranks:
  signal, grace, kill, as for a cancel); once they are gone the scheduler
  appends JobRequeued (react.py), a fenced decision: the job waits again as its
  next attempt, from its newest checkpoint, behind the work that queued before
  it (it chose to leave), its restarts unspent (a requeue is no failure);
- a finished job (completed, failed, cancelled) still in the state is pending
  again at once as its next attempt, from its newest checkpoint. An array
  element is not (its array's tally already counted its end), nor a rejected
  job (it can never run);
- a pending job, or one already stopping or being preempted, is left as it is.
A cancel that lands while a requeue's stop is under way wins: the job ends.
"""

from __future__ import annotations

from msgspec.structs import replace

from orchestrator.core.evolve_jobs import enqueue
from orchestrator.core.model.state import HOLDING, ClusterState, Stop
from schemas.events import RequeueRequested

#: The finished statuses a requeue reopens (a rejected job never ran and never could).
REOPENED = frozenset({"completed", "failed", "cancelled"})


def requeue_reason(e: RequeueRequested) -> str:
    who = e.requested_by or "a user"
    return f"requeued by {who}" + (f": {e.reason}" if e.reason else "")


def requeue_requested(state: ClusterState, e: RequeueRequested, at: float) -> None:
    job = state.jobs.get(e.job_id)
    if job is None:
        return
    if job.status in HOLDING:
        if job.stop is not None or job.status == "preempting":
            return
        state.stopping[job.job_id] = job.submit_seq
        state.jobs[job.job_id] = replace(job, stop=Stop(reason=requeue_reason(e), requested_by=e.requested_by,
                                                        requested_at=at, requeue=True))
        state.freed_seq = state.seq  # it ends sooner than its time limit said
        return
    if job.status not in REOPENED or job.spec.gating.array is not None:
        return
    state.finished.pop(job.job_id, None)
    job = state.jobs[job.job_id] = replace(
        job, status="pending", attempt=job.attempt + 1, resume_from=job.newest_checkpoint, finished_at=0.0,
        end_reason="", stop=None, final_ranks=(), placement=(), gpus=0, master_port=0, started=0, live=0,
        exited_ok=0, lost=0, failure="", gpu_fault="", preemptor="", preempt_at=0.0, preempt_grace_s=0.0,
        waiting=None, earmark=(), not_before=0.0, rejoined_at=at, staging=None)
    enqueue(state, job)
