"""The v1 event catalogue: every fact corral records.

Evolution rules (see DESIGN.md): only add fields with defaults; a breaking
change gets a new tag plus an upcaster in `codec.py`. Tags are stable strings,
never Python paths, so renaming a class never breaks an old log.

Fencing: every event a scheduler authors has an `epoch`, the leader epoch it
was decided under; the fold voids one older than the newest SchedulerElected
(orchestrator/core/evolve.py says how an unstamped 0 in an old log is read).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

import msgspec
from msgspec import UNSET, UnsetType

from schemas.inventory import Inventory
from schemas.jobspec import JobSpec


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", gc=False):
    """Base of every event. Frozen and acyclic (no field can lead back to the event), hence
    gc=False, like every schema record: the cyclic GC need not track them (orchestrator/core/model/state.py)."""

    event_id: str
    #: Publisher wall clock, seconds since the epoch.
    occurred_at: float


# --- job ---------------------------------------------------------------------


class JobSubmitted(Event, tag="JobSubmitted", frozen=True):
    job_id: str
    spec: JobSpec
    submitted_by: str = ""


class JobRejected(Event, tag="JobRejected", frozen=True):
    job_id: str
    reasons: tuple[str, ...]
    epoch: int = 0


class RankPlacement(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    rank: int
    node_id: str
    gpus: tuple[int, ...]


class GangReserved(Event, tag="GangReserved", frozen=True):
    """The scheduler's decision: every rank of `attempt` placed at once.

    Void (changes nothing) if any GPU is not free at its log position or
    `epoch` is older than the newest SchedulerElected.
    """

    job_id: str
    attempt: int
    epoch: int
    ranks: tuple[RankPlacement, ...]
    master_port: int = 29500
    reason: str = ""


class JobWaiting(Event, tag="JobWaiting", frozen=True, omit_defaults=True):
    """Why a job is still pending; appended only when the reason changes."""

    job_id: str
    code: str
    message: str
    epoch: int = 0
    #: Code "backfill_head": the GPUs held for the gang and when it is expected to start there.
    #: The log keeps the reservation, so every scheduler (a restarted one too) plans around it.
    hold_ranks: tuple[RankPlacement, ...] = ()
    hold_until: float = 0.0
    #: Code "backfill_head" without a time-limited end: the running gangs its start waits for (#41), so a
    #: reader tells the start from their ends as they are now (`corral job`, `corral explain`).
    behind: tuple[str, ...] = ()


class WorkerStarted(Event, tag="WorkerStarted", frozen=True):
    job_id: str
    attempt: int
    rank: int
    node_id: str
    worker_id: str = ""
    restarts: int = 0
    #: The GPUs (node-local indexes) the worker was given; () when not known (an adopted worker).
    gpus: tuple[int, ...] = ()


class WorkerExited(Event, tag="WorkerExited", frozen=True):
    job_id: str
    attempt: int
    rank: int
    node_id: str
    exit_code: int | None = None
    signal: int | None = None
    #: completed | crashed | killed | preempted | cancelled | lost | unstartable (not restarted; why: log_tail)
    reason: str = "completed"
    log_tail: str = ""
    restarts: int = 0
    #: The agent will restart this rank itself (restart policy `rank`).
    will_restart: bool = False
    #: A preempted worker that saved no checkpoint after the checkpoint signal: why ("" when it saved one,
    #: or was not asked to), e.g. "exited 1 while checkpointing: OSError: [Errno 28] No space left on device".
    checkpoint_error: str = ""
    #: With `checkpoint_error`: the steps since the checkpoint it will resume from, where the worker said
    #: how far it got (a `CORRAL_STEP=N` line in its output); -1 when not known.
    steps_lost: int = -1


class JobRunning(Event, tag="JobRunning", frozen=True):
    job_id: str
    attempt: int
    epoch: int = 0


class PreemptionRequested(Event, tag="PreemptionRequested", frozen=True):
    job_id: str
    attempt: int
    preemptor_job_id: str
    reason: str
    grace_s: float
    epoch: int = 0
    #: The preemptor's planned placement: its GPUs are earmarked for the preemptor
    #: (nobody else may take them) until it is reserved. Empty: the victim's GPUs.
    earmark: tuple[RankPlacement, ...] = ()


class Checkpointed(Event, tag="Checkpointed", frozen=True):
    job_id: str
    attempt: int
    rank: int
    step: int
    path: str
    #: The reporting agent's node ("" in logs written before #40): its subject names it (events/subjects.py).
    node_id: str = ""


class Preempted(Event, tag="Preempted", frozen=True):
    job_id: str
    attempt: int
    preemptor_job_id: str = ""
    resume_from: str | None = None
    epoch: int = 0


class GangRestarted(Event, tag="GangRestarted", frozen=True):
    """All ranks restart together on the same GPUs as `attempt` (the new one)."""

    job_id: str
    attempt: int
    reason: str = ""
    epoch: int = 0
    #: The scheduler's `occurred_at` plus the restart backoff: no agent starts a worker of `attempt`
    #: before it (0: at once). Readers take `not_before - occurred_at` as the backoff (one machine's
    #: clock) and count it from the event's stream time (#30), so every node of the gang waits the same.
    not_before: float = 0.0


class JobRequeued(Event, tag="JobRequeued", frozen=True):
    """The gang lost its GPUs (node failure, lost workers) and waits again as `attempt`."""

    job_id: str
    attempt: int
    reason: str
    resume_from: str | None = None
    epoch: int = 0


class JobCompleted(Event, tag="JobCompleted", frozen=True):
    job_id: str
    attempt: int
    epoch: int = 0


class JobFailed(Event, tag="JobFailed", frozen=True):
    job_id: str
    attempt: int
    reason: str
    epoch: int = 0


class CancelRequested(Event, tag="CancelRequested", frozen=True):
    job_id: str
    reason: str = ""
    requested_by: str = ""
    epoch: int = 0


class JobCancelled(Event, tag="JobCancelled", frozen=True):
    job_id: str
    reason: str = ""
    epoch: int = 0


class JobHeld(Event, tag="JobHeld", frozen=True):
    """A user keeps a pending job from starting until JobReleased (`corral hold`); no change for a
    job not pending. A reader older than this event skips it (Unknown), as it skips any new tag."""

    job_id: str
    requested_by: str = ""
    reason: str = ""


class JobReleased(Event, tag="JobReleased", frozen=True):
    """A held job may start again (`corral release`), once its dependencies and array allow."""

    job_id: str
    requested_by: str = ""


# --- day-two controls (issue #41) ---------------------------------------------
# `corral update`, `corral requeue`, `corral reservation`: requests a client (or an operator) appends, and
# the scheduler's fenced answer where the change needs one (README, "Day-two controls").


class FieldChange(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One field of a job changed by JobUpdated: its name (a JobSpec field) and its value before and after
    (None: no limit, for `time_limit_s`)."""

    field: str
    old: int | float | str | None = None
    new: int | float | str | None = None


class JobUpdateRequested(Event, tag="JobUpdateRequested", frozen=True, omit_defaults=True):
    """A user asks to change a job (`corral update`, like Slurm's `scontrol update`): None leaves a field as it is.

    The scheduler answers with JobUpdated (applied, old -> new) or JobUpdated.refused. A pending job may
    change its priority, time limit and queue; a running one its time limit, lower only (raising it is
    JobUpdateByOperator's: Slurm lets only an operator raise a running job's limit).
    """

    job_id: str
    requested_by: str = ""
    priority: int | None = None
    time_limit_s: float | None = None
    queue: str | None = None
    reason: str = ""


class JobUpdateByOperator(JobUpdateRequested, tag="JobUpdateByOperator", frozen=True, omit_defaults=True):
    """JobUpdateRequested from an operator (`corral update --operator`, the admin role's subject only): it may
    also raise a running job's time limit."""


class JobUpdated(Event, tag="JobUpdated", frozen=True, omit_defaults=True):
    """The scheduler's answer to a JobUpdateRequested (`request_id`): the fields it changed, old -> new, or
    `refused` (why nothing changed). Fenced by epoch; void if the job changed meanwhile so the change no
    longer holds (the fold checks it again)."""

    job_id: str
    request_id: str
    epoch: int
    requested_by: str = ""
    changes: tuple[FieldChange, ...] = ()
    refused: str = ""


class RequeueRequested(Event, tag="RequeueRequested", frozen=True, omit_defaults=True):
    """A user puts a job back in the queue (`corral requeue`, like Slurm's `scontrol requeue`).

    A job holding GPUs is stopped (signal, grace, kill) and the scheduler appends JobRequeued: it waits again
    as its next attempt, from its newest checkpoint, its restarts unspent. A finished one (completed, failed,
    cancelled; not an array element) is pending again at once as its next attempt. No change for others.
    """

    job_id: str
    requested_by: str = ""
    reason: str = ""


class ReservationCreated(Event, tag="ReservationCreated", frozen=True, omit_defaults=True):
    """Nodes set aside over [start, end) (`corral reservation create`, like Slurm's `scontrol create
    reservation`): no new work lands on them over the window, nor work whose time limit would reach into it,
    except jobs that name the reservation (JobSpec.reservation) from its users (any user when empty) and
    queue (any when None). Times are Unix seconds. A second one with the same name replaces it."""

    name: str
    nodes: tuple[str, ...]
    start: float
    end: float
    users: tuple[str, ...] = ()
    queue: str | None = None
    created_by: str = ""
    reason: str = ""


class ReservationDeleted(Event, tag="ReservationDeleted", frozen=True, omit_defaults=True):
    """The reservation's nodes are back to everyone; jobs that name it are rejected."""

    name: str
    deleted_by: str = ""


# --- node --------------------------------------------------------------------


class NodeRegistered(Event, tag="NodeRegistered", frozen=True):
    node_id: str
    incarnation: str
    address: str
    inventory: Inventory


class NodeFailed(Event, tag="NodeFailed", frozen=True):
    node_id: str
    incarnation: str
    reason: str = ""
    epoch: int = 0


class NodeRecovered(Event, tag="NodeRecovered", frozen=True):
    node_id: str
    incarnation: str


class NodeCordoned(Event, tag="NodeCordoned", frozen=True):
    node_id: str
    reason: str = ""


class NodeUncordoned(Event, tag="NodeUncordoned", frozen=True):
    node_id: str


#: GpuUnhealthy.severity: a fatal fault takes the GPU out of service; a warning is only recorded.
GPU_FATAL = "fatal"
GPU_WARNING = "warning"


class GpuUnhealthy(Event, tag="GpuUnhealthy", frozen=True):
    """A GPU is faulty (the node agent's health watch, or an operator's `corral gpu drain`).

    A fatal one is never placed again until a GpuHealthy; a gang running on it
    is requeued from its checkpoint without spending its restarts (the fault is
    the hardware's). A node with `ClusterConfigured.drain_unhealthy_gpus` such
    GPUs is drained for new work. A warning (throttling, a warning Xid) changes
    nothing but is in the log for `corral explain` and `corral tail`.
    """

    node_id: str
    gpu_index: int
    gpu_uuid: str = ""
    #: What was seen, for humans: "Xid 79 (GPU has fallen off the bus)", "drained by alice: bad fan".
    reason: str = ""
    #: The Xid, when an Xid event was the cause.
    xid: int | None = None
    #: The NVML counter that rose, when one did (e.g. "ecc_dbe_volatile"), and its new value.
    counter: str = ""
    value: int = 0
    severity: str = GPU_FATAL
    #: The job whose worker ran on the GPU when the agent saw the fault ("" if none). Not `job_id`:
    #: the event is about the node (its subject), and the fold finds the gang from the GPU's owner.
    running_job: str = ""
    #: "agent" (health watch) or "operator" (`corral gpu drain`).
    source: str = "agent"


class GpuHealthy(Event, tag="GpuHealthy", frozen=True):
    """A GPU is back in service (after a reset, or an operator's `corral gpu undrain`)."""

    node_id: str
    gpu_index: int
    gpu_uuid: str = ""
    reason: str = ""
    source: str = "agent"


class NodeHealthChecked(Event, tag="NodeHealthChecked", frozen=True):
    """The operator's health-check command changed its verdict on a node (like Slurm's HealthCheckProgram).

    Appended by the node's agent only when the verdict differs from the log's: a
    failed check drains the node for new work (its output says why); a passing
    one after it brings the node back.
    """

    node_id: str
    ok: bool
    exit_code: int | None = None
    #: The check's output (its tail), shown as the node's drain reason.
    output: str = ""


# --- a node's orders (issue #40) ----------------------------------------------
# Each agent reads only its node's subjects (corral.node.<node>.>, its own reports, corral.sched.>), so the
# scheduler tells each node, on the node's own subject, what the decisions above mean for it: the node's
# slice of a gang, and later what to do with it. They are follow-ups of decisions the fold took (never sent
# before the GangReserved is folded), fenced by epoch like every decision, and derived: the fold knows what
# each node was told (`ClusterState.slices`), so any leader sends exactly what is missing.

#: WorkAssigned/WorkChanged.intent: keep the ranks running (start them once `staged`), checkpoint them and
#: exit within `grace_s` (a preemption), stop them (a cancel, a time limit), or (WorkChanged only) forget the
#: attempt here: its ranks are unwanted (the attempt ended or moved).
INTENT_RUN = "run"
INTENT_CHECKPOINT = "checkpoint"
INTENT_STOP = "stop"
INTENT_RELEASE = "release"


class WorkAssigned(Event, tag="WorkAssigned", frozen=True):
    """One node's part of an attempt: its ranks, and what each rank's environment needs from the whole gang.

    Replaces whatever the node was told about an earlier attempt of the job. The node leaves the job by
    itself once every one of `ranks` exited for good, or when told WorkChanged(release).
    """

    node_id: str
    job_id: str
    attempt: int
    epoch: int
    spec: JobSpec
    #: This node's ranks, ascending (their GPUs are the node-local indexes).
    ranks: tuple[RankPlacement, ...]
    world_size: int
    #: This node's index among the gang's nodes in the order of their first rank (NODE_RANK).
    node_rank: int = 0
    #: Rank 0's node address (MASTER_ADDR) and the gang's port.
    master_addr: str = ""
    master_port: int = 29500
    resume_from: str | None = None
    #: Stream time before which no rank starts (a gang restart's backoff, on the fold's clock); 0: none.
    not_before: float = 0.0
    #: Every node of the gang holds every dataset of the attempt: the ranks may start.
    staged: bool = True
    intent: str = INTENT_RUN
    #: Grace before the kill, with intent checkpoint (the preemption's) or stop.
    grace_s: float = 0.0
    #: Those of `ranks` whose exit the log holds already (an exit the node reported before this order reached
    #: it): never started again. UNSET (not written) when none, as in logs from before it existed.
    exited: tuple[int, ...] | UnsetType = UNSET


class WorkChanged(Event, tag="WorkChanged", frozen=True):
    """What a node is to do with the ranks it was assigned for `attempt` changed (see INTENT_*)."""

    node_id: str
    job_id: str
    attempt: int
    epoch: int
    intent: str
    staged: bool = True
    grace_s: float = 0.0
    reason: str = ""


# --- datasets (issue #33) -----------------------------------------------------
# Agents stage a job's datasets (JobSpec.datasets) into a node-local cache before its ranks start.
# `dataset` is the spec's name for it, `key` its cache key (schemas/datasets.py: the same on every node).


class DatasetStaging(Event, tag="DatasetStaging", frozen=True):
    """A node is staging one dataset of an attempt: progress, at a bounded rate (the first one starts the phase)."""

    job_id: str
    attempt: int
    node_id: str
    dataset: str
    key: str
    bytes_done: int = 0
    #: 0 while not known (a download without a length).
    bytes_total: int = 0


class DatasetReady(Event, tag="DatasetReady", frozen=True):
    """A node holds one dataset of an attempt, complete and verified: the gang starts once every node
    told this for every dataset. `cached`: it was in the node's cache already (0 bytes staged)."""

    job_id: str
    attempt: int
    node_id: str
    dataset: str
    key: str
    size_bytes: int = 0
    cached: bool = False
    #: Bytes this staging copied or downloaded (0 for a cache hit).
    staged_bytes: int = 0


class DatasetFailed(Event, tag="DatasetFailed", frozen=True):
    """A node could not stage a dataset (unreachable source, digest mismatch, cache full): the attempt ends
    as a failed one, restarted with backoff up to the job's `max_restarts`."""

    job_id: str
    attempt: int
    node_id: str
    dataset: str
    reason: str
    key: str = ""
    #: The same source fails the same way anywhere (a hostile or oversized archive, a limit passed): the job
    #: fails at once with the reason, never restarted onto another node (#39).
    permanent: bool = False


class DatasetEvicted(Event, tag="DatasetEvicted", frozen=True):
    """A node's cache dropped an entry (least recently used, none of its jobs using it)."""

    node_id: str
    key: str
    size_bytes: int = 0
    reason: str = ""


class DatasetEvictRequested(Event, tag="DatasetEvictRequested", frozen=True):
    """An operator asks a node to drop a dataset from its cache (`corral datasets evict`, #41).

    The node's agent evicts it once no job placed on the node uses it, and says so with a DatasetEvicted of
    the key (a key it does not hold: at once, 0 bytes), which ends the request in every fold.
    """

    node_id: str
    key: str
    requested_by: str = ""
    reason: str = ""


class CachedDataset(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One entry of a node's dataset cache."""

    key: str
    size_bytes: int = 0
    #: The agent's wall clock when a job last used it (for `corral nodes --datasets`; LRU is the agent's).
    last_used: float = 0.0


class NodeDatasets(Event, tag="NodeDatasets", frozen=True):
    """What a node's dataset cache holds (its agent, on start once reconciled): the fold's view of
    which node is warm for which dataset is this, plus later DatasetReady / DatasetEvicted."""

    node_id: str
    datasets: tuple[CachedDataset, ...] = ()
    #: The cache's size limit (0: none).
    capacity_bytes: int = 0


# --- queue -------------------------------------------------------------------


class QueueDefined(Event, tag="QueueDefined", frozen=True):
    queue: str
    weight: float = 1.0
    guaranteed_gpus: int = 0
    #: None: no limit beyond the cluster.
    limit_gpus: int | None = None
    parent: str | None = None


class QueueDeleted(Event, tag="QueueDeleted", frozen=True):
    """The queue is no longer defined (`corral queue apply --prune`).

    Jobs already charged to it keep their GPUs until they end; a job that names
    it afterwards is treated as one naming any undefined queue (the default
    queue takes it when defined). `corral queue apply --prune` refuses to
    delete a queue jobs still wait in. A later QueueDefined defines it anew.
    """

    queue: str
    reason: str = ""


# --- scheduler ---------------------------------------------------------------


class SchedulerElected(Event, tag="SchedulerElected", frozen=True):
    epoch: int
    scheduler_id: str
    #: The named policy this leader decides with (orchestrator/policies/named.py, `corral scheduler --policy`).
    #: UNSET (not written) in logs from before it existed: those leaders ran corral's.
    policy: str | msgspec.UnsetType = msgspec.UNSET


#: ClusterConfigured.drain_unhealthy_gpus when not set: two faulty GPUs drain a node (issue #32).
DEFAULT_DRAIN_UNHEALTHY_GPUS = 2


class ClusterConfigured(Event, tag="ClusterConfigured", frozen=True):
    """Cluster-wide scheduling settings, in the log so every replay decides alike."""

    #: Topology levels coarse to fine, above "node" (e.g. ("block", "leaf")).
    topology_levels: tuple[str, ...] = ()
    #: Usage half-life for fair share; 0 disables decay.
    fairshare_half_life_s: float = 0.0
    #: A running job younger than this cannot be preempted.
    min_runtime_s: float = 60.0
    default_queue: str = "default"
    epoch: int = 0
    #: A node with this many fatally unhealthy GPUs is drained for new work (0: never by count).
    drain_unhealthy_gpus: int = DEFAULT_DRAIN_UNHEALTHY_GPUS


AnyEvent = (
    JobSubmitted
    | JobRejected
    | GangReserved
    | JobWaiting
    | WorkerStarted
    | WorkerExited
    | JobRunning
    | PreemptionRequested
    | Checkpointed
    | Preempted
    | GangRestarted
    | JobRequeued
    | JobCompleted
    | JobFailed
    | CancelRequested
    | JobCancelled
    | NodeRegistered
    | NodeFailed
    | NodeRecovered
    | NodeCordoned
    | NodeUncordoned
    | QueueDefined
    | QueueDeleted
    | SchedulerElected
    | ClusterConfigured
    | JobHeld
    | JobReleased
    | GpuUnhealthy
    | GpuHealthy
    | NodeHealthChecked
    | DatasetStaging
    | DatasetReady
    | DatasetFailed
    | DatasetEvicted
    | NodeDatasets
    | DatasetEvictRequested
    | WorkAssigned
    | WorkChanged
    | JobUpdateRequested
    | JobUpdateByOperator
    | JobUpdated
    | RequeueRequested
    | ReservationCreated
    | ReservationDeleted
)

EVENT_TYPES: tuple[type[Event], ...] = AnyEvent.__args__
EVENT_TAGS: Mapping[str, type[Event]] = MappingProxyType({t.__struct_config__.tag: t for t in EVENT_TYPES})  # type: ignore[misc]

Entity = Literal["job", "node", "queue", "sched"]


#: Why a message is unreadable (`Unknown.reason`): a closed set, so it can label a metric.
UNREADABLE_REASONS = ("invalid_utf8", "malformed", "unknown_type", "invalid_fields", "upcast_failed")

#: `Unknown.reason` of an event that decoded but does not count: its subject, its type and its entity
#: disagree, so whoever published it had no right to author it (events/authorship.py). Not unreadable:
#: counted apart (`ClusterState.refused_events`, corral_refused_events_total).
REFUSED = "refused"


class Unknown(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What a reader got but could not decode, or decoded and refused (REFUSED); folds to "no change".

    `error` says why for a human (it may quote the payload, so display code
    escapes it); `reason` is one of UNREADABLE_REASONS or REFUSED, for counting.
    """

    raw: bytes
    error: str
    type: str | None = None
    reason: str = "malformed"
    #: The job id of the submission subject (corral.job.<id>.JobSubmitted) it was published on, when that
    #: is where it came: a submission no one can read. The scheduler rejects that job with `error`
    #: (orchestrator/core/reject.py), so a malformed submit is answered with a reason, not silence.
    submitted_as: str = ""


def tag_of(event: Event | Unknown) -> str:
    if isinstance(event, Unknown):
        return event.type or "Unknown"
    return event.__struct_config__.tag  # type: ignore[return-value]


#: Events about one node's work: on the node's subject, though they name a job.
NODE_ORDERS: tuple[type[Event], ...] = (WorkAssigned, WorkChanged)


def entity_of(event: Event) -> tuple[Entity, str]:
    """Which entity an event is about: the middle of its subject."""
    if isinstance(event, NODE_ORDERS):
        return "node", event.node_id  # type: ignore[attr-defined]
    job_id = getattr(event, "job_id", None)
    if job_id is not None:
        return "job", job_id
    node_id = getattr(event, "node_id", None)
    if node_id is not None:
        return "node", node_id
    if isinstance(event, (QueueDefined, QueueDeleted)):
        return "queue", event.queue
    return "sched", ""
