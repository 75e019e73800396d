"""GPU time from the whole log: what `corral usage` reports (like Slurm's sacct) and the metrics count.

The fold keeps the newest FINISHED_KEPT finished jobs, so it cannot answer
"GPU-hours per queue last month". `GpuTime` folds the log itself (the same
`evolve` every reader runs) and charges each reservation when the fold
releases it: from the gang's `reserved_at` to the event that gave its GPUs
back (completed, failed, cancelled, preempted, requeued), on the event's
own clock, to the queue the fold charged and the job's submitter (`--by
state`: how it ended; "gpu_fault" for an attempt a GPU fault ended, the
GPU-hours hardware faults cost). A void
reservation never held GPUs, so it is never charged. Reservations still
holding GPUs at the end are charged up to the moment asked (`held_until`).

Memory is O(keys), not O(jobs): nothing per job outlives the fold's own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import TERMINAL, ClusterState, Job
from orchestrator.core.model.usage import resolve_queue
from schemas.events import AnyEvent, Unknown

GroupBy = Literal["queue", "user", "state"]

#: The key of a job submitted without a recorded submitter.
NO_USER = "(unknown)"

#: How a reservation ended (`--by state`) when a GPU fault ended it (Job.gpu_fault): its GPU-hours are
#: what hardware faults cost, beside "pending" (requeued for other reasons, preempted) and the final states.
GPU_FAULT = "gpu_fault"


@dataclass
class Account:
    """One key's totals in the window."""

    gpu_seconds: float = 0.0
    #: Reservations that held GPUs inside the window (a preempted and resumed job counts twice).
    reservations: int = 0
    #: Jobs that finished inside the window, by final status.
    finished: dict[str, int] = field(default_factory=dict)


class Accounted(NamedTuple):
    """What one event did to GPU time (`account`): the one place the charging rules live.

    `released`: the job as it held the GPUs this event gave back, to charge from its
    `reserved_at` to `at`. `finished`: the record to key a job that became final with this
    event on. `status`: the job's status after the event (how a released reservation ended).
    """

    at: float
    released: Job | None
    finished: Job | None
    status: str


def account(state: ClusterState, event: AnyEvent | Unknown, seq: int = 0) -> tuple[ClusterState, Accounted | None]:
    """`evolve`, and what the event released or finished (None: nothing about a known job)."""
    job_id = getattr(event, "job_id", None)
    before = state.jobs.get(job_id) if isinstance(job_id, str) else None
    holding = before is not None and before.job_id in state.active
    state = evolve(state, event, seq)
    if before is None or not isinstance(job_id, str):
        return state, None
    after = state.jobs.get(job_id)
    at = getattr(event, "occurred_at", 0.0)
    released = before if holding and (job_id not in state.active or after is None
                                      or after.reserved_at != before.reserved_at) else None
    finished = None
    if after is not None and after.status in TERMINAL and before.status not in TERMINAL:
        finished = after if after.queue else before
    status: str = after.status if after is not None else before.status
    if released is not None and released.gpu_fault and finished is None:
        status = GPU_FAULT  # requeued because one of its GPUs failed: time the hardware cost
    return state, Accounted(at, released, finished, status)


@dataclass
class GpuTime:
    """GPU-seconds per queue or user over [since, until] (None: unbounded), folded from the log.

    `fold` is `evolve` plus the charging: feed it every event in log order,
    then `held_until(state, now)` charges what is still running.
    """

    by: GroupBy = "queue"
    since: float | None = None
    until: float | None = None
    accounts: dict[str, Account] = field(default_factory=dict)

    def key(self, state: ClusterState, job: Job, status: str = "") -> str:
        """The account charged: the job's queue, its submitter, or (by state) how the reservation ended."""
        if self.by == "user":
            return job.submitted_by or NO_USER
        if self.by == "state":
            return status or job.status
        return job.queue or resolve_queue(state, job.spec.queue)

    def fold(self, state: ClusterState, event: AnyEvent | Unknown, seq: int = 0) -> ClusterState:
        state, done = account(state, event, seq)
        if done is None:
            return state
        if done.released is not None:
            self._charge(state, done.released, done.released.reserved_at, done.at, done.status)
        if done.finished is not None and self._inside(done.at):
            acct = self._account(self.key(state, done.finished, done.status))
            acct.finished[done.status] = acct.finished.get(done.status, 0) + 1
        return state

    def held_until(self, state: ClusterState, now: float) -> None:
        """Charge the reservations still holding GPUs, up to `now` (the end of the report)."""
        for job_id in state.active:
            job = state.jobs[job_id]
            self._charge(state, job, job.reserved_at, now, job.status)

    def _inside(self, at: float) -> bool:
        return (self.since is None or at >= self.since) and (self.until is None or at <= self.until)

    def _charge(self, state: ClusterState, job: Job, start: float, end: float, status: str) -> None:
        lo = start if self.since is None else max(start, self.since)
        hi = end if self.until is None else min(end, self.until)
        if hi < lo or job.gpus <= 0:
            return
        acct = self._account(self.key(state, job, status))
        acct.gpu_seconds += job.gpus * (hi - lo)
        acct.reservations += 1

    def _account(self, key: str) -> Account:
        acct = self.accounts.get(key)
        if acct is None:
            acct = self.accounts[key] = Account()
        return acct
