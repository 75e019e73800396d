"""What every reader of the log knows: the cluster state that `evolve` folds.

The fold owns its state: `evolve` applies an event in place and returns the
same object, so a 1,000,000-event replay costs O(1) per event. Every value
inside the collections is a frozen record that is *replaced* on change, never
mutated, so `copy()` only has to copy the dicts, not the records.
The records are `gc=False`: they hold only strings, numbers, tuples and other
such records, so they can never be part of a reference cycle, and a replay
that builds 100,000s of them no longer has Python's cyclic GC scan them over
and over (11% of a 1M-event rebuild's CPU before; bench/RESULTS.md).

The state is a msgspec Struct: `snapshot(state)` is a msgpack byte string and
folding the same log twice gives byte-equal snapshots (dict insertion order
follows the log; nothing here is a set).
"""

from __future__ import annotations

import math
from typing import Literal

import msgspec

from orchestrator.core.model.arrays import ArrayTally
from orchestrator.core.model.reserved import Reservation
from orchestrator.core.model.slices import NodeSlice, RankState, RankStatus, WorkerId
from schemas.events import DEFAULT_DRAIN_UNHEALTHY_GPUS, CachedDataset, RankPlacement
from schemas.inventory import Inventory
from schemas.jobspec import JobSpec

__all__ = ["NodeSlice", "RankState", "RankStatus", "WorkerId"]  # (defined in slices.py, named here too)

JobStatus = Literal["pending", "reserved", "running", "preempting", "completed", "failed", "cancelled", "rejected"]

#: Statuses in which a job holds GPUs (its gang is placed).
HOLDING: frozenset[str] = frozenset({"reserved", "running", "preempting"})
#: Statuses a job never leaves.
TERMINAL: frozenset[str] = frozenset({"completed", "failed", "cancelled", "rejected"})

#: `CancelRequested.requested_by` when the scheduler itself stops a job (time
#: limit, crash without restarts left): the job then ends as JobFailed, not
#: JobCancelled. Agents treat it like any cancel: signal, grace, kill.
SCHEDULER = "corral-scheduler"
#: WorkerExited.reason of a rank its agent could not start for a reason a retry would meet again (its
#: workdir is not on that node): the job fails at once, with the agent's words (`log_tail`) as its reason.
UNSTARTABLE = "unstartable"
#: A WorkerExited reason: its agent stopped it because the node's agent (or `corral up`) was shutting down
#: gracefully (nodeagent/shutdown.py). The gang is requeued from its newest checkpoint, its restarts unspent.
SHUTDOWN = "shutdown"

#: How many finished jobs the state keeps (`corral job` details, duplicate-submit
#: detection). Older ones leave the state, deterministically by finish order, so
#: a long-lived cluster's memory and snapshot stay bounded; their history stays
#: in the log (`corral explain`). A resubmission of an id evicted this way runs
#: as a new job; NATS's duplicate window still catches a retried submit.
FINISHED_KEPT = 10_000

#: How many ranks of a finished job keep their details (`Job.final_ranks`, what `corral job`
#: shows): a 1,000-rank gang keeps its first ones, so 10,000 finished jobs stay bounded.
FINAL_RANKS_KEPT = 64

#: Pending gangs of at least this many GPUs (more than one 8-GPU node) are the ones the starvation
#: bound watches (`ClusterState.big_pending`, core/starving.py): small jobs get in as GPUs free up.
BIG_GANG_GPUS = 9

#: Marks a free GPU in `ClusterState.owners` / an un-earmarked one in `earmarks`.
FREE = ""

#: A pending job's place in its queue's line: higher priority, then the smaller remaining claim
#: (GPU-seconds, `Job.claim`), then the longer wait, then id (issue #29: shortest claim first).
LineKey = tuple[int, float, float, str]

#: An active gang's place in `ClusterState.ends`: (reserved_at + time limit, or inf; reserved_at; job id).
EndKey = tuple[float, float, str]

#: JobWaiting code of the pending gang that holds the backfill reservation (see `ClusterState.holders`).
RESERVING = "backfill_head"


class Config(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """ClusterConfigured settings (the log's copy, so every replay decides alike)."""

    topology_levels: tuple[str, ...] = ()
    fairshare_half_life_s: float = 0.0
    min_runtime_s: float = 60.0
    default_queue: str = "default"
    drain_unhealthy_gpus: int = DEFAULT_DRAIN_UNHEALTHY_GPUS


class GpuFault(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A GPU out of service (a fatal GpuUnhealthy not yet answered by a GpuHealthy)."""

    index: int
    uuid: str = ""
    reason: str = ""
    xid: int | None = None
    source: str = "agent"
    since: float = 0.0
    #: Log position of the GpuUnhealthy.
    seq: int = 0


class EvictRequest(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A dataset a node was asked to drop from its cache (`corral datasets evict`), until it says it did."""

    key: str
    requested_by: str = ""
    #: Log position of the DatasetEvictRequested (the agent's DatasetEvicted names it in its event id).
    seq: int = 0


class Node(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    node_id: str
    incarnation: str
    address: str
    inventory: Inventory
    registered_at: float = 0.0
    cordoned: bool = False
    failed: bool = False
    #: Log position of the NodeFailed that failed it (0 while it is not failed): the agent's
    #: NodeRecovered names it, so a repeated answer dedupes and the next failure gets a new one.
    failed_seq: int = 0
    #: Its GPUs out of service, by index: never placed (evolve voids a reservation that names one).
    gpu_faults: tuple[GpuFault, ...] = ()
    #: Output of the operator's health check while it fails ("" while it passes or never ran).
    health_check: str = ""
    #: Why the node takes no new work by policy ("" if it does): a failed health check, or at
    #: least `Config.drain_unhealthy_gpus` unhealthy GPUs. Derived by the fold (evolve_health).
    drained: str = ""
    #: Cache keys of the datasets its agent holds (schemas/datasets.py), sorted: NodeDatasets, then
    #: DatasetReady adds and DatasetEvicted removes (core/staging.py). Placement prefers such warm nodes.
    datasets: tuple[str, ...] = ()
    #: Evictions asked of its agent (DatasetEvictRequested) not yet told done by a DatasetEvicted, by key.
    evict_requests: tuple[EvictRequest, ...] = ()

    @property
    def schedulable(self) -> bool:
        return not (self.failed or self.cordoned or self.drained)

    @property
    def unhealthy_gpus(self) -> frozenset[int]:
        return frozenset(f.index for f in self.gpu_faults)


class Queue(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    name: str
    weight: float = 1.0
    guaranteed_gpus: int = 0
    limit_gpus: int | None = None
    parent: str | None = None


class Usage(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """GPUs a queue holds now, and its decayed GPU-seconds for fair share.

    `tree_gpus` adds the queue's descendants (a child's usage counts toward its
    parent's limit). `decayed` is the GPU-seconds integral with the configured
    half-life as of `at` (plain GPU-seconds when the half-life is 0).
    """

    gpus: int = 0
    tree_gpus: int = 0
    decayed: float = 0.0
    at: float = 0.0


class Checkpoint(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    path: str
    step: int
    attempt: int
    rank: int
    #: Seconds its reporting worker had run when it checkpointed (the Checkpointed's time less that
    #: worker's start, both on its node's clock; 0: unknown). Victim choice reads it: a gang just past
    #: a checkpoint loses little (policies/victims.py), without comparing two machines' clocks.
    after_s: float = 0.0


class Stop(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A request to stop a job's workers (signal, grace, kill) and then end it.

    `fail` is true when the scheduler asked (time limit, crash without
    restarts left): the job ends as JobFailed(reason) instead of JobCancelled.
    """

    reason: str
    requested_by: str
    requested_at: float
    fail: bool = False
    #: A user's requeue (RequeueRequested): once the workers are gone the job waits again (JobRequeued).
    requeue: bool = False


class UpdateAsk(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A JobUpdateRequested (or JobUpdateByOperator: `operator`) not answered yet (core/updates.py)."""

    job_id: str
    requested_by: str = ""
    operator: bool = False
    priority: int | None = None
    #: 0: no limit.
    time_limit_s: float | None = None
    queue: str | None = None
    #: Log position of the request.
    seq: int = 0


class Waiting(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    code: str
    message: str
    at: float = 0.0
    #: A backfill reservation told with the reason (JobWaiting.hold_ranks / hold_until).
    hold_ranks: tuple[RankPlacement, ...] = ()
    hold_until: float = 0.0
    #: JobWaiting.behind: the gangs a reservation without a time-limited end waits for.
    behind: tuple[str, ...] = ()
    #: Log position of the JobWaiting.
    seq: int = 0


class StagedDataset(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One dataset of an attempt on one node, as its agent told it (core/staging.py)."""

    node_id: str
    dataset: str
    key: str
    bytes_done: int = 0
    bytes_total: int = 0
    ready: bool = False
    #: A cache hit (0 bytes staged), and the bytes this staging copied or downloaded.
    cached: bool = False
    size_bytes: int = 0
    staged_bytes: int = 0
    #: When it was first told (staging began) and when it was ready (0.0: not yet), on the fold's clock.
    since: float = 0.0
    ready_at: float = 0.0


class Staging(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The staging phase of one attempt: from the first DatasetStaging/DatasetReady of any node until every
    node told DatasetReady for every dataset (`ready`, at `ready_at`), when its ranks may start."""

    attempt: int
    started_at: float
    #: Every node told DatasetReady for every dataset (a flag: a simulated clock may say 0.0).
    ready: bool = False
    ready_at: float = 0.0
    items: tuple[StagedDataset, ...] = ()
    #: The first DatasetFailed's "dataset X on n1: why" ("" if none).
    failed: str = ""
    #: That DatasetFailed was permanent (the source fails anywhere): the job fails, no restart (#39).
    permanent: bool = False


class Job(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    job_id: str
    spec: JobSpec
    submitted_at: float
    #: Log position of the JobSubmitted (a deterministic arrival order).
    submit_seq: int = 0
    status: JobStatus = "pending"
    attempt: int = 1
    #: Gang restarts used so far (counts against spec.max_restarts).
    restarts: int = 0
    #: Queue charged while the job holds GPUs (resolved at reservation).
    queue: str = ""
    placement: tuple[RankPlacement, ...] = ()
    gpus: int = 0
    master_port: int = 0
    epoch: int = 0
    reserved_at: float = 0.0
    running_at: float = 0.0
    finished_at: float = 0.0
    # Ranks of the current attempt (details per rank in ClusterState.ranks).
    started: int = 0
    live: int = 0
    exited_ok: int = 0
    lost: int = 0
    #: First unexpected exit of this attempt ("rank 2 crashed (exit 1)"), "" if none.
    failure: str = ""
    #: A GPU of this attempt became unhealthy ("GPU n1:3 (GPU-...) unhealthy: Xid 79 ..."): the gang
    #: is requeued from its checkpoint, its restarts unspent. "" if none.
    gpu_fault: str = ""
    #: A rank of this attempt was stopped by its node's graceful shutdown (WorkerExited reason SHUTDOWN):
    #: the node's id. The gang is requeued from its newest checkpoint, its restarts unspent. "" if none.
    shutdown: str = ""
    checkpoint: Checkpoint | None = None
    #: Where the current attempt resumes from (set by Preempted / JobRequeued).
    resume_from: str | None = None
    # Set while status == "preempting".
    preemptor: str = ""
    preempt_at: float = 0.0
    preempt_grace_s: float = 0.0
    stop: Stop | None = None
    waiting: Waiting | None = None
    #: As a preemptor: the planned placement whose GPUs are held for this job.
    earmark: tuple[RankPlacement, ...] = ()
    end_reason: str = ""
    #: GPU-seconds its earlier attempts held GPUs (least-attained-service policies read it).
    attained_s: float = 0.0
    #: When a preemption put it back in line (0: never). A preempted gang was being served; it
    #: waits again behind work that queued before it lost its GPUs, not ahead of all of it.
    rejoined_at: float = 0.0
    #: Who submitted it (JobSubmitted.submitted_by): `corral jobs --user`, `corral usage --by user`.
    submitted_by: str = ""
    #: A finished job's ranks of its last attempt as (rank, state), the first FINAL_RANKS_KEPT:
    #: `ClusterState.ranks` holds only active jobs' ranks.
    final_ranks: tuple[tuple[int, RankState], ...] = ()
    #: Time before which the current attempt's workers do not start: the backoff of the GangRestarted
    #: that began this attempt (0: none), on the fold's clock (evolve_jobs.rebased: the stream's, for
    #: the agents, which honour it on their StreamClock, #30).
    not_before: float = 0.0
    #: Gates (core/gating.py): held by a user (JobHeld, or submitted held) until JobReleased; the jobs
    #: it depends on that have not ended yet; why a dependency can never be met ("" while it can).
    held: bool = False
    blocked_on: tuple[str, ...] = ()
    doomed: str = ""
    #: The job arrays it depends on (as a whole, core/array_deps.py) whose verdict is not in yet.
    blocked_on_arrays: tuple[str, ...] = ()
    #: While pending: the GPU-seconds it still claims (its GPUs x time limit, else x the run time
    #: learned from the log, less what earlier attempts held), fixed when it joined the line, so
    #: its place in line does not move while it waits (estimates.claim_of).
    claim: float = 0.0
    #: Where `claim` came from: "limit", an estimate's source ("job", "gpus", "queue"), or "" (nothing known: 0).
    claim_from: str = ""
    #: Dataset staging of the newest attempt that staged (core/staging.py); None: none told yet.
    staging: Staging | None = None
    #: The newest `corral update` applied to it ("priority 0 -> 10 by alice"; "" if none): core/updates.py.
    last_update: str = ""

    @property
    def waiting_since(self) -> float:
        """Its place in line: the submit time, or the last preemption's time if later."""
        return max(self.submitted_at, self.rejoined_at)

    @property
    def line_key(self) -> LineKey:
        return (-self.spec.priority, self.claim, self.waiting_since, self.job_id)

    @property
    def newest_checkpoint(self) -> str | None:
        """Where a new attempt should resume: this attempt's checkpoint, else the previous resume point."""
        return self.checkpoint.path if self.checkpoint is not None else self.resume_from

    @property
    def end_key(self) -> EndKey:
        limit = self.spec.time_limit_s
        return (self.reserved_at + limit if limit is not None else math.inf, self.reserved_at, self.job_id)


def attained_service(job: Job, now: float) -> float:
    """GPU-seconds the job has held GPUs so far: earlier attempts, plus the current one if it holds some."""
    if job.status in HOLDING:
        return job.attained_s + job.gpus * max(0.0, now - job.reserved_at)
    return job.attained_s


def needs_look(job: Job) -> bool:
    """Whether a gang holding GPUs may need a follow-up whatever the clock says.

    False for a gang that is simply running (or waiting for its workers to
    start): only its time limit (`ClusterState.ends`) or a node failure can
    change that, and react finds those without visiting every gang.
    """
    return (
        job.lost > 0
        or job.stop is not None
        or job.status == "preempting"
        or job.exited_ok >= job.spec.ranks
        or bool(job.failure)
        or bool(job.gpu_fault)
        or bool(job.shutdown)
        or (job.status == "reserved" and job.started >= job.spec.ranks)
    )


class ClusterState(msgspec.Struct, kw_only=True):
    #: Last applied stream sequence (or event count when folded without one).
    seq: int = 0
    #: Newest SchedulerElected epoch; decisions from older epochs are void.
    epoch: int = 0
    scheduler_id: str = ""
    #: The named policy the newest leader decides with (SchedulerElected.policy); UNSET (not written in
    #: a snapshot) where the election does not say, as in logs from before `--policy`: corral's.
    policy: str | msgspec.UnsetType = msgspec.UNSET
    config: Config = msgspec.field(default_factory=Config)
    nodes: dict[str, Node] = msgspec.field(default_factory=dict)
    #: node -> owner job id per GPU index (FREE when free).
    owners: dict[str, tuple[str, ...]] = msgspec.field(default_factory=dict)
    #: node -> preemptor job id per GPU index (FREE when not earmarked); only nodes with an earmark.
    earmarks: dict[str, tuple[str, ...]] = msgspec.field(default_factory=dict)
    queues: dict[str, Queue] = msgspec.field(default_factory=dict)
    usage: dict[str, Usage] = msgspec.field(default_factory=dict)
    jobs: dict[str, Job] = msgspec.field(default_factory=dict)
    #: Ordered sets (value: submit seq) of pending jobs and of jobs holding GPUs.
    pending: dict[str, int] = msgspec.field(default_factory=dict)
    active: dict[str, int] = msgspec.field(default_factory=dict)
    #: Queue name a spec asks for -> its pending jobs in line order, kept sorted by the fold
    #: so a decide cycle reads each queue's heads without sorting 10,000 jobs.
    lines: dict[str, list[LineKey]] = msgspec.field(default_factory=dict)
    #: Pending gangs of BIG_GANG_GPUS or more as (waiting since, job id), sorted: the starvation bound
    #: (core/starving.py) reads the prefix that waited longest, not the whole backlog.
    big_pending: list[tuple[float, str]] = msgspec.field(default_factory=list)
    #: Pending jobs with no JobWaiting yet (new or requeued): admission checks them once.
    unexplained: dict[str, int] = msgspec.field(default_factory=dict)
    #: Pending jobs kept out of their lines by a gate (core/gating.py): held, waiting for the jobs
    #: they depend on, or array elements waiting for a slot. `pending` = the lines + these.
    gated: dict[str, int] = msgspec.field(default_factory=dict)
    #: Gated jobs with a dependency that can never be met: react ends them.
    doomed: dict[str, int] = msgspec.field(default_factory=dict)
    #: Job -> the gated jobs that wait for it to end.
    dependents: dict[str, tuple[str, ...]] = msgspec.field(default_factory=dict)
    #: Job array -> its elements counted (core/model/arrays.py); kept for every array the log has named.
    arrays: dict[str, ArrayTally] = msgspec.field(default_factory=dict)
    #: Job array -> the gated jobs that wait for the whole array, until every element ended.
    array_dependents: dict[str, tuple[str, ...]] = msgspec.field(default_factory=dict)
    #: Job array (with a limit) -> its elements holding a slot: in line or holding GPUs.
    array_slots: dict[str, dict[str, None]] = msgspec.field(default_factory=dict)
    #: Job array -> (submit seq, job id) of its elements waiting for a slot, in submit order.
    array_waiting: dict[str, list[tuple[int, str]]] = msgspec.field(default_factory=dict)
    #: Jobs with a stop requested that have not ended yet.
    stopping: dict[str, int] = msgspec.field(default_factory=dict)
    #: Active jobs for which `needs_look` holds: react visits these, not every gang, each cycle.
    watch: dict[str, int] = msgspec.field(default_factory=dict)
    #: Every active gang's `end_key`, sorted: expired time limits are a prefix, and backfill
    #: releases gangs in this order without sorting them every cycle.
    ends: list[EndKey] = msgspec.field(default_factory=list)
    #: The newest changes of `ends` as (log position, entry, added), so that running.running_gangs
    #: follows them in O(changes). Bounded: `ends_dropped` is the newest position whose changes
    #: were dropped (a reader that last read before it reads `ends` whole).
    ends_changes: list[tuple[int, EndKey, bool]] = msgspec.field(default_factory=list)
    ends_dropped: int = 0
    #: The pending jobs holding backfill reservations, oldest reservation first: a JobWaiting
    #: with code RESERVING names one, until it is told another reason or leaves the line. The
    #: log remembers the reservations, so each stays with its gang until that gang starts
    #: (every decide, every standby agrees).
    holders: list[str] = msgspec.field(default_factory=list)
    #: Log position of the newest event that gave GPUs back or moved a gang's end earlier (a gang
    #: ended, an earmark cleared, a stop asked for, a node joined, recovered or was uncordoned).
    #: A backfill reservation told after it is still the earliest one (reservations.py).
    freed_seq: int = 0
    #: When the newest node first registered (capacity verdicts wait until it settled).
    newest_node_at: float = 0.0
    #: Bumped by the fold whenever a node record changes, and whenever GPU owners, earmarks or
    #: `ends` may have: decide's per-call answers (topology, free GPUs, running gangs) are
    #: reused in O(1) for the same state object while these stand still.
    nodes_rev: int = 0
    alloc_rev: int = 0
    #: Finished jobs still kept in `jobs`, oldest first (value: the seq they finished at).
    finished: dict[str, int] = msgspec.field(default_factory=dict)
    #: Learned run times (estimates.py): key -> the newest completed runs' seconds, oldest first.
    #: Bounded (SAMPLES_KEPT per key, KEYS_KEPT keys, least recently updated dropped first). A
    #: snapshot written before it existed loads with none: estimates build up from new completions.
    durations: dict[str, tuple[float, ...]] = msgspec.field(default_factory=dict)
    #: job -> rank -> state, for the current attempt of active jobs.
    ranks: dict[str, dict[int, RankState]] = msgspec.field(default_factory=dict)
    #: node -> worker -> generation (`restarts`) of every worker of a known job the log has that known
    #: node start and not end, whatever its attempt, and whether or not the fold took the report
    #: (`ranks` keeps only current attempts'). An agent restarted on the node tells the log which of
    #: them vanished (nodeagent/agent.py `_adopt`): held here, an agent starting from a snapshot knows them too.
    unended: dict[str, dict[WorkerId, int]] = msgspec.field(default_factory=dict)
    #: job -> step -> ranks that reported a checkpoint at that step (until complete).
    checkpoint_votes: dict[str, dict[int, tuple[int, ...]]] = msgspec.field(default_factory=dict)
    #: node -> its dataset cache's entries with size and last use, sorted by key (core/caches.py: the
    #: operator views'; placement reads `Node.datasets`).
    dataset_cache: dict[str, tuple[CachedDataset, ...]] = msgspec.field(default_factory=dict)
    #: node -> what the node was told (WorkAssigned, WorkChanged) and reported of its work (issue #40,
    #: core/evolve_slices.py): exactly what its agent's fold of its slice holds (core/node_view.py).
    slices: dict[str, NodeSlice] = msgspec.field(default_factory=dict)
    #: job -> the nodes whose slice holds it (an index of `slices`).
    slice_jobs: dict[str, tuple[str, ...]] = msgspec.field(default_factory=dict)
    #: Jobs some node lacks an order about (core/orders.py: `due`), in the order they became due (value: the
    #: position they did): the scheduler's orders stage visits these, not every gang.
    orders_due: dict[str, int] = msgspec.field(default_factory=dict)
    #: Decisions recorded as void (stale epoch, GPUs taken, ...), for observability.
    voids: int = 0
    last_void: str = ""
    unknown_events: int = 0
    #: Events refused as read (events/authorship.py): their subject, type and entity disagree. Folded as no change.
    refused_events: int = 0
    #: job -> (position, why): submissions no one can read on corral.job.<job>.JobSubmitted (`Unknown.submitted_as`)
    #: of jobs the log does not know, until the scheduler's JobRejected for them (core/reject.py) is folded.
    unreadable_submissions: dict[str, tuple[int, str]] = msgspec.field(default_factory=dict)
    #: Node reservations by name (model/reserved.py), until deleted or replaced.
    reservations: dict[str, Reservation] = msgspec.field(default_factory=dict)
    #: Update requests (by event id) the scheduler has not answered yet (core/updates.py).
    update_asks: dict[str, UpdateAsk] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        """Rebuild the fold's derived indexes when a snapshot written before they existed is loaded.

        (Newer snapshots store them, in the log's order: why, see orchestrator/snapshot.py.)
        """
        in_lines = sum(len(line) for line in self.lines.values())
        if len(self.pending) != in_lines + len(self.gated) or len(self.ends) != len(self.active):
            self._rebuild_indexes()
        if not self.arrays and self.jobs:
            self._count_arrays()
        if self.active and not self.slices and not self.orders_due:
            # A snapshot from before nodes were told their work (#40): every gang with a rank that has not exited
            # lacks its orders. (Exactly those: a state of today whose active gangs' ranks have all exited holds
            # no slice and owes no order either, and must restore as it was.)
            self.orders_due = {j: seq for j, seq in self.active.items() if self._has_unexited_rank(j)}

    def _has_unexited_rank(self, job_id: str) -> bool:
        ranks = self.ranks.get(job_id, {})
        return any((r := ranks.get(p.rank)) is None or r.status != "exited" for p in self.jobs[job_id].placement)

    def _count_arrays(self) -> None:
        """A snapshot from before arrays were counted: count the elements it still holds (finished ones past
        FINISHED_KEPT are gone from `jobs`, so an old array's tally may fall short by those)."""
        for job in self.jobs.values():
            arr = job.spec.gating.array
            if arr is None:
                continue
            t = self.arrays.get(arr.array_id, ArrayTally())
            done = job.status in TERMINAL
            ok = job.status == "completed"
            self.arrays[arr.array_id] = msgspec.structs.replace(
                t, declared=max(t.declared, arr.count if isinstance(arr.count, int) else 0),
                submitted=t.submitted + 1, ended=t.ended + done, succeeded=t.succeeded + ok,
                first_failure=t.first_failure or (f"{job.job_id} {job.status}" if done and not ok else ""))

    def _rebuild_indexes(self) -> None:
        self.lines = {}
        for jid in self.pending:
            job = self.jobs[jid]
            if jid not in self.gated:
                self.lines.setdefault(job.spec.queue, []).append(job.line_key)
        for line in self.lines.values():
            line.sort()
        self.big_pending = sorted((j.waiting_since, jid) for jid in self.pending
                                  if jid not in self.gated and (j := self.jobs[jid]).spec.total_gpus >= BIG_GANG_GPUS)
        self.unexplained = {jid: n for jid, n in self.pending.items()
                            if self.jobs[jid].waiting is None and jid not in self.gated}
        self.stopping = {
            jid: j.submit_seq for jid, j in self.jobs.items() if j.stop is not None and j.status not in TERMINAL
        }
        self.watch = {jid: n for jid, n in self.active.items() if needs_look(self.jobs[jid])}
        self.ends = sorted(self.jobs[jid].end_key for jid in self.active)
        self.ends_changes, self.ends_dropped = [], self.seq  # (a new `ends` list: readers start over)

    def copy(self) -> ClusterState:
        """An independent state for tentative folding (records are frozen, so shallow copies suffice)."""
        return ClusterState(
            seq=self.seq,
            epoch=self.epoch,
            scheduler_id=self.scheduler_id,
            policy=self.policy,
            config=self.config,
            nodes=dict(self.nodes),
            owners=dict(self.owners),
            earmarks=dict(self.earmarks),
            queues=dict(self.queues),
            usage=dict(self.usage),
            jobs=dict(self.jobs),
            pending=dict(self.pending),
            active=dict(self.active),
            lines={k: list(v) for k, v in self.lines.items()},
            big_pending=list(self.big_pending),
            unexplained=dict(self.unexplained),
            gated=dict(self.gated),
            doomed=dict(self.doomed),
            dependents=dict(self.dependents),
            arrays=dict(self.arrays),
            array_dependents=dict(self.array_dependents),
            array_slots={k: dict(v) for k, v in self.array_slots.items()},
            array_waiting={k: list(v) for k, v in self.array_waiting.items()},
            stopping=dict(self.stopping),
            watch=dict(self.watch),
            ends=list(self.ends),
            ends_changes=list(self.ends_changes),
            ends_dropped=self.ends_dropped,
            holders=list(self.holders),
            freed_seq=self.freed_seq,
            newest_node_at=self.newest_node_at,
            nodes_rev=self.nodes_rev,
            alloc_rev=self.alloc_rev,
            finished=dict(self.finished),
            durations=dict(self.durations),
            ranks={k: dict(v) for k, v in self.ranks.items()},
            unended={k: dict(v) for k, v in self.unended.items()},
            checkpoint_votes={k: dict(v) for k, v in self.checkpoint_votes.items()},
            dataset_cache=dict(self.dataset_cache),
            slices={k: NodeSlice(work=dict(v.work), unended=dict(v.unended)) for k, v in self.slices.items()},
            slice_jobs=dict(self.slice_jobs),
            orders_due=dict(self.orders_due),
            voids=self.voids,
            last_void=self.last_void,
            unknown_events=self.unknown_events,
            refused_events=self.refused_events,
            unreadable_submissions=dict(self.unreadable_submissions),
            reservations=dict(self.reservations),
            update_asks=dict(self.update_asks),
        )


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(ClusterState)


def snapshot(state: ClusterState) -> bytes:
    """The state as msgpack bytes; equal logs give equal bytes."""
    return _ENCODER.encode(state)


def restore(data: bytes) -> ClusterState:
    return _DECODER.decode(data)
