"""The scheduler's fold of every node's slice (issue #40): orders and reports into `ClusterState.slices`.

The slice fold itself is core/evolve_slices.py, shared with the agents' own
fold (core/node_view.py); this adds what only the whole cluster's state knows:
an order from a stale epoch is void, a node the log never registered has no
slice, `slice_jobs` indexes the slices by job, and `orders_due` names the jobs
some node lacks an order about (core/orders.py), kept exact after every event
about a job so the orders stage visits only those.
"""

from __future__ import annotations

from orchestrator.core import evolve_slices
from orchestrator.core.evolve_fencing import stale
from orchestrator.core.model.slices import NodeSlice
from orchestrator.core.model.state import ClusterState
from orchestrator.core.orders import due
from schemas.events import WorkAssigned, WorkChanged, WorkerExited, WorkerStarted


def _slice(state: ClusterState, node_id: str) -> NodeSlice | None:
    if node_id not in state.nodes:
        return None
    sl = state.slices.get(node_id)
    if sl is None:
        sl = state.slices[node_id] = NodeSlice()
    return sl


def _reindex(state: ClusterState, node_id: str, job_id: str) -> None:
    sl = state.slices.get(node_id)
    holds = sl is not None and job_id in sl.work
    nodes = state.slice_jobs.get(job_id, ())
    if holds and node_id not in nodes:
        state.slice_jobs[job_id] = (*nodes, node_id)
    elif not holds and node_id in nodes:
        rest = tuple(n for n in nodes if n != node_id)
        if rest:
            state.slice_jobs[job_id] = rest
        else:
            del state.slice_jobs[job_id]
    if sl is not None and sl.empty:
        del state.slices[node_id]


def work_assigned(state: ClusterState, e: WorkAssigned, seq: int) -> None:
    if stale(state, e.event_id, e.epoch, unstamped_ok=False):
        return
    sl = _slice(state, e.node_id)
    if sl is not None:
        evolve_slices.assigned(sl, e, seq)
        _reindex(state, e.node_id, e.job_id)


def work_changed(state: ClusterState, e: WorkChanged) -> None:
    if stale(state, e.event_id, e.epoch, unstamped_ok=False):
        return
    sl = _slice(state, e.node_id)
    if sl is not None:
        evolve_slices.changed(sl, e)
        _reindex(state, e.node_id, e.job_id)


def worker_reported(state: ClusterState, e: WorkerStarted | WorkerExited, at: float) -> None:
    sl = _slice(state, e.node_id)
    if sl is None:
        return
    if isinstance(e, WorkerStarted):
        evolve_slices.reported_started(sl, e, at)
    else:
        evolve_slices.reported_exited(sl, e, at)
    _reindex(state, e.node_id, e.job_id)


def track_due(state: ClusterState, job_id: str) -> None:
    """Keep `orders_due` exact for the job an event touched."""
    if due(state, job_id):
        state.orders_due.setdefault(job_id, state.seq)
    else:
        state.orders_due.pop(job_id, None)
