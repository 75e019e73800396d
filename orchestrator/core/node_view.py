"""One node's state, folded from its slice of the log alone: what its agent knows (issue #40).

An agent reads only its node's subjects, its own reports and the scheduler's
elections and settings (events/subjects.py: `slice_filters`), never the whole
log, so its memory and the server's deliveries to it do not grow with the
cluster or its history. `evolve_node` folds that slice:

- the node's own facts (registration, failure and recovery, GPU health, the
  health check, its dataset cache) and the elections and settings go through
  the shared `evolve`, over a `ClusterState` that only ever holds this node:
  the agent's record of its node is the scheduler's, by construction;
- the orders and the node's reports go through core/evolve_slices.py, as in the
  scheduler's fold.

`node_view_of(state, node)` projects the scheduler's state onto one node: the
view an agent would have folded up to the same position. The scheduler stores
these (events/nodeviews.py) so an agent starts from one, then reads its slice
after it; tests/core/test_node_view.py checks the projection against the fold.
"""

from __future__ import annotations

import msgspec

from orchestrator.core import evolve_slices
from orchestrator.core.evolve import evolve
from orchestrator.core.evolve_fencing import stale
from orchestrator.core.model.slices import NodeJob, NodeSlice
from orchestrator.core.model.state import FREE, ClusterState, Node
from orchestrator.core.node_work import Intent, WorkerKey
from schemas.events import (
    INTENT_CHECKPOINT,
    INTENT_STOP,
    AnyEvent,
    Checkpointed,
    ClusterConfigured,
    DatasetFailed,
    DatasetReady,
    DatasetStaging,
    ReservationCreated,
    ReservationDeleted,
    SchedulerElected,
    Unknown,
    WorkAssigned,
    WorkChanged,
    WorkerExited,
    WorkerStarted,
)


class NodeView(msgspec.Struct, kw_only=True):
    """What one node's agent knows: its slice of the log, folded (module docstring)."""

    node_id: str
    #: The last position folded (of the slice: positions in between are other nodes' business).
    seq: int = 0
    #: This node's record, the epoch and the settings: `evolve` over the node's own events and corral.sched.>.
    cluster: ClusterState = msgspec.field(default_factory=ClusterState)
    slice: NodeSlice = msgspec.field(default_factory=NodeSlice)
    #: Events of the slice this fold could not read, or that were not about this node (a wrong filter).
    unknown_events: int = 0

    @property
    def node(self) -> Node | None:
        return self.cluster.nodes.get(self.node_id)

    @property
    def work(self) -> dict[str, NodeJob]:
        return self.slice.work

    def facts(self) -> tuple[object, ...]:
        """What the view holds, for comparing two (a fold's and a projection's): not its bookkeeping."""
        c = self.cluster
        return (self.node, c.epoch, c.config, c.dataset_cache.get(self.node_id), self.slice.work,
                self.slice.unended)


_ENCODER = msgspec.msgpack.Encoder()


def view_bytes(view: NodeView) -> bytes:
    """The view's facts as msgpack bytes (corral_state_digest of an agent): equal for a view stored by the
    scheduler and caught up, and for a fold of the whole slice, though their positions differ."""
    return _ENCODER.encode(view.facts())


#: Job events of the node's own reports that change nothing here (the scheduler's fold reads them), and the
#: node reservations (corral.sched.<Tag>, which the agent reads): the scheduler places by them, a node's work
#: does not change (issue #41).
_REPORTS_ONLY_FOR_THE_SCHEDULER = (Checkpointed, DatasetStaging, DatasetFailed, ReservationCreated,
                                   ReservationDeleted)


def evolve_node(view: NodeView, event: AnyEvent | Unknown, seq: int = 0, at: float | None = None) -> NodeView:
    """Fold one event of the node's slice into `view` (in place; returns it)."""
    view.seq = seq if seq > 0 else view.seq + 1
    t = at if at is not None else getattr(event, "occurred_at", 0.0)
    me = view.node_id
    known = me in view.cluster.nodes
    match event:
        case WorkAssigned() | WorkChanged():
            if event.node_id != me or not known:
                return view
            if stale(view.cluster, event.event_id, event.epoch, unstamped_ok=False):
                return view
            if isinstance(event, WorkAssigned):
                evolve_slices.assigned(view.slice, event, view.seq)
            else:
                evolve_slices.changed(view.slice, event)
        case WorkerStarted() | WorkerExited():
            if event.node_id == me and known:
                if isinstance(event, WorkerStarted):
                    evolve_slices.reported_started(view.slice, event, t)
                else:
                    evolve_slices.reported_exited(view.slice, event, t)
        case SchedulerElected() | ClusterConfigured():
            evolve(view.cluster, event, view.seq, at)
        case DatasetReady():
            if event.node_id == me:
                evolve(view.cluster, event, view.seq, at)  # the cache's record (no job is in this state)
        case Unknown():
            view.unknown_events += 1
        case _ if isinstance(event, _REPORTS_ONLY_FOR_THE_SCHEDULER):
            pass
        case _:
            if getattr(event, "node_id", None) == me:  # the node's own facts: corral.node.<me>.<Tag>
                evolve(view.cluster, event, view.seq, at)
            else:
                view.unknown_events += 1
    return view


def view_facts(state: ClusterState, node_id: str) -> tuple[object, ...]:
    """`node_view_of(state, node_id).facts()`, without building the view (the scheduler asks it of every node
    before it stores the views that changed)."""
    sl = state.slices.get(node_id)
    return (state.nodes.get(node_id), state.epoch, state.config, state.dataset_cache.get(node_id),
            dict(sl.work) if sl is not None else {}, dict(sl.unended) if sl is not None else {})


def node_view_of(state: ClusterState, node_id: str) -> NodeView:
    """The view `node_id`'s agent folds from its slice, as of `state.seq` (module docstring)."""
    node = state.nodes.get(node_id)
    cluster = ClusterState(seq=state.seq, epoch=state.epoch, scheduler_id=state.scheduler_id, config=state.config)
    if node is not None:
        cluster.nodes[node_id] = node
        cluster.owners[node_id] = (FREE,) * len(state.owners.get(node_id, ()))
        cluster.newest_node_at = node.registered_at
    if node_id in state.dataset_cache:
        cluster.dataset_cache[node_id] = state.dataset_cache[node_id]
    sl = state.slices.get(node_id)
    copy = NodeSlice(work=dict(sl.work), unended=dict(sl.unended)) if sl is not None else NodeSlice()
    return NodeView(node_id=node_id, seq=state.seq, cluster=cluster, slice=copy)


# --- what the agent does with it ------------------------------------------------


def node_work(view: NodeView) -> dict[WorkerKey, Intent]:
    """Every rank the node holds that has not exited for good, with its intent: the agent's desired state."""
    node = view.node
    if node is None or node.failed:
        return {}  # a failed node's gangs are being requeued: nothing here is wanted any more
    out: dict[WorkerKey, Intent] = {}
    for job in view.slice.work.values():
        intent = _intent(job)
        for p in job.ranks:
            st = job.report(p.rank)
            if st is None or st.status != "exited":
                out[(job.job_id, job.attempt, p.rank)] = intent
    return out


def rank_intent(view: NodeView, key: WorkerKey) -> Intent | None:
    """`node_work(view).get(key)` for one rank: asked again on the view as it is before each start."""
    job_id, attempt, rank = key
    node = view.node
    job = view.slice.work.get(job_id)
    if node is None or node.failed or job is None or job.attempt != attempt:
        return None
    if not any(p.rank == rank for p in job.ranks):
        return None
    st = job.report(rank)
    if st is not None and st.status == "exited":
        return None
    return _intent(job)


def _intent(job: NodeJob) -> Intent:
    if job.intent == INTENT_CHECKPOINT:
        return "checkpoint"
    return "stop" if job.intent == INTENT_STOP else "run"
