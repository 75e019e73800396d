"""What each node must be told (issue #40): the difference between what the fold wants of a node and what the
node's slice says it was told, as WorkAssigned / WorkChanged follow-ups.

An agent reads only its node's slice of the log, so it learns of a reservation,
a preemption, a stop or the end of an attempt from orders on its node's
subject. They are derived, never a second truth: `wanted` reads the decisions
the fold took (a GangReserved, a PreemptionRequested, a requeue ...), the
slices (core/evolve_slices.py) say what each node was told, and the fold keeps
`ClusterState.orders_due` -- the jobs whose nodes lack an order -- current after
every event (evolve.py), so a cycle visits only those, oldest first, at most
`cap` orders a cycle. A new leader, a restarted one, or one that lost its
appends sends exactly what is still missing; an order is a decision like any
other, fenced by its epoch.

Orders come after the decision they carry is in the fold, never in the same
batch: a reservation that turns out void must never reach a node.
"""

from __future__ import annotations

from typing import NamedTuple

from msgspec import UNSET

from orchestrator.core.model.slices import NodeJob
from orchestrator.core.model.state import ClusterState, Job
from orchestrator.core.node_work import intent_of
from orchestrator.core.staging import staged
from schemas.events import (
    INTENT_CHECKPOINT,
    INTENT_RELEASE,
    INTENT_RUN,
    Event,
    WorkAssigned,
    WorkChanged,
)

#: Orders one cycle may append (each names one node); the rest go in the next cycles.
ORDERS_PER_CYCLE = 512


class Want(NamedTuple):
    """What one node should hold of a job: its current attempt, what to do with it, whether it may start."""

    attempt: int
    intent: str
    staged: bool
    grace_s: float

    def same(self, told: NodeJob) -> bool:
        return (told.attempt, told.intent, told.staged, told.grace_s) == self


def wanted(state: ClusterState, job_id: str) -> dict[str, Want]:
    """Node -> what it should hold of `job_id`: every node with a rank of the current attempt that did not exit
    for good, while the job holds GPUs."""
    job = state.jobs.get(job_id)
    if job is None or job_id not in state.active:
        return {}
    ranks = state.ranks.get(job_id, {})
    intent = intent_of(job)
    want = Want(job.attempt, intent, staged(job), _grace(job, intent))
    out: dict[str, Want] = {}
    for p in job.placement:
        if p.node_id not in out:
            st = ranks.get(p.rank)
            if st is None or st.status != "exited":
                out[p.node_id] = want
    return out


def _grace(job: Job, intent: str) -> float:
    if intent == INTENT_RUN:
        return 0.0
    if intent == INTENT_CHECKPOINT and job.preempt_grace_s > 0:
        return job.preempt_grace_s
    return job.spec.grace_period_s


def due(state: ClusterState, job_id: str) -> bool:
    """Whether some node lacks an order about `job_id` (what the fold keeps in `orders_due`)."""
    want = wanted(state, job_id)
    told_nodes = state.slice_jobs.get(job_id, ())
    if any(node not in want for node in told_nodes):
        return True
    for node, w in want.items():
        sl = state.slices.get(node)
        told = sl.work.get(job_id) if sl is not None else None
        if told is None or not w.same(told):
            return True
    return False


def node_orders(state: ClusterState, *, now: float, epoch: int, cap: int = ORDERS_PER_CYCLE) -> list[Event]:
    """The orders missing for the jobs in `orders_due`, oldest first, at most about `cap` (a job's orders stay
    together): releases and changes before assignments, so a node stops what it no longer holds first."""
    if cap < 1:
        raise ValueError(f"cap must be at least 1, got {cap}")
    stops: list[Event] = []
    starts: list[Event] = []
    for job_id in state.orders_due:
        if len(stops) + len(starts) >= cap:
            break
        _orders_for(state, job_id, now, epoch, stops, starts)
    return stops + starts


def _orders_for(state: ClusterState, job_id: str, now: float, epoch: int, stops: list[Event],
                starts: list[Event]) -> None:
    want = wanted(state, job_id)
    seq = state.seq
    for node in state.slice_jobs.get(job_id, ()):
        if node not in want:
            gone = state.slices[node].work[job_id]
            stops.append(WorkChanged(event_id=f"work:{node}:{job_id}:{gone.attempt}:{INTENT_RELEASE}:{seq}",
                                     occurred_at=now, node_id=node, job_id=job_id, attempt=gone.attempt, epoch=epoch,
                                     intent=INTENT_RELEASE, staged=gone.staged, reason=_why_released(state, job_id)))
    job = state.jobs.get(job_id)
    for node, w in want.items():
        assert job is not None
        sl = state.slices.get(node)
        told = sl.work.get(job_id) if sl is not None else None
        if told is not None and told.attempt == w.attempt:
            if not w.same(told):
                stops.append(WorkChanged(event_id=f"work:{node}:{job_id}:{w.attempt}:{w.intent}:{seq}",
                                         occurred_at=now, node_id=node, job_id=job_id, attempt=w.attempt,
                                         epoch=epoch, intent=w.intent, staged=w.staged, grace_s=w.grace_s))
            continue
        starts.append(_assignment(state, job, node, w, now, epoch))


def _assignment(state: ClusterState, job: Job, node: str, w: Want, now: float, epoch: int) -> WorkAssigned:
    placement = job.placement
    mine = tuple(sorted((p for p in placement if p.node_id == node), key=lambda p: p.rank))
    book = state.ranks.get(job.job_id, {})
    exited = tuple(p.rank for p in mine if (r := book.get(p.rank)) is not None and r.status == "exited")
    order = list(dict.fromkeys(p.node_id for p in sorted(placement, key=lambda p: p.rank)))
    master = min(placement, key=lambda p: p.rank).node_id
    master_node = state.nodes.get(master)
    return WorkAssigned(
        event_id=f"assign:{node}:{job.job_id}:{w.attempt}:{state.seq}", occurred_at=now, node_id=node,
        job_id=job.job_id, attempt=w.attempt, epoch=epoch, spec=job.spec, ranks=mine, world_size=len(placement),
        node_rank=order.index(node), master_addr=master_node.address if master_node is not None else "",
        master_port=job.master_port, resume_from=job.resume_from, not_before=job.not_before, staged=w.staged,
        intent=w.intent, grace_s=w.grace_s, exited=exited or UNSET,
    )


def _why_released(state: ClusterState, job_id: str) -> str:
    job = state.jobs.get(job_id)
    if job is None:
        return "the job is gone"
    if job_id not in state.active:
        return job.end_reason or f"the job is {job.status}"
    return f"attempt {job.attempt} holds no rank here"
