"""Stage 6, explain: every job left pending gets a structured reason.

A reason is a stable code plus a human message with the numbers that matter
("needs 16 GPUs (2x8) in one leaf, the largest free leaf has 12"). JobWaiting
is appended only when the code or message changed, so a steady queue costs
nothing. Messages avoid relative times so they do not change every tick.
"""

from __future__ import annotations

from typing import NamedTuple

from orchestrator.core.capacity import FreeIndex
from orchestrator.core.cycle import Cycle
from orchestrator.core.plan import Plan
from orchestrator.core.state import Job
from orchestrator.core.topology import NODE
from orchestrator.core.usage import resolve_queue
from orchestrator.policies.placement import GangRequest
from schemas.events import JobWaiting

PLACED = "placed"
QUEUED = "queued"
CAPACITY = "capacity"
QUOTA = "quota"
PREEMPTING = "preempting"
BACKFILL = "backfill"
BACKFILL_HEAD = "backfill_head"
NO_NODES = "no_nodes"


class Outcome(NamedTuple):
    code: str
    message: str


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
    """JobWaiting for the heads looked at whose reason changed, and a first reason for new jobs."""
    out: list[JobWaiting] = []
    jobs = c.state.jobs
    for jid, o in outcomes.items():
        job = jobs[jid]
        if o.code == PLACED or jid in plan.busy:
            continue
        w = job.waiting
        if w is None or w.code != o.code or w.message != o.message:
            out.append(_waiting(c, job, o))
    for job in fresh:
        if job.job_id in outcomes or job.job_id in plan.busy:
            continue
        queue = resolve_queue(c.state, job.spec.queue)
        out.append(_waiting(c, job, Outcome(QUEUED, f"in queue {queue} behind jobs that go first")))
    return out


def _waiting(c: Cycle, job: Job, o: Outcome) -> JobWaiting:
    return JobWaiting(
        event_id=c.event_id("waiting", job),
        occurred_at=c.now,
        job_id=job.job_id,
        code=o.code,
        message=o.message,
        epoch=c.epoch,
    )
