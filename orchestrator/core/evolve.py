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

This module holds the one exhaustive match over event types; each case's fold
lives by what it is about: evolve_jobs (a job's lifecycle and its queue line),
evolve_workers (agents' worker and checkpoint reports), evolve_cluster (nodes,
queues, settings), evolve_fencing (stale epochs, elections), evolve_gpus
(GPU owners, earmarks, gang ends), staging (datasets: warm nodes, each
attempt's staging phase), and the day-two controls (issue #41): updates,
requeues and evolve_reserved.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import assert_never

from orchestrator.core import gating
from orchestrator.core.caches import cache_evicted, cache_listed, cache_used
from orchestrator.core.evolve_cluster import (
    cluster_configured,
    node_cordon,
    node_failed,
    node_recovered,
    node_registered,
    queue_defined,
    queue_deleted,
)
from orchestrator.core.evolve_fencing import scheduler_elected
from orchestrator.core.evolve_health import gpu_healthy, gpu_unhealthy, node_health_checked
from orchestrator.core.evolve_jobs import (
    cancel_requested,
    gang_reserved,
    gang_restarted,
    job_cancelled,
    job_completed,
    job_failed,
    job_rejected,
    job_requeued,
    job_running,
    job_submitted,
    job_waiting,
    preempted,
    preemption_requested,
    unreadable,
)
from orchestrator.core.evolve_nodework import track_due, work_assigned, work_changed, worker_reported
from orchestrator.core.evolve_reserved import reservation_created, reservation_deleted
from orchestrator.core.evolve_workers import checkpointed, worker_exited, worker_started
from orchestrator.core.model.state import ClusterState, needs_look
from orchestrator.core.requeues import requeue_requested
from orchestrator.core.staging import (
    dataset_evicted,
    dataset_failed,
    dataset_ready,
    dataset_staging,
    evict_requested,
    node_datasets,
)
from orchestrator.core.updates import job_updated, update_requested
from schemas.events import (
    AnyEvent,
    CancelRequested,
    Checkpointed,
    ClusterConfigured,
    DatasetEvicted,
    DatasetEvictRequested,
    DatasetFailed,
    DatasetReady,
    DatasetStaging,
    GangReserved,
    GangRestarted,
    GpuHealthy,
    GpuUnhealthy,
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobHeld,
    JobRejected,
    JobReleased,
    JobRequeued,
    JobRunning,
    JobSubmitted,
    JobUpdated,
    JobUpdateRequested,
    JobWaiting,
    NodeCordoned,
    NodeDatasets,
    NodeFailed,
    NodeHealthChecked,
    NodeRecovered,
    NodeRegistered,
    NodeUncordoned,
    Preempted,
    PreemptionRequested,
    QueueDefined,
    QueueDeleted,
    RequeueRequested,
    ReservationCreated,
    ReservationDeleted,
    SchedulerElected,
    Unknown,
    WorkAssigned,
    WorkChanged,
    WorkerExited,
    WorkerStarted,
)

#: Events whose fold never changes node records, GPU owners or `ends`, nor earmarks but for the one place
#: that moves `alloc_rev` itself (a JobWaiting that releases a preemptor's earmark): every other event
#: moves `ClusterState.alloc_rev` (node events `nodes_rev` too), which decide's per-call memos
#: trust. tests/core/test_memos.py checks both lists against every event of simulated logs.
_ALLOCATION_UNTOUCHED = (
    WorkerStarted, WorkerExited, JobSubmitted, JobRunning, JobWaiting, Checkpointed,
    QueueDefined, SchedulerElected, ClusterConfigured, Unknown, WorkAssigned, WorkChanged,
)
#: Events about a job that never change what its nodes should be told (core/orders.py: `wanted`): the fold
#: does not look at `orders_due` for them. (A start moves no rank out of "exited" in the orders' sense.)
_WANT_UNTOUCHED = (JobSubmitted, JobWaiting, WorkerStarted, Checkpointed, DatasetStaging, JobHeld, JobReleased,
                   JobRunning, JobUpdateRequested)
_NODE_EVENTS = (NodeRegistered, NodeFailed, NodeRecovered, NodeCordoned, NodeUncordoned, GpuUnhealthy, GpuHealthy,
                NodeHealthChecked, DatasetReady, DatasetEvicted, NodeDatasets, DatasetEvictRequested)


def evolve(state: ClusterState, event: AnyEvent | Unknown, seq: int = 0, at: float | None = None) -> ClusterState:
    """Apply `event` (at stream position `seq`, or the next one; stored at time `at`) in place and return the state.

    Which clock dates an event (#30): `at`, when the stream stored it (the Envelope's stream_time,
    one server's clock for every publisher), for the readers that judge time across machines (the
    scheduler and the agents: a reservation's age, a stop's grace, a restart's backoff are then
    never one machine's wall clock against another's). Without it (a simulation, an event-only
    file, a reporting reader such as the CLI or the index, which keep a loaded log's history) the
    event's own `occurred_at`, exactly as before.
    """
    state.seq = seq if seq > 0 else state.seq + 1
    voids = state.voids
    t = at if at is not None else getattr(event, "occurred_at", 0.0)
    # Ordered by frequency in a busy log: worker events dominate.
    match event:
        case WorkerStarted():
            worker_started(state, event, t)
            worker_reported(state, event, t)
        case WorkerExited():
            worker_exited(state, event, t)
            worker_reported(state, event, t)
        case GangReserved():
            gang_reserved(state, event, t)
        case JobSubmitted():
            job_submitted(state, event, t)
        case JobRunning():
            job_running(state, event, t)
        case JobCompleted():
            job_completed(state, event, t)
        case JobWaiting():
            job_waiting(state, event, t)
        case Checkpointed():
            checkpointed(state, event)
        case PreemptionRequested():
            preemption_requested(state, event, t)
        case Preempted():
            preempted(state, event, t)
        case GangRestarted():
            gang_restarted(state, event, t)
        case JobRequeued():
            job_requeued(state, event, t)
        case JobFailed():
            job_failed(state, event, t)
        case CancelRequested():
            cancel_requested(state, event, t)
        case JobCancelled():
            job_cancelled(state, event, t)
        case JobRejected():
            job_rejected(state, event, t)
        case NodeRegistered():
            node_registered(state, event, t)
        case NodeFailed():
            node_failed(state, event)
        case NodeRecovered():
            node_recovered(state, event)
        case NodeCordoned():
            node_cordon(state, event.node_id, True)
        case NodeUncordoned():
            node_cordon(state, event.node_id, False)
        case QueueDefined():
            queue_defined(state, event)
        case QueueDeleted():
            queue_deleted(state, event)
        case SchedulerElected():
            scheduler_elected(state, event)
        case ClusterConfigured():
            cluster_configured(state, event)
        case JobHeld():
            gating.held(state, event)
        case JobReleased():
            gating.released(state, event)
        case GpuUnhealthy():
            gpu_unhealthy(state, event)
        case GpuHealthy():
            gpu_healthy(state, event)
        case NodeHealthChecked():
            node_health_checked(state, event)
        case DatasetStaging():
            dataset_staging(state, event, t)
        case DatasetReady():
            dataset_ready(state, event, t)
            cache_used(state, event, t)
        case DatasetFailed():
            dataset_failed(state, event, t)
        case DatasetEvicted():
            dataset_evicted(state, event)
            cache_evicted(state, event)
        case NodeDatasets():
            node_datasets(state, event)
            cache_listed(state, event)
        case DatasetEvictRequested():
            evict_requested(state, event, state.seq)
        case WorkAssigned():
            work_assigned(state, event, state.seq)
        case WorkChanged():
            work_changed(state, event)
        case JobUpdateRequested():  # (JobUpdateByOperator too: core/updates.py tells them apart)
            update_requested(state, event)
        case JobUpdated():
            job_updated(state, event)
        case RequeueRequested():
            requeue_requested(state, event, t)
        case ReservationCreated():
            reservation_created(state, event)
        case ReservationDeleted():
            reservation_deleted(state, event)
        case Unknown():
            unreadable(state, event)
        case _:
            assert_never(event)
    if not isinstance(event, _ALLOCATION_UNTOUCHED) and state.voids == voids:  # (a void one changes nothing)
        state.alloc_rev += 1
        if isinstance(event, _NODE_EVENTS):
            state.nodes_rev += 1
    jid = getattr(event, "job_id", None)
    if jid is not None:
        _track(state, jid)
        if not isinstance(event, _WANT_UNTOUCHED):
            track_due(state, jid)
    return state


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
