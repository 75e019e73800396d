"""Node reservations in the fold and in decide (issue #41; the rule is model/reserved.py's).

- The fold keeps ReservationCreated / ReservationDeleted in
  `ClusterState.reservations`, and voids a GangReserved that puts a job on a
  node a reservation bars it from at the decision's own time (`occurred_at`:
  every reader judges it alike), so no scheduler, however stale its view,
  places work in a window that is not its own.
- decide places each job only on the nodes the reservations leave it
  (`restricted`: the placement request's `only`), explains a job waiting on a
  reservation (`waiting_note`), and rejects a job that names a reservation it
  can never run in (`reject_unreservable`: unknown, deleted, over, not its
  users' or queue's).
"""

from __future__ import annotations

from collections.abc import Iterable

from orchestrator.core.cycle import Cycle
from orchestrator.core.model.reserved import Reservation, allowed_nodes, barred_nodes, unusable_reason
from orchestrator.core.model.state import ClusterState, Job
from orchestrator.policies.placement import GangRequest
from schemas.events import GangReserved, JobRejected, ReservationCreated, ReservationDeleted

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
    if state.reservations.pop(e.name, None) is not None:
        state.freed_seq = state.seq  # its nodes are everyone's again


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


def restricted(state: ClusterState, job: Job, req: GangRequest, now: float) -> GangRequest:
    """`req` limited to the nodes the reservations leave `job` at `now` (unchanged when none applies)."""
    if not state.reservations and job.spec.reservation_name is None:
        return req
    allowed = allowed_nodes(state.reservations, frozenset(state.nodes), job.spec, job.submitted_by, now)
    if allowed is None:
        return req
    return req._replace(only=allowed if req.only is None else req.only & allowed)


def waiting_note(state: ClusterState, job: Job, now: float) -> str | None:
    """Why reservations keep `job` off nodes at `now`, for its JobWaiting; None when none does."""
    name = job.spec.reservation_name
    if name is not None:
        r = state.reservations.get(name)
        if r is None:
            return None
        if now < r.start:
            return f"runs in reservation {name}, whose window opens at t={r.start:.0f}"
        return f"runs in reservation {name} (nodes {', '.join(r.nodes)}), which has no room for it now"
    if not state.reservations:
        return None
    barred = barred_nodes(state.reservations, job.spec, job.submitted_by, now)
    if not barred:
        return None
    names = sorted(r.name for r in state.reservations.values() if barred & set(r.nodes))
    why = "it has no time limit" if job.spec.time_limit_s is None else "its time limit reaches into their window"
    shown = sorted(barred)
    more = f" and {len(shown) - 4} more" if len(shown) > 4 else ""
    return (f"nodes {', '.join(shown[:4])}{more} are reserved ({', '.join(names)}) and not for it: "
            f"not in the reservation, and {why}")


def reject_unreservable(c: Cycle, fresh: list[Job]) -> list[JobRejected]:
    """JobRejected for each pending job that names a reservation it can never run in (the new jobs always; every
    pending one while some reservation exists, so a deleted or ended one's jobs are told too)."""
    state = c.state
    jobs: Iterable[Job] = fresh
    if state.reservations:
        jobs = (state.jobs[jid] for jid in state.pending)
    out: list[JobRejected] = []
    for job in jobs:
        if job.spec.reservation_name is None or job.status != "pending":
            continue
        why = unusable_reason(state.reservations, job.spec, job.submitted_by, c.now)
        if why is not None:
            out.append(JobRejected(event_id=c.event_id("rejected", job), occurred_at=c.now, job_id=job.job_id,
                                   reasons=(why,), epoch=c.epoch))
    return out
