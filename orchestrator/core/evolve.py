"""`evolve(state, event)`: the one fold every reader shares (scheduler, agents, CLI, replay).

It applies facts and *validates decisions*: a GangReserved whose GPUs are not
all free (or are earmarked for another job) at its log position, on a failed,
cordoned or unknown node, for a job not pending at that attempt, over a queue
limit, or from an epoch older than the newest SchedulerElected is void: it
changes nothing but the void counter. So is a PreemptionRequested for a
preemptor that is no longer pending. Two racing schedulers therefore cannot
double-book a GPU; the log order decides and every reader agrees.

Fencing (DESIGN.md, "Safety by construction"). Every event a scheduler
authors carries the epoch it was decided under, and one older than the
newest SchedulerElected is void: a deposed or paused leader's NodeFailed,
requeue, restart, preemption, completion or settings change nothing, however
late they land. Epochs are exactly previous + 1: a SchedulerElected with any
other epoch (a repeat, a jump, a forged 2^64-1) is void too, so an epoch is
never elected twice and never skipped. Epoch 0 means "unstamped": the types
that gained `epoch` with fencing (JobRejected, JobRunning, CancelRequested,
Preempted, JobCompleted, JobFailed, JobCancelled, NodeFailed,
ClusterConfigured) were written without one before, and by users (a cancel)
and tools (the simulator's node failures) still are, so an unstamped one is
judged by its other checks as it always was. The types that carried an epoch
from v1 (GangReserved, PreemptionRequested, JobWaiting, GangRestarted,
JobRequeued) were always stamped by the scheduler, so 0 there is an epoch
like any other: stale once a leader was elected. Voids are counted and the
newest one's reason kept (`ClusterState.last_void`) for `corral explain`.

Transitions check the attempt they are about, so a duplicated or late event
(two schedulers reacting to the same fact) is a no-op rather than a second
transition. Events about unknown jobs or nodes change nothing.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable
from typing import assert_never

from msgspec.structs import replace

from orchestrator.core.eligibility import gpu_matches
from orchestrator.core.estimates import record as record_run
from orchestrator.core.facts import SETTLE_S
from orchestrator.core.state import (
    FINAL_RANKS_KEPT,
    FINISHED_KEPT,
    FREE,
    HOLDING,
    RESERVING,
    SCHEDULER,
    TERMINAL,
    Checkpoint,
    ClusterState,
    Config,
    Job,
    JobStatus,
    Node,
    Queue,
    RankState,
    Stop,
    Waiting,
    needs_look,
)
from orchestrator.core.usage import charge, first_over_limit, recompute_trees, resolve_queue, tree_gpus
from schemas.events import (
    AnyEvent,
    CancelRequested,
    Checkpointed,
    ClusterConfigured,
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
    NodeCordoned,
    NodeFailed,
    NodeRecovered,
    NodeRegistered,
    NodeUncordoned,
    Preempted,
    PreemptionRequested,
    QueueDefined,
    QueueDeleted,
    RankPlacement,
    SchedulerElected,
    Unknown,
    WorkerExited,
    WorkerStarted,
)

#: Events whose fold never changes node records, GPU owners, earmarks or `ends`: every other one
#: moves `ClusterState.alloc_rev` (node events `nodes_rev` too), which decide's per-call memos
#: trust. tests/core/test_memos.py checks both lists against every event of simulated logs.
_ALLOCATION_UNTOUCHED = (
    WorkerStarted, WorkerExited, JobSubmitted, JobRunning, JobWaiting, Checkpointed,
    QueueDefined, SchedulerElected, ClusterConfigured, Unknown,
)
_NODE_EVENTS = (NodeRegistered, NodeFailed, NodeRecovered, NodeCordoned, NodeUncordoned)


def evolve(state: ClusterState, event: AnyEvent | Unknown, seq: int = 0) -> ClusterState:
    """Apply `event` (at stream position `seq`, or the next one) in place and return the state."""
    state.seq = seq if seq > 0 else state.seq + 1
    voids = state.voids
    # Ordered by frequency in a busy log: worker events dominate.
    match event:
        case WorkerStarted():
            _worker_started(state, event)
        case WorkerExited():
            _worker_exited(state, event)
        case GangReserved():
            _gang_reserved(state, event)
        case JobSubmitted():
            _job_submitted(state, event)
        case JobRunning():
            _job_running(state, event)
        case JobCompleted():
            _job_completed(state, event)
        case JobWaiting():
            _job_waiting(state, event)
        case Checkpointed():
            _checkpointed(state, event)
        case PreemptionRequested():
            _preemption_requested(state, event)
        case Preempted():
            _preempted(state, event)
        case GangRestarted():
            _gang_restarted(state, event)
        case JobRequeued():
            _job_requeued(state, event)
        case JobFailed():
            _job_failed(state, event)
        case CancelRequested():
            _cancel_requested(state, event)
        case JobCancelled():
            _job_cancelled(state, event)
        case JobRejected():
            _job_rejected(state, event)
        case NodeRegistered():
            _node_registered(state, event)
        case NodeFailed():
            _node_failed(state, event)
        case NodeRecovered():
            _node_recovered(state, event)
        case NodeCordoned():
            _node_cordon(state, event.node_id, True)
        case NodeUncordoned():
            _node_cordon(state, event.node_id, False)
        case QueueDefined():
            _queue_defined(state, event)
        case QueueDeleted():
            _queue_deleted(state, event)
        case SchedulerElected():
            _scheduler_elected(state, event)
        case ClusterConfigured():
            _cluster_configured(state, event)
        case Unknown():
            state.unknown_events += 1
        case _:
            assert_never(event)
    if not isinstance(event, _ALLOCATION_UNTOUCHED) and state.voids == voids:  # (a void one changes nothing)
        state.alloc_rev += 1
        if isinstance(event, _NODE_EVENTS):
            state.nodes_rev += 1
    jid = getattr(event, "job_id", None)
    if jid is not None:
        _track(state, jid)
    return state


def _stale(state: ClusterState, event_id: str, epoch: int, *, unstamped_ok: bool) -> bool:
    """Whether a scheduler's decision comes from an epoch older than the newest election; records it void.

    `unstamped_ok`: the event's type gained its epoch with fencing, so 0 is an old or a
    non-scheduler writer's "no epoch" and is not judged here (module docstring).
    """
    if epoch >= state.epoch or (unstamped_ok and epoch == 0):
        return False
    _void(state, event_id, f"stale epoch {epoch} < {state.epoch}")
    return True


def _scheduler_elected(state: ClusterState, e: SchedulerElected) -> None:
    """Epochs are exactly previous + 1: two candidates cannot both hold one, and none is skipped."""
    if e.epoch != state.epoch + 1:
        _void(state, e.event_id, f"epoch {e.epoch} does not follow {state.epoch} (elections go previous + 1)")
        return
    state.epoch = e.epoch
    state.scheduler_id = e.scheduler_id


def _cluster_configured(state: ClusterState, e: ClusterConfigured) -> None:
    if _stale(state, e.event_id, e.epoch, unstamped_ok=True):
        return
    state.config = Config(
        topology_levels=tuple(e.topology_levels),
        fairshare_half_life_s=e.fairshare_half_life_s,
        min_runtime_s=e.min_runtime_s,
        default_queue=e.default_queue,
    )


def _track(state: ClusterState, job_id: str) -> None:
    """Keep `watch` in step with the job an event touched."""
    job = state.jobs.get(job_id)
    if job is not None and job_id in state.active and needs_look(job):
        state.watch[job_id] = job.submit_seq
    else:
        state.watch.pop(job_id, None)


def fold(events: Iterable[AnyEvent | Unknown], state: ClusterState | None = None) -> ClusterState:
    """Fold a log (positions 1, 2, ...) into a new state, or onto `state`."""
    s = ClusterState() if state is None else state
    for e in events:
        evolve(s, e)
    return s


# --- jobs --------------------------------------------------------------------


def _job_submitted(state: ClusterState, e: JobSubmitted) -> None:
    if e.job_id in state.jobs:
        return  # a retried submit
    job = state.jobs[e.job_id] = Job(job_id=e.job_id, spec=e.spec, submitted_at=e.occurred_at, submit_seq=state.seq,
                                     submitted_by=e.submitted_by)
    _enqueue(state, job)


def _enqueue(state: ClusterState, job: Job) -> None:
    state.pending[job.job_id] = job.submit_seq
    state.unexplained[job.job_id] = job.submit_seq
    insort(state.lines.setdefault(job.spec.queue, []), job.line_key)


def _dequeue(state: ClusterState, job: Job) -> None:
    if state.pending.pop(job.job_id, None) is None:
        return
    if job.job_id in state.holders:
        state.holders.remove(job.job_id)
    state.unexplained.pop(job.job_id, None)
    line = state.lines[job.spec.queue]
    key = job.line_key
    i = bisect_left(line, key)
    if i < len(line) and line[i] == key:
        del line[i]
    if not line:
        del state.lines[job.spec.queue]


def _job_rejected(state: ClusterState, e: JobRejected) -> None:
    if _stale(state, e.event_id, e.epoch, unstamped_ok=True):
        return
    job = state.jobs.get(e.job_id)
    if job is None or job.status != "pending":
        return
    _clear_earmark(state, job)
    _dequeue(state, job)
    state.jobs[e.job_id] = replace(
        job, status="rejected", earmark=(), waiting=None, finished_at=e.occurred_at, end_reason="; ".join(e.reasons)
    )
    _retire(state, e.job_id)


def _void(state: ClusterState, event_id: str, why: str) -> None:
    state.voids += 1
    state.last_void = f"{event_id}: {why}"


def reservation_problem(state: ClusterState, e: GangReserved) -> str | None:
    """Why `e` is void at this log position, or None if it is valid."""
    job = state.jobs.get(e.job_id)
    if job is None:
        return "unknown job"
    if e.epoch < state.epoch:
        return f"stale epoch {e.epoch} < {state.epoch}"
    if job.status != "pending" or job.attempt != e.attempt:
        return f"job is {job.status} at attempt {job.attempt}, not pending at {e.attempt}"
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
        if node.failed or node.cordoned:
            return f"node {rp.node_id} is {'failed' if node.failed else 'cordoned'}"
        if len(rp.gpus) != spec.gpus_per_rank:
            return f"rank {i} has {len(rp.gpus)} GPUs, needs {spec.gpus_per_rank}"
        if not rp.gpus:
            continue
        owners = state.owners[rp.node_id]
        marks = state.earmarks.get(rp.node_id)
        used = seen.setdefault(rp.node_id, set())
        for g in rp.gpus:
            if not 0 <= g < len(owners) or g in used:
                return f"GPU {rp.node_id}/{g} invalid or placed twice"
            used.add(g)
            if owners[g] != FREE:
                return f"GPU {rp.node_id}/{g} held by {owners[g]}"
            if marks is not None and marks[g] not in (FREE, e.job_id):
                return f"GPU {rp.node_id}/{g} earmarked for {marks[g]}"
        if constrained:
            gpus = node.inventory.gpus
            for g in rp.gpus:
                if g < len(gpus) and not gpu_matches(gpus[g], spec.gpu_model, spec.min_gpu_memory_mib):
                    return f"GPU {rp.node_id}/{g} is not a {spec.gpu_model or 'GPU'} with {spec.min_gpu_memory_mib} MiB"
    queue = resolve_queue(state, spec.queue)
    over = first_over_limit(state.queues, tree_gpus(state), queue, spec.total_gpus)
    if over is not None:
        return f"queue {over[0]} would exceed its limit {over[1]} (holds {over[2]})"
    return None


def _gang_reserved(state: ClusterState, e: GangReserved) -> None:
    problem = reservation_problem(state, e)
    if problem is not None:
        _void(state, e.event_id, problem)
        return
    job = state.jobs[e.job_id]
    _clear_earmark(state, job)
    _set_owner(state, e.ranks, e.job_id)
    queue = resolve_queue(state, job.spec.queue)
    gpus = job.spec.total_gpus
    charge(state, queue, gpus, e.occurred_at)
    _dequeue(state, job)
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
        reserved_at=e.occurred_at,
        running_at=0.0,
        started=0,
        live=0,
        exited_ok=0,
        lost=0,
        failure="",
        waiting=None,
        earmark=(),
    )
    insort(state.ends, job.end_key)
    _end_changed(state, job.end_key, True)


def _job_waiting(state: ClusterState, e: JobWaiting) -> None:
    if _stale(state, e.event_id, e.epoch, unstamped_ok=False):
        return
    job = state.jobs.get(e.job_id)
    if job is None or job.status != "pending":
        return
    if job.earmark and e.code != "preempting":
        # The scheduler no longer waits on a preemption for it: release what it held.
        _clear_earmark(state, job)
        job = replace(job, earmark=())
    if e.occurred_at >= state.newest_node_at + SETTLE_S:
        # Explained while nodes were still joining: stay "fresh" so the reject stage judges
        # capacity once more when the cluster has settled (facts.SETTLE_S).
        state.unexplained.pop(e.job_id, None)
    state.jobs[e.job_id] = replace(job, waiting=Waiting(code=e.code, message=e.message, at=e.occurred_at,
                                                            hold_ranks=e.hold_ranks, hold_until=e.hold_until,
                                                            seq=state.seq))
    if e.code == RESERVING:
        if e.job_id not in state.holders:
            state.holders.append(e.job_id)
    elif e.job_id in state.holders:
        state.holders.remove(e.job_id)


def _active(state: ClusterState, job_id: str, attempt: int) -> Job | None:
    job = state.jobs.get(job_id)
    if job is None or job.attempt != attempt or job.status not in HOLDING:
        return None
    return job


def _rank_node(job: Job, rank: int) -> str | None:
    if 0 <= rank < len(job.placement):
        return job.placement[rank].node_id
    return None


def _worker_started(state: ClusterState, e: WorkerStarted) -> None:
    job = _active(state, e.job_id, e.attempt)
    if job is None or _rank_node(job, e.rank) != e.node_id:
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
    book[e.rank] = RankState(node_id=e.node_id, status="started", restarts=e.restarts, started_at=e.occurred_at)
    state.jobs[e.job_id] = replace(job, started=started, live=live, exited_ok=ok)


def _worker_exited(state: ClusterState, e: WorkerExited) -> None:
    job = _active(state, e.job_id, e.attempt)
    if job is None or _rank_node(job, e.rank) != e.node_id:
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
                                 restarts=e.restarts, started_at=started_at, exited_at=e.occurred_at)
        state.jobs[e.job_id] = replace(job, started=started, live=live + 1)
        return
    book[e.rank] = RankState(node_id=e.node_id, status="exited", exit_code=e.exit_code, reason=e.reason,
                             restarts=e.restarts, started_at=started_at, exited_at=e.occurred_at)
    ok = e.exit_code == 0 and e.reason == "completed"
    lost = job.lost + (1 if e.reason == "lost" else 0)
    failure = job.failure
    if not ok and not failure and e.reason != "lost":
        how = f"exit {e.exit_code}" if e.exit_code is not None else f"signal {e.signal}"
        failure = f"rank {e.rank} {e.reason} ({how})"
    state.jobs[e.job_id] = replace(
        job, started=started, live=live, exited_ok=job.exited_ok + ok, lost=lost, failure=failure
    )


def _job_running(state: ClusterState, e: JobRunning) -> None:
    if _stale(state, e.event_id, e.epoch, unstamped_ok=True):
        return
    job = _active(state, e.job_id, e.attempt)
    if job is None or job.status != "reserved":
        return
    state.jobs[e.job_id] = replace(job, status="running", running_at=e.occurred_at)


def _checkpointed(state: ClusterState, e: Checkpointed) -> None:
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
        ckpt = Checkpoint(path=e.path, step=e.step, attempt=e.attempt, rank=e.rank)
        state.jobs[e.job_id] = replace(job, checkpoint=ckpt)


def _preemption_requested(state: ClusterState, e: PreemptionRequested) -> None:
    if _stale(state, e.event_id, e.epoch, unstamped_ok=False):
        return
    job = _active(state, e.job_id, e.attempt)
    if job is None or job.status == "preempting":
        return
    preemptor = state.jobs.get(e.preemptor_job_id)
    if preemptor is None or preemptor.status != "pending":
        _void(state, e.event_id, f"preemptor {e.preemptor_job_id} is not pending")
        return  # it was cancelled or placed meanwhile: the victim keeps running
    state.jobs[e.job_id] = replace(
        job, status="preempting", preemptor=e.preemptor_job_id, preempt_at=e.occurred_at, preempt_grace_s=e.grace_s
    )
    plan = e.earmark or job.placement
    if plan == preemptor.earmark:
        return
    _clear_earmark(state, preemptor)
    _set_earmark(state, plan, e.preemptor_job_id)
    state.jobs[e.preemptor_job_id] = replace(preemptor, earmark=plan)


def _requeue(
    state: ClusterState, job: Job, attempt: int, resume_from: str | None, at: float, *, rejoin: bool
) -> None:
    """Release the gang and put the job back in line as `attempt`.

    `rejoin` (a preemption): its place is now, behind what queued before -- as
    Kueue, by default, orders a workload it evicted for not starting in time
    by the eviction. Otherwise (node failure, lost workers) it lost its GPUs
    through no choice of the scheduler and keeps its submit-time place.
    """
    _release(state, job, at)
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
        resume_from=resume_from,
        preemptor="",
        preempt_at=0.0,
        preempt_grace_s=0.0,
        waiting=None,
        rejoined_at=at if rejoin else job.rejoined_at,
    )
    _enqueue(state, job)


def _preempted(state: ClusterState, e: Preempted) -> None:
    if _stale(state, e.event_id, e.epoch, unstamped_ok=True):
        return
    job = _active(state, e.job_id, e.attempt)
    if job is None or job.status != "preempting":
        return
    _requeue(state, job, job.attempt + 1, e.resume_from or job.newest_checkpoint, e.occurred_at, rejoin=True)


def _job_requeued(state: ClusterState, e: JobRequeued) -> None:
    if _stale(state, e.event_id, e.epoch, unstamped_ok=False):
        return
    job = _active(state, e.job_id, e.attempt - 1)
    if job is None:
        return
    _requeue(state, job, e.attempt, e.resume_from or job.newest_checkpoint, e.occurred_at, rejoin=False)


def _gang_restarted(state: ClusterState, e: GangRestarted) -> None:
    """Same GPUs, next attempt: agents replace every worker of the old attempt."""
    if _stale(state, e.event_id, e.epoch, unstamped_ok=False):
        return
    job = _active(state, e.job_id, e.attempt - 1)
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
        resume_from=job.newest_checkpoint,
    )


def _finish(state: ClusterState, job: Job, status: JobStatus, reason: str, at: float) -> None:
    book = state.ranks.get(job.job_id, {})
    final_ranks = tuple(sorted(book.items())[:FINAL_RANKS_KEPT])
    _release(state, job, at)
    _clear_earmark(state, job)
    _dequeue(state, job)
    state.stopping.pop(job.job_id, None)
    state.checkpoint_votes.pop(job.job_id, None)
    state.jobs[job.job_id] = replace(
        job, status=status, gpus=0, finished_at=at, end_reason=reason, earmark=(), live=0, final_ranks=final_ranks
    )
    _retire(state, job.job_id)


def _retire(state: ClusterState, job_id: str) -> None:
    """Remember a finished job; past FINISHED_KEPT drop the oldest ones (in batches: O(1) amortised)."""
    state.finished[job_id] = state.seq
    excess = len(state.finished) - FINISHED_KEPT
    if excess > FINISHED_KEPT // 10:
        order = list(state.finished)
        for jid in order[:excess]:
            state.jobs.pop(jid, None)
        state.finished = {jid: state.finished[jid] for jid in order[excess:]}


def _job_completed(state: ClusterState, e: JobCompleted) -> None:
    if _stale(state, e.event_id, e.epoch, unstamped_ok=True):
        return
    job = _active(state, e.job_id, e.attempt)
    if job is not None:
        record_run(state.durations, job, e.occurred_at)  # learned run times (estimates.py)
        _finish(state, job, "completed", "", e.occurred_at)


def _job_failed(state: ClusterState, e: JobFailed) -> None:
    if _stale(state, e.event_id, e.epoch, unstamped_ok=True):
        return
    job = state.jobs.get(e.job_id)
    if job is None or job.status in TERMINAL or job.attempt != e.attempt:
        return
    _finish(state, job, "failed", e.reason, e.occurred_at)


def _cancel_requested(state: ClusterState, e: CancelRequested) -> None:
    if _stale(state, e.event_id, e.epoch, unstamped_ok=True):
        return  # (a user's cancel is unstamped; the scheduler's own stops carry its epoch)
    job = state.jobs.get(e.job_id)
    if job is None or job.status in TERMINAL or job.stop is not None:
        return
    stop = Stop(
        reason=e.reason, requested_by=e.requested_by, requested_at=e.occurred_at, fail=e.requested_by == SCHEDULER
    )
    state.stopping[e.job_id] = job.submit_seq
    state.jobs[e.job_id] = replace(job, stop=stop)
    state.freed_seq = state.seq  # it ends sooner than its time limit said


def _job_cancelled(state: ClusterState, e: JobCancelled) -> None:
    if _stale(state, e.event_id, e.epoch, unstamped_ok=True):
        return
    job = state.jobs.get(e.job_id)
    if job is None or job.status in TERMINAL:
        return
    _finish(state, job, "cancelled", e.reason, e.occurred_at)


# --- GPUs --------------------------------------------------------------------


def _set_owner(state: ClusterState, ranks: tuple[RankPlacement, ...], owner: str) -> None:
    for rp in ranks:
        if rp.gpus:
            owners = list(state.owners[rp.node_id])
            for g in rp.gpus:
                owners[g] = owner
            state.owners[rp.node_id] = tuple(owners)


def _release(state: ClusterState, job: Job, at: float) -> None:
    """Free the job's GPUs (only those it still owns) and uncharge its queue."""
    if job.job_id not in state.active:
        return
    state.freed_seq = state.seq
    for rp in job.placement:
        current = state.owners.get(rp.node_id)
        if current is None or not rp.gpus:
            continue
        owners = list(current)
        for g in rp.gpus:
            if g < len(owners) and owners[g] == job.job_id:
                owners[g] = FREE
        state.owners[rp.node_id] = tuple(owners)
    charge(state, job.queue, -job.gpus, at)
    del state.active[job.job_id]
    key = job.end_key
    i = bisect_left(state.ends, key)
    if i < len(state.ends) and state.ends[i] == key:
        del state.ends[i]
        _end_changed(state, key, False)
    state.ranks.pop(job.job_id, None)


#: `ClusterState.ends_changes` keeps between this many changes and twice as many.
ENDS_CHANGES_KEPT = 256


def _end_changed(state: ClusterState, key: tuple[float, float, str], added: bool) -> None:
    changes = state.ends_changes
    changes.append((state.seq, key, added))
    if len(changes) > 2 * ENDS_CHANGES_KEPT:
        state.ends_dropped = changes[-ENDS_CHANGES_KEPT - 1][0]
        del changes[:-ENDS_CHANGES_KEPT]


def _set_earmark(state: ClusterState, ranks: tuple[RankPlacement, ...], job_id: str) -> None:
    for rp in ranks:
        size = len(state.owners.get(rp.node_id, ()))
        if not rp.gpus or size == 0:
            continue
        marks = list(state.earmarks.get(rp.node_id) or (FREE,) * size)
        for g in rp.gpus:
            if g < size and marks[g] == FREE:
                marks[g] = job_id
        state.earmarks[rp.node_id] = tuple(marks)


def _clear_earmark(state: ClusterState, job: Job) -> None:
    if job.earmark:
        state.freed_seq = state.seq
    for rp in job.earmark:
        marks = state.earmarks.get(rp.node_id)
        if marks is None:
            continue
        cleared = tuple(FREE if m == job.job_id else m for m in marks)
        if any(m != FREE for m in cleared):
            state.earmarks[rp.node_id] = cleared
        else:
            del state.earmarks[rp.node_id]


# --- nodes and queues ----------------------------------------------------------


def _node_registered(state: ClusterState, e: NodeRegistered) -> None:
    state.freed_seq = state.seq
    size = e.inventory.gpu_count
    old = state.nodes.get(e.node_id)
    if old is None:
        state.nodes[e.node_id] = Node(
            node_id=e.node_id,
            incarnation=e.incarnation,
            address=e.address,
            inventory=e.inventory,
            registered_at=e.occurred_at,
        )
        state.newest_node_at = max(state.newest_node_at, e.occurred_at)
        state.owners[e.node_id] = (FREE,) * size
        return
    # A re-registration (agent restart, new inventory): keep owners of GPUs that still exist;
    # a gang holding a GPU that disappeared has lost a rank, and decide requeues it.
    owners = state.owners.get(e.node_id, ())
    for owner in dict.fromkeys(owners[size:]):
        job = state.jobs.get(owner)
        if job is not None and owner in state.active:
            state.jobs[owner] = replace(job, lost=job.lost + 1)
            state.watch[owner] = job.submit_seq
    state.owners[e.node_id] = tuple(owners[:size]) + (FREE,) * max(0, size - len(owners))
    marks = state.earmarks.get(e.node_id)
    if marks is not None:
        state.earmarks[e.node_id] = tuple(marks[:size]) + (FREE,) * max(0, size - len(marks))
    state.nodes[e.node_id] = replace(
        old, incarnation=e.incarnation, address=e.address, inventory=e.inventory, failed=False
    )


def _node_failed(state: ClusterState, e: NodeFailed) -> None:
    if _stale(state, e.event_id, e.epoch, unstamped_ok=True):
        return  # a paused leader judged heartbeat ages by its own stale clock
    node = state.nodes.get(e.node_id)
    if node is None or node.failed or (e.incarnation and e.incarnation != node.incarnation):
        return  # unknown, already failed, or about an older incarnation
    state.nodes[e.node_id] = replace(node, failed=True)


def _node_recovered(state: ClusterState, e: NodeRecovered) -> None:
    node = state.nodes.get(e.node_id)
    if node is None or not node.failed:
        return
    state.freed_seq = state.seq
    state.nodes[e.node_id] = replace(node, failed=False, incarnation=e.incarnation or node.incarnation)


def _node_cordon(state: ClusterState, node_id: str, cordoned: bool) -> None:
    node = state.nodes.get(node_id)
    if node is not None and node.cordoned != cordoned:
        state.nodes[node_id] = replace(node, cordoned=cordoned)
        if not cordoned:
            state.freed_seq = state.seq


def _queue_deleted(state: ClusterState, e: QueueDeleted) -> None:
    """The definition goes; usage charged to the queue stays until its gangs end (their `queue` names it)."""
    if state.queues.pop(e.queue, None) is not None:
        recompute_trees(state)


def _queue_defined(state: ClusterState, e: QueueDefined) -> None:
    old = state.queues.get(e.queue)
    new = Queue(
        name=e.queue, weight=e.weight, guaranteed_gpus=e.guaranteed_gpus, limit_gpus=e.limit_gpus, parent=e.parent
    )
    state.queues[e.queue] = new
    if old is None or old.parent != new.parent:
        recompute_trees(state)
