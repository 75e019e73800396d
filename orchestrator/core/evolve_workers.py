"""The fold of what agents report about one attempt's workers: started, exited, checkpointed."""

from __future__ import annotations

from msgspec.structs import replace

from orchestrator.core.evolve_jobs import active
from orchestrator.core.model.state import (
    SHUTDOWN,
    TERMINAL,
    UNSTARTABLE,
    Checkpoint,
    ClusterState,
    Job,
    RankState,
    WorkerId,
)
from schemas.events import Checkpointed, WorkerExited, WorkerStarted


def rank_node(job: Job, rank: int) -> str | None:
    if 0 <= rank < len(job.placement):
        return job.placement[rank].node_id
    return None


def note_started(state: ClusterState, e: WorkerStarted) -> None:
    """`ClusterState.unended`: a start on a known node of a known job, of any attempt, taken or not (a later one
    replaces it). One about a job or node the fold never knew (garbage, a forged report) is no worker of any
    gang, and must not change the state."""
    if e.job_id in state.jobs and e.node_id in state.nodes:
        state.unended.setdefault(e.node_id, {})[(e.job_id, e.attempt, e.rank)] = e.restarts


def note_exited(state: ClusterState, e: WorkerExited) -> None:
    """`ClusterState.unended`: an exit ends the start of its generation or an earlier one, never a later one."""
    workers = state.unended.get(e.node_id)
    if workers is None:
        return
    key: WorkerId = (e.job_id, e.attempt, e.rank)
    generation = workers.get(key)
    if generation is not None and generation <= e.restarts:
        del workers[key]
        if not workers:
            del state.unended[e.node_id]


def worker_started(state: ClusterState, e: WorkerStarted, at: float) -> None:
    note_started(state, e)
    job = active(state, e.job_id, e.attempt)
    if job is None or rank_node(job, e.rank) != e.node_id:
        return
    book = state.ranks.setdefault(e.job_id, {})
    prev = book.get(e.rank)
    started, live, ok = job.started, job.live, job.exited_ok
    if prev is None:
        started += 1
        live += 1
    elif prev.status == "started":
        return  # duplicate
    elif prev.status == "exited":
        live += 1
        if prev.exit_code == 0 and prev.reason == "completed":
            ok -= 1
    book[e.rank] = RankState(node_id=e.node_id, status="started", restarts=e.restarts, started_at=at)
    state.jobs[e.job_id] = replace(job, started=started, live=live, exited_ok=ok)


def worker_exited(state: ClusterState, e: WorkerExited, at: float) -> None:
    note_exited(state, e)
    job = active(state, e.job_id, e.attempt)
    if job is None or rank_node(job, e.rank) != e.node_id:
        return
    book = state.ranks.setdefault(e.job_id, {})
    prev = book.get(e.rank)
    if prev is not None and prev.status == "exited":
        return  # duplicate: an exited rank exits once
    started = job.started + (1 if prev is None else 0)
    live = job.live - (1 if prev is not None else 0)
    started_at = prev.started_at if prev is not None else 0.0
    if e.will_restart:
        book[e.rank] = RankState(node_id=e.node_id, status="restarting", exit_code=e.exit_code, reason=e.reason,
                                 restarts=e.restarts, started_at=started_at, exited_at=at)
        state.jobs[e.job_id] = replace(job, started=started, live=live + 1)
        return
    book[e.rank] = RankState(node_id=e.node_id, status="exited", exit_code=e.exit_code, reason=e.reason,
                             restarts=e.restarts, started_at=started_at, exited_at=at)
    ok = e.exit_code == 0 and e.reason == "completed"
    lost = job.lost + (1 if e.reason == "lost" else 0)
    # Stopped by its node's graceful shutdown: no failure, the gang is requeued (react.py, rule 1).
    shutdown = job.shutdown or (e.node_id if e.reason == SHUTDOWN else "")
    failure = job.failure
    if not ok and not failure and e.reason == UNSTARTABLE:
        failure = f"rank {e.rank} cannot start: {e.log_tail[:500]}"
    elif not ok and not failure and e.reason not in ("lost", SHUTDOWN):
        how = f"exit {e.exit_code}" if e.exit_code is not None else f"signal {e.signal}"
        failure = f"rank {e.rank} {e.reason} ({how})"
    state.jobs[e.job_id] = replace(
        job, started=started, live=live, exited_ok=job.exited_ok + ok, lost=lost, failure=failure,
        shutdown=shutdown,
    )


def checkpointed(state: ClusterState, e: Checkpointed) -> None:
    """Rank 0's checkpoint counts at once; other ranks' once every rank reported that step.

    Only the current attempt's: a worker of an earlier one may still run (an orphan whose agent
    died, a stale worker behind a partition) and its checkpoints are not the new attempt's
    progress; the new attempt resumes from what the log held when it began (`resume_from`).
    """
    job = state.jobs.get(e.job_id)
    if job is None or job.status in TERMINAL or e.attempt != job.attempt:
        return
    if job.checkpoint is not None and e.step < job.checkpoint.step:
        return
    complete = e.rank == 0 or job.spec.ranks == 1
    if not complete:
        votes = state.checkpoint_votes.setdefault(e.job_id, {})
        ranks = votes.get(e.step, ())
        if e.rank not in ranks:
            ranks = (*ranks, e.rank)
        votes[e.step] = ranks
        complete = len(ranks) >= job.spec.ranks
    if complete:
        pending_votes = state.checkpoint_votes.get(e.job_id)
        if pending_votes is not None:
            for step in [s for s in pending_votes if s <= e.step]:
                del pending_votes[step]
            if not pending_votes:
                del state.checkpoint_votes[e.job_id]
        rs = state.ranks.get(e.job_id, {}).get(e.rank)
        ran = e.occurred_at - rs.started_at if rs is not None and rs.status == "started" else 0.0
        ckpt = Checkpoint(path=e.path, step=e.step, attempt=e.attempt, rank=e.rank, after_s=max(0.0, ran))
        state.jobs[e.job_id] = replace(job, checkpoint=ckpt)
