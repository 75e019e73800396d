"""The fold of a job's lifecycle: submitted, rejected, reserved, waiting, running, preempted,
requeued, restarted, stopped and finished -- and its place in its queue's line meanwhile.

Every transition checks the attempt it is about (evolve.py's docstring).
"""

from __future__ import annotations

from bisect import insort

from msgspec.structs import replace

from orchestrator.core import gating
from orchestrator.core.evolve_fencing import stale, void
from orchestrator.core.evolve_gpus import clear_earmark, end_changed, release, set_earmark, set_owner
from orchestrator.core.evolve_reserved import placement_problem
from orchestrator.core.model.eligibility import gpu_matches
from orchestrator.core.model.estimates import claim_of
from orchestrator.core.model.estimates import record as record_run
from orchestrator.core.model.facts import SETTLE_S
from orchestrator.core.model.state import (
    FINAL_RANKS_KEPT,
    FINISHED_KEPT,
    FREE,
    HOLDING,
    RESERVING,
    SCHEDULER,
    TERMINAL,
    ClusterState,
    Job,
    JobStatus,
    Stop,
    Waiting,
)
from orchestrator.core.model.usage import charge, first_over_limit, resolve_queue, tree_gpus
from schemas.events import (
    REFUSED,
    CancelRequested,
    GangReserved,
    GangRestarted,
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobRejected,
    JobRequeued,
    JobRunning,
    JobSubmitted,
    JobWaiting,
    Preempted,
    PreemptionRequested,
    Unknown,
)


def job_submitted(state: ClusterState, e: JobSubmitted, at: float) -> None:
    if e.job_id in state.jobs:
        return  # a retried submit
    state.unreadable_submissions.pop(e.job_id, None)  # (an unreadable one before it: the first readable one counts)
    job = Job(job_id=e.job_id, spec=e.spec, submitted_at=at, submit_seq=state.seq,
              submitted_by=e.submitted_by)
    job = state.jobs[e.job_id] = gating.submitted(state, job)
    enqueue(state, job)


#: Most characters of why a submission is unreadable that the state keeps (the JobRejected says it).
UNREADABLE_WHY_CHARS = 500


def unreadable(state: ClusterState, e: Unknown) -> None:
    """A message no one can read, or one refused as read (events/authorship.py): no change but the counts, and
    a submission of an unknown job to be rejected with the reason (core/reject.py: `reject_unreadable`)."""
    if e.reason == REFUSED:
        state.refused_events += 1
    else:
        state.unknown_events += 1
    job_id = e.submitted_as
    if job_id and job_id not in state.jobs and job_id not in state.unreadable_submissions:
        state.unreadable_submissions[job_id] = (state.seq, e.error[:UNREADABLE_WHY_CHARS])


def enqueue(state: ClusterState, job: Job) -> None:
    """Pending again (or for the first time): in its queue's line at the place its claim of this moment gives
    it (kept while it waits), or gated (gating.py)."""
    claim, source = claim_of(state, job, resolve_queue(state, job.spec.queue))
    if claim != job.claim or source != job.claim_from:
        state.jobs[job.job_id] = job = replace(job, claim=claim, claim_from=source)
    state.pending[job.job_id] = job.submit_seq
    gating.enter(state, job)


def dequeue(state: ClusterState, job: Job) -> None:
    gating.leave(state, job)


def job_rejected(state: ClusterState, e: JobRejected, at: float) -> None:
    if stale(state, e.event_id, e.epoch, unstamped_ok=True):
        return
    job = state.jobs.get(e.job_id)
    if job is None:
        state.unreadable_submissions.pop(e.job_id, None)  # answered (core/reject.py: `reject_unreadable`)
        return
    if job.status != "pending":
        return
    clear_earmark(state, job)
    dequeue(state, job)
    job = state.jobs[e.job_id] = replace(
        job, status="rejected", earmark=(), waiting=None, finished_at=at, end_reason="; ".join(e.reasons)
    )
    gating.ended(state, job)
    retire(state, e.job_id)


def reservation_problem(state: ClusterState, e: GangReserved) -> str | None:
    """Why `e` is void at this log position, or None if it is valid."""
    job = state.jobs.get(e.job_id)
    if job is None:
        return "unknown job"
    if e.epoch < state.epoch:
        return f"stale epoch {e.epoch} < {state.epoch}"
    if job.status != "pending" or job.attempt != e.attempt:
        return f"job is {job.status} at attempt {job.attempt}, not pending at {e.attempt}"
    if e.job_id in state.gated:
        return f"job is gated: {gating.gate_reason(state, job)}"
    spec = job.spec
    if len(e.ranks) != spec.ranks:
        return f"{len(e.ranks)} ranks placed, gang has {spec.ranks}"
    constrained = spec.gpu_model is not None or spec.min_gpu_memory_mib > 0
    seen: dict[str, set[int]] = {}
    for i, rp in enumerate(e.ranks):
        if rp.rank != i:
            return f"rank {rp.rank} at position {i}"
        node = state.nodes.get(rp.node_id)
        if node is None:
            return f"unknown node {rp.node_id}"
        if not node.schedulable:
            why = "failed" if node.failed else "cordoned" if node.cordoned else f"drained ({node.drained})"
            return f"node {rp.node_id} is {why}"
        if len(rp.gpus) != spec.gpus_per_rank:
            return f"rank {i} has {len(rp.gpus)} GPUs, needs {spec.gpus_per_rank}"
        if not rp.gpus:
            continue
        owners = state.owners[rp.node_id]
        marks = state.earmarks.get(rp.node_id)
        used = seen.setdefault(rp.node_id, set())
        sick = node.unhealthy_gpus if node.gpu_faults else frozenset()
        for g in rp.gpus:
            if not 0 <= g < len(owners) or g in used:
                return f"GPU {rp.node_id}/{g} invalid or placed twice"
            used.add(g)
            if g in sick:
                return f"GPU {rp.node_id}/{g} is unhealthy"
            if owners[g] != FREE:
                return f"GPU {rp.node_id}/{g} held by {owners[g]}"
            if marks is not None and marks[g] not in (FREE, e.job_id):
                return f"GPU {rp.node_id}/{g} earmarked for {marks[g]}"
        if constrained:
            gpus = node.inventory.gpus
            for g in rp.gpus:
                if g < len(gpus) and not gpu_matches(gpus[g], spec.gpu_model, spec.min_gpu_memory_mib):
                    return f"GPU {rp.node_id}/{g} is not a {spec.gpu_model or 'GPU'} with {spec.min_gpu_memory_mib} MiB"
    if state.reservations or spec.reservation_name is not None:
        barred = placement_problem(state, job, e)
        if barred is not None:
            return barred
    queue = resolve_queue(state, spec.queue)
    over = first_over_limit(state.queues, tree_gpus(state), queue, spec.total_gpus)
    if over is not None:
        return f"queue {over[0]} would exceed its limit {over[1]} (holds {over[2]})"
    return None


def gang_reserved(state: ClusterState, e: GangReserved, at: float) -> None:
    problem = reservation_problem(state, e)
    if problem is not None:
        void(state, e.event_id, problem)
        return
    job = state.jobs[e.job_id]
    clear_earmark(state, job)
    set_owner(state, e.ranks, e.job_id)
    queue = resolve_queue(state, job.spec.queue)
    gpus = job.spec.total_gpus
    charge(state, queue, gpus, at)
    dequeue(state, job)
    state.active[e.job_id] = job.submit_seq
    state.ranks[e.job_id] = {}
    job = state.jobs[e.job_id] = replace(
        job,
        status="reserved",
        queue=queue,
        placement=e.ranks,
        gpus=gpus,
        master_port=e.master_port,
        epoch=e.epoch,
        reserved_at=at,
        running_at=0.0,
        started=0,
        live=0,
        exited_ok=0,
        lost=0,
        failure="",
        gpu_fault="",
        shutdown="",
        waiting=None,
        earmark=(),
    )
    insort(state.ends, job.end_key)
    end_changed(state, job.end_key, True)


def job_waiting(state: ClusterState, e: JobWaiting, at: float) -> None:
    if stale(state, e.event_id, e.epoch, unstamped_ok=False):
        return
    job = state.jobs.get(e.job_id)
    if job is None or job.status != "pending" or e.job_id in state.gated:
        return  # (a gated job is told no reason: one decided before its hold landed changes nothing)
    if job.earmark and e.code != "preempting":
        # The scheduler no longer waits on a preemption for it: release what it held. A JobWaiting
        # otherwise leaves allocation alone (evolve._ALLOCATION_UNTOUCHED), so move `alloc_rev` here:
        # decide's memos trust it, and a warm one kept the released GPUs earmarked (found by #42's
        # speed work: a free node left unused until something else moved the counter).
        clear_earmark(state, job)
        state.alloc_rev += 1
        job = replace(job, earmark=())
    if at >= state.newest_node_at + SETTLE_S:
        # Explained while nodes were still joining: stay "fresh" so the reject stage judges
        # capacity once more when the cluster has settled (facts.SETTLE_S).
        state.unexplained.pop(e.job_id, None)
    state.jobs[e.job_id] = replace(job, waiting=Waiting(code=e.code, message=e.message, at=at,
                                                            hold_ranks=e.hold_ranks,
                                                            hold_until=rebased(e.hold_until, e.occurred_at, at),
                                                            behind=e.behind, seq=state.seq))
    if e.code == RESERVING:
        if e.job_id not in state.holders:
            state.holders.append(e.job_id)
    elif e.job_id in state.holders:
        state.holders.remove(e.job_id)


def active(state: ClusterState, job_id: str, attempt: int) -> Job | None:
    job = state.jobs.get(job_id)
    if job is None or job.attempt != attempt or job.status not in HOLDING:
        return None
    return job


def job_running(state: ClusterState, e: JobRunning, at: float) -> None:
    if stale(state, e.event_id, e.epoch, unstamped_ok=True):
        return
    job = active(state, e.job_id, e.attempt)
    if job is None or job.status != "reserved":
        return
    state.jobs[e.job_id] = replace(job, status="running", running_at=at)


def preemption_requested(state: ClusterState, e: PreemptionRequested, at: float) -> None:
    if stale(state, e.event_id, e.epoch, unstamped_ok=False):
        return
    job = active(state, e.job_id, e.attempt)
    if job is None or job.status == "preempting":
        return
    preemptor = state.jobs.get(e.preemptor_job_id)
    if preemptor is None or preemptor.status != "pending":
        void(state, e.event_id, f"preemptor {e.preemptor_job_id} is not pending")
        return  # it was cancelled or placed meanwhile: the victim keeps running
    if e.preemptor_job_id in state.gated:
        void(state, e.event_id, f"preemptor {e.preemptor_job_id} is gated: {gating.gate_reason(state, preemptor)}")
        return  # held (or waiting on others) since: no GPUs are earmarked for a job that may not start
    state.jobs[e.job_id] = replace(
        job, status="preempting", preemptor=e.preemptor_job_id, preempt_at=at, preempt_grace_s=e.grace_s
    )
    plan = e.earmark or job.placement
    if plan == preemptor.earmark:
        return
    clear_earmark(state, preemptor)
    set_earmark(state, plan, e.preemptor_job_id)
    state.jobs[e.preemptor_job_id] = replace(preemptor, earmark=plan)


def requeue(
    state: ClusterState, job: Job, attempt: int, resume_from: str | None, at: float, *, rejoin: bool
) -> None:
    """Release the gang and put the job back in line as `attempt`.

    `rejoin` (a preemption): its place is now, behind what queued before -- as
    Kueue, by default, orders a workload it evicted for not starting in time
    by the eviction. Otherwise (node failure, lost workers) it lost its GPUs
    through no choice of the scheduler and keeps its submit-time place.
    """
    release(state, job, at)
    state.jobs[job.job_id] = job = replace(
        job,
        status="pending",
        attained_s=job.attained_s + job.gpus * max(0.0, at - job.reserved_at),
        attempt=attempt,
        placement=(),
        gpus=0,
        master_port=0,
        started=0,
        live=0,
        exited_ok=0,
        lost=0,
        failure="",
        gpu_fault="",
        shutdown="",
        resume_from=resume_from,
        preemptor="",
        preempt_at=0.0,
        preempt_grace_s=0.0,
        waiting=None,
        rejoined_at=at if rejoin else job.rejoined_at,
        not_before=0.0,
    )
    enqueue(state, job)


def preempted(state: ClusterState, e: Preempted, at: float) -> None:
    if stale(state, e.event_id, e.epoch, unstamped_ok=True):
        return
    job = active(state, e.job_id, e.attempt)
    if job is None or job.status != "preempting":
        return
    requeue(state, job, job.attempt + 1, e.resume_from or job.newest_checkpoint, at, rejoin=True)


def job_requeued(state: ClusterState, e: JobRequeued, at: float) -> None:
    if stale(state, e.event_id, e.epoch, unstamped_ok=False):
        return
    job = active(state, e.job_id, e.attempt - 1)
    if job is None:
        return
    asked = job.stop is not None and job.stop.requeue  # a user's requeue (core/requeues.py): it chose to leave
    requeue(state, job, e.attempt, e.resume_from or job.newest_checkpoint, at, rejoin=asked)
    if asked:
        state.stopping.pop(e.job_id, None)
        state.jobs[e.job_id] = replace(state.jobs[e.job_id], stop=None)


def gang_restarted(state: ClusterState, e: GangRestarted, at: float) -> None:
    """Same GPUs, next attempt: agents replace every worker of the old attempt."""
    if stale(state, e.event_id, e.epoch, unstamped_ok=False):
        return
    job = active(state, e.job_id, e.attempt - 1)
    if job is None or job.status == "preempting":
        return
    state.ranks[e.job_id] = {}
    state.jobs[e.job_id] = replace(
        job,
        status="reserved",
        attempt=e.attempt,
        restarts=job.restarts + 1,
        started=0,
        live=0,
        exited_ok=0,
        lost=0,
        failure="",
        shutdown="",
        resume_from=job.newest_checkpoint,
        not_before=rebased(e.not_before, e.occurred_at, at),
    )


def rebased(t: float, stamped_at: float, at: float) -> float:
    """A time `t` the publisher wrote beside its `occurred_at` (`stamped_at`), moved onto the fold's clock.

    The scheduler writes a backoff's end (`GangRestarted.not_before`) or a planned start
    (`JobWaiting.hold_until`) as its "now" plus a delay: the difference is a duration on one
    machine's clock, sound whatever that clock says, so the fold re-bases it on the stream time
    `at`. 0 stays 0 ("none"); when `at` is the event's own time (a simulation, an event-only
    file) `t` is kept as it is, bit for bit.
    """
    if t == 0.0 or at == stamped_at:
        return t
    return at + (t - stamped_at)


def finish(state: ClusterState, job: Job, status: JobStatus, reason: str, at: float) -> None:
    book = state.ranks.get(job.job_id, {})
    final_ranks = tuple(sorted(book.items())[:FINAL_RANKS_KEPT])
    release(state, job, at)
    clear_earmark(state, job)
    dequeue(state, job)
    state.stopping.pop(job.job_id, None)
    state.checkpoint_votes.pop(job.job_id, None)
    job = state.jobs[job.job_id] = replace(
        job, status=status, gpus=0, finished_at=at, end_reason=reason, earmark=(), live=0, final_ranks=final_ranks
    )
    gating.ended(state, job)
    retire(state, job.job_id)


def retire(state: ClusterState, job_id: str) -> None:
    """Remember a finished job; past FINISHED_KEPT drop the oldest ones (in batches: O(1) amortised)."""
    state.finished[job_id] = state.seq
    excess = len(state.finished) - FINISHED_KEPT
    if excess > FINISHED_KEPT // 10:
        order = list(state.finished)
        for jid in order[:excess]:
            state.jobs.pop(jid, None)
        state.finished = {jid: state.finished[jid] for jid in order[excess:]}


def job_completed(state: ClusterState, e: JobCompleted, at: float) -> None:
    if stale(state, e.event_id, e.epoch, unstamped_ok=True):
        return
    job = active(state, e.job_id, e.attempt)
    if job is not None:
        record_run(state.durations, job, at)  # learned run times (estimates.py)
        finish(state, job, "completed", "", at)


def job_failed(state: ClusterState, e: JobFailed, at: float) -> None:
    if stale(state, e.event_id, e.epoch, unstamped_ok=True):
        return
    job = state.jobs.get(e.job_id)
    if job is None or job.status in TERMINAL or job.attempt != e.attempt:
        return
    finish(state, job, "failed", e.reason, at)


def cancel_requested(state: ClusterState, e: CancelRequested, at: float) -> None:
    if stale(state, e.event_id, e.epoch, unstamped_ok=True):
        return  # (a user's cancel is unstamped; the scheduler's own stops carry its epoch)
    job = state.jobs.get(e.job_id)
    if job is None or job.status in TERMINAL or (job.stop is not None and not job.stop.requeue):
        return  # (a cancel overrides a requeue under way: core/requeues.py)
    stop = Stop(
        reason=e.reason, requested_by=e.requested_by, requested_at=at, fail=e.requested_by == SCHEDULER
    )
    state.stopping[e.job_id] = job.submit_seq
    state.jobs[e.job_id] = replace(job, stop=stop)
    state.freed_seq = state.seq  # it ends sooner than its time limit said


def job_cancelled(state: ClusterState, e: JobCancelled, at: float) -> None:
    if stale(state, e.event_id, e.epoch, unstamped_ok=True):
        return
    job = state.jobs.get(e.job_id)
    if job is None or job.status in TERMINAL:
        return
    finish(state, job, "cancelled", e.reason, at)
