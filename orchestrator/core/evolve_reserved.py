"""Node reservations in the fold (issue #41; the rule is model/reserved.py's, decide's side reserved_nodes.py).

The fold keeps ReservationCreated / ReservationDeleted in
`ClusterState.reservations`, and voids a GangReserved that puts a job on a
node a reservation bars it from at the decision's own time (`occurred_at`:
every reader judges it alike), so no scheduler, however stale its view,
places work in a window that is not its own.
"""

from __future__ import annotations

from collections.abc import Iterable

from orchestrator.core.model.reserved import Reservation, allowed_nodes
from orchestrator.core.model.state import ClusterState, Job
from schemas.events import GangReserved, ReservationCreated, ReservationDeleted

#: Most reservations the fold keeps: past it the one that ended first goes (an operator's tool, not a flood).
RESERVATIONS_KEPT = 1_000


def reservation_created(state: ClusterState, e: ReservationCreated) -> None:
    if not e.nodes or not e.end > e.start:
        return  # (the CLI never writes one: a hand-made one changes nothing)
    state.reservations.pop(e.name, None)  # a new definition replaces it, in the order of the log
    state.reservations[e.name] = Reservation(name=e.name, nodes=tuple(dict.fromkeys(e.nodes)), start=e.start,
                                             end=e.end, users=e.users, queue=e.queue, created_by=e.created_by,
                                             reason=e.reason, seq=state.seq)
    if len(state.reservations) > RESERVATIONS_KEPT:
        first = min(state.reservations.values(), key=lambda r: (r.end, r.seq))
        del state.reservations[first.name]


def reservation_deleted(state: ClusterState, e: ReservationDeleted) -> None:
    if state.reservations.pop(e.name, None) is None:
        return
    state.freed_seq = state.seq  # its nodes are everyone's again
    # Its jobs waiting in line are looked at afresh, so decide rejects them (reserved_nodes.reject_unreservable
    # reads the new jobs, and every pending one only while some reservation exists).
    for jid, n in state.pending.items():
        if jid not in state.gated and state.jobs[jid].spec.reservation_name == e.name:
            state.unexplained[jid] = n


def placement_problem(state: ClusterState, job: Job, e: GangReserved) -> str | None:
    """Why `e` puts `job` where a reservation bars it at `e.occurred_at`; None if it does not."""
    t = e.occurred_at
    allowed = allowed_nodes(state.reservations, frozenset(rp.node_id for rp in e.ranks), job.spec,
                            job.submitted_by, t)
    if allowed is None:
        return None
    for rp in e.ranks:
        if rp.node_id not in allowed:
            return f"node {rp.node_id} is reserved ({_covering(state.reservations.values(), rp.node_id, job)})"
    return None


def _covering(reservations: Iterable[Reservation], node: str, job: Job) -> str:
    names = [r.name for r in reservations if node in r.nodes]
    mine = job.spec.reservation_name
    if mine is not None and mine not in names:
        return f"the job runs in reservation {mine}, which does not hold it"
    return f"reservation {', '.join(names) or mine}"
