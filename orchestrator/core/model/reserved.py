"""Node reservations (`corral reservation`, issue #41): who may use a reserved node, and when.

A reservation sets nodes aside over [start, end). The rule, the same for
every reader (the decide engine places by it, the fold voids a GangReserved
that breaks it, judged at the decision's own `occurred_at`):

- a job that names the reservation (JobSpec.reservation) and may use it (its
  submitter among `users`, or `users` empty; its queue the reservation's
  `queue`, or that empty) runs only on the reservation's nodes and only
  inside the window;
- any other job may use a reserved node only if it would end before the
  window opens (its start plus its time limit <= start: backfill respects the
  window, and a job without a time limit never fits before it), or once the
  window closed.

Time is passed in: the core reads no clock.
"""

from __future__ import annotations

import msgspec

from schemas.jobspec import JobSpec


class Reservation(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A ReservationCreated as the fold keeps it."""

    name: str
    nodes: tuple[str, ...]
    start: float
    end: float
    users: tuple[str, ...] = ()
    queue: str | None = None
    created_by: str = ""
    reason: str = ""
    #: Log position of the ReservationCreated.
    seq: int = 0

    def active_at(self, t: float) -> bool:
        return self.start <= t < self.end

    def admits(self, spec: JobSpec, submitted_by: str) -> bool:
        """Whether a job of `spec` submitted by `submitted_by` is one of this reservation's jobs."""
        return (spec.reservation_name == self.name and (not self.users or submitted_by in self.users)
                and (self.queue is None or spec.queue == self.queue))


def ends_before(spec: JobSpec, t: float, start: float) -> bool:
    """A job of `spec` starting at `t` ends by `start` (its time limit says so; no limit: never)."""
    limit = spec.time_limit_s
    return limit is not None and t + limit <= start


def barred_nodes(reservations: dict[str, Reservation], spec: JobSpec, submitted_by: str,
                 t: float) -> frozenset[str] | None:
    """The nodes a job may not take at time `t` because of reservations; None when none is barred (the
    usual case: no reservation, or every one over). For a job that names a reservation, see `own_nodes`."""
    barred: set[str] = set()
    for r in reservations.values():
        if t >= r.end or r.admits(spec, submitted_by) or ends_before(spec, t, r.start):
            continue
        barred.update(r.nodes)
    return frozenset(barred) if barred else None


def own_nodes(reservations: dict[str, Reservation], spec: JobSpec, submitted_by: str,
              t: float) -> frozenset[str] | None:
    """For a job that names a reservation: the nodes it may take at `t` (empty before or after the window, or
    when the reservation is unknown or not its own); None for a job naming none."""
    name = spec.reservation_name
    if name is None:
        return None
    r = reservations.get(name)
    if r is None or not r.admits(spec, submitted_by) or not r.active_at(t):
        return frozenset()
    return frozenset(r.nodes)


def allowed_nodes(reservations: dict[str, Reservation], all_nodes: frozenset[str], spec: JobSpec,
                  submitted_by: str, t: float) -> frozenset[str] | None:
    """The nodes a job may take at `t` under every reservation; None: any node (no reservation applies)."""
    own = own_nodes(reservations, spec, submitted_by, t)
    if not reservations:
        return own
    barred = barred_nodes(reservations, spec, submitted_by, t)
    if own is not None:
        return own - barred if barred else own
    if barred is None:
        return None
    return all_nodes - barred


def unusable_reason(reservations: dict[str, Reservation], spec: JobSpec, submitted_by: str,
                    t: float) -> str | None:
    """Why a job naming a reservation can never run in it at `t` or later (unknown or deleted, over, not its
    users' or queue's); None if it can (or names none). A window not open yet is no such reason: it waits."""
    name = spec.reservation_name
    if name is None:
        return None
    r = reservations.get(name)
    if r is None:
        return f"reservation {name} does not exist (`corral reservation list`)"
    if t >= r.end:
        return f"reservation {name} ended at t={r.end:.0f}"
    if r.users and submitted_by not in r.users:
        return f"reservation {name} is for {', '.join(r.users)}, not {submitted_by or 'an unnamed user'}"
    if r.queue is not None and spec.queue != r.queue:
        return f"reservation {name} is for queue {r.queue}, not {spec.queue}"
    return None


def window_note(r: Reservation) -> str:
    """"n1, n2 from t=... to t=..." for explanations (the CLI prints times its own way)."""
    return f"{', '.join(r.nodes)} over t={r.start:.0f}..{r.end:.0f}"
