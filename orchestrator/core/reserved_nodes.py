"""Node reservations in decide (issue #41; the rule is model/reserved.py's, the fold evolve_reserved.py's).

- decide places each job only on the nodes the reservations leave it
  (`restricted`: the placement request's `only`), explains a job waiting on a
  reservation (`waiting_note`), and rejects a job that names a reservation it
  can never run in (`reject_unreservable`: unknown, deleted, over, not its
  users' or queue's).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from orchestrator.core.model.reserved import allowed_nodes, barred_nodes, unusable_reason
from orchestrator.core.model.state import ClusterState, Job
from schemas.events import JobRejected

if TYPE_CHECKING:
    from orchestrator.core.cycle import Cycle
    from orchestrator.policies.placement import GangRequest

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
