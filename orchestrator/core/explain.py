"""Stage 6, explain: every job left pending gets a structured reason.

A reason is a stable code plus a human message with the numbers that matter
("needs 16 GPUs (2x8) in one leaf, the largest free leaf has 12"). JobWaiting
is appended when the reason changes kind; a changed message or a code of the
same kind (its numbers move with every start and finish) only once the last
reason is REFRESH_S old. Otherwise a busy cluster writes a JobWaiting per pending job
per decision (measured: 92% of a 400-job log), and the log, every replay and
every tail pay for numbers nobody reads. Messages avoid relative times so
they do not change every tick. A job's first "queued" reason tells its
expected run time learned from the log (core/model/estimates.py) and where it comes
from; a reservation names the gangs it waits for (its GPUs' holders, `behind`), from
which `corral job` and `corral explain` tell its start as of the moment they are asked
(core/model/estimates.py: `expected_start`): a start written into the message would be past
within minutes.
"""

from __future__ import annotations

from typing import NamedTuple

from orchestrator.core.cycle import Cycle
from orchestrator.core.model.capacity import FreeIndex
from orchestrator.core.model.facts import SETTLE_S
from orchestrator.core.model.plan import Hold, Plan
from orchestrator.core.model.state import RESERVING, Job
from orchestrator.core.model.topology import NODE
from orchestrator.core.model.usage import resolve_queue
from orchestrator.policies.placement import GangRequest
from schemas.events import JobWaiting

PLACED = "placed"
QUEUED = "queued"
CAPACITY = "capacity"
QUOTA = "quota"
PREEMPTING = "preempting"
BACKFILL = "backfill"
BACKFILL_HEAD = RESERVING
NO_NODES = "no_nodes"

REFRESH_S = 300.0
"""How stale a reason of the same kind may get in the log. At 60 s, such refreshes were 43% of all
events of a 20,000-job simulation (140 k of 329 k); at 300 s the log is 29% shorter and every
decision the same (bench/RESULTS.md, session 8). The kind of reason is always told at once."""

_TURN = frozenset({QUEUED, CAPACITY, BACKFILL})
"""Waiting its turn for GPUs that others hold: one kind of reason. A busy
queue flips its jobs between these on every start and finish (free GPUs
appear, go to the head's backfill reservation, are taken)."""


class Outcome(NamedTuple):
    code: str
    message: str
    #: BACKFILL_HEAD: the reservation, told with the reason so the log keeps it.
    hold: Hold | None = None
    #: The told reservation was planned afresh because GPUs came back since (reservations._came_back).
    replanned: bool = False
    #: BACKFILL_HEAD without a time-limited start: the running gangs it waits for (JobWaiting.behind).
    behind: tuple[str, ...] = ()


def capacity_outcome(req: GangRequest, index: FreeIndex, model: str | None) -> Outcome:
    """Why `req` does not fit the free GPUs of `index`, with the numbers."""
    topo = index.topo
    noun = (f"{model} GPU" if model else "GPU") + ("" if req.gpus == 1 else "s")
    shape = f"{req.gpus} {noun}" + (f" ({req.ranks}x{req.gpus_per_rank})" if req.ranks > 1 else "")
    if not index.free:
        return Outcome(NO_NODES, f"needs {shape}; no schedulable node has any")
    largest_node = index.largest_node_free()
    if req.ranks == 1 or (req.required and req.level == NODE):
        return Outcome(CAPACITY, f"needs {shape} on one node, the largest free node has {largest_node}")
    if req.required and req.level is not None and req.level in topo.domains_at:
        best = max((index.free_gpus(d) for d in topo.domains_at[req.level]), default=0)
        return Outcome(CAPACITY, f"needs {shape} in one {req.level}, the largest free {req.level} has {best}")
    free = index.free_gpus("*")
    if free >= req.gpus:
        return Outcome(CAPACITY, f"needs {shape}, {free} free but too fragmented for {req.gpus_per_rank}-GPU ranks")
    return Outcome(CAPACITY, f"needs {shape}, {free} free in the cluster")


def explain(c: Cycle, plan: Plan, fresh: list[Job], outcomes: dict[str, Outcome]) -> list[JobWaiting]:
    """JobWaiting for the jobs looked at whose reason is due (see `due`), and a first reason for new jobs."""
    out: list[JobWaiting] = []
    state = c.state
    settle_at = state.newest_node_at + SETTLE_S
    for jid, o in outcomes.items():
        if o.code == PLACED or jid in plan.busy:
            continue
        job = state.jobs[jid]
        # A new holder of the backfill reservation is always told: the fold remembers it by that event.
        if due(job, o, c.now, settle_at, jid in state.unexplained) or (o.code == BACKFILL_HEAD and jid not in state.holders):
            out.append(_waiting(c, job, o))
    for job in fresh:
        if job.job_id in outcomes or job.job_id in plan.busy:
            continue
        queue = resolve_queue(state, job.spec.queue)
        est = c.policies.estimate(state, job, queue)
        run = f"; expected to run {est.describe()}" if est is not None else ""
        o = Outcome(QUEUED, f"in queue {queue} behind jobs that go first{run}")
        if due(job, o, c.now, settle_at, True):
            out.append(_waiting(c, job, o))
    return out


def due(job: Job, o: Outcome, now: float, settle_at: float, unexplained: bool) -> bool:
    """Whether `o` is worth a JobWaiting: a reason of another kind, stale numbers, or admission owed a verdict.

    A job explained before the cluster settled stays unexplained (the fold
    keeps it so, and the reject stage judges its capacity once more): it is
    told once more after settling, which closes that, and not every cycle
    meanwhile.
    """
    w = job.waiting
    if w is None:
        return True
    if unexplained and w.at < settle_at <= now:
        return True
    if o.hold is not None and w.code == o.code:
        # A told reservation is kept from the log while no GPU comes back (reservations._told_hold):
        # tell a new one; the same one again every REFRESH_S (its message's numbers move), and
        # once it was planned afresh because GPUs came back -- told again, the next cycles keep
        # it instead of planning it again (measured: half of all plans in a busy cluster).
        told = (w.hold_ranks, w.hold_until)
        return (o.hold.ranks, o.hold.until) != told or now - w.at >= REFRESH_S or o.replanned
    if w.code == o.code == BACKFILL_HEAD and w.behind != o.behind:
        return now - w.at >= REFRESH_S  # the gangs it waits for move like numbers: refreshed as they are
    if w.code == o.code and w.message == o.message:
        return False
    if w.code != o.code and not (w.code in _TURN and o.code in _TURN):
        return True
    return now - w.at >= REFRESH_S


def _waiting(c: Cycle, job: Job, o: Outcome) -> JobWaiting:
    return JobWaiting(
        event_id=c.event_id("waiting", job),
        occurred_at=c.now,
        job_id=job.job_id,
        code=o.code,
        message=o.message,
        epoch=c.epoch,
        hold_ranks=o.hold.ranks if o.hold is not None else (),
        hold_until=o.hold.until if o.hold is not None else 0.0,
        behind=o.behind,
    )
