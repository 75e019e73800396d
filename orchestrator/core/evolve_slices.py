"""The fold of one node's slice: the orders it was given and what it reported (issue #40).

The same functions fold into the scheduler's `ClusterState.slices` (every node,
evolve.py) and into an agent's `NodeView` (its own node, node_view.py), so
both agree on what a node holds at every position of the log:

- WorkAssigned puts the attempt's ranks on the node (replacing an older attempt);
- WorkChanged changes what to do with them, or releases them;
- the node's own WorkerStarted / WorkerExited of that attempt record each rank's
  state, and once every rank there exited for good the node is through with the
  attempt: both folds drop it, no order needed;
- every start the node reported of a job it was told to run, and no exit ended yet,
  stays in `unended`, whatever the attempt (what a restarted agent must account for).

The callers check what needs the rest of the state: an order's epoch (fencing),
that the node is registered. Nothing here reads anything but the slice.
"""

from __future__ import annotations

from msgspec.structs import replace

from orchestrator.core.model.slices import NodeJob, NodeSlice, RankState
from schemas.events import (
    INTENT_CHECKPOINT,
    INTENT_RELEASE,
    INTENT_RUN,
    INTENT_STOP,
    WorkAssigned,
    WorkChanged,
    WorkerExited,
    WorkerStarted,
)

#: The intents a node keeps running ranks under (a WorkChanged with any other, from a newer writer, changes nothing).
KEPT_INTENTS = frozenset({INTENT_RUN, INTENT_CHECKPOINT, INTENT_STOP})


def assigned(sl: NodeSlice, e: WorkAssigned, seq: int) -> None:
    if e.intent not in KEPT_INTENTS:
        return
    old = sl.work.get(e.job_id)
    if old is not None and old.attempt > e.attempt:
        return  # a late order about an earlier attempt
    sl.work[e.job_id] = NodeJob(
        job_id=e.job_id, attempt=e.attempt, spec=e.spec, ranks=e.ranks, world_size=e.world_size,
        node_rank=e.node_rank, master_addr=e.master_addr, master_port=e.master_port, resume_from=e.resume_from,
        not_before=e.not_before, staged=e.staged, intent=e.intent, grace_s=e.grace_s, seq=seq,
        reports=tuple((r, RankState(node_id=e.node_id, status="exited", reason="exited before its order"))
                      for r in sorted(set(e.exited) & {p.rank for p in e.ranks})) if e.exited else (),
    )


def changed(sl: NodeSlice, e: WorkChanged) -> None:
    job = sl.work.get(e.job_id)
    if job is None or job.attempt != e.attempt:
        return
    if e.intent == INTENT_RELEASE:
        del sl.work[e.job_id]
    elif e.intent in KEPT_INTENTS:
        sl.work[e.job_id] = replace(job, intent=e.intent, staged=e.staged, grace_s=e.grace_s)


def _current(sl: NodeSlice, job_id: str, attempt: int, rank: int) -> NodeJob | None:
    job = sl.work.get(job_id)
    if job is None or job.attempt != attempt or not any(p.rank == rank for p in job.ranks):
        return None
    return job


def _with_report(job: NodeJob, rank: int, st: RankState) -> NodeJob:
    reports = tuple(sorted((*(r for r in job.reports if r[0] != rank), (rank, st)), key=lambda r: r[0]))
    return replace(job, reports=reports)


def reported_started(sl: NodeSlice, e: WorkerStarted, at: float) -> None:
    if e.job_id not in sl.work:
        return  # not a job this node was told to run (any attempt): no worker of ours
    sl.unended[(e.job_id, e.attempt, e.rank)] = e.restarts
    job = _current(sl, e.job_id, e.attempt, e.rank)
    if job is None:
        return
    prev = job.report(e.rank)
    if prev is not None and prev.status != "restarting":
        return  # a repeat, or a start after the rank exited for good: nothing starts it again
    sl.work[e.job_id] = _with_report(job, e.rank, RankState(node_id=e.node_id, status="started",
                                                            restarts=e.restarts, started_at=at))


def reported_exited(sl: NodeSlice, e: WorkerExited, at: float) -> None:
    key = (e.job_id, e.attempt, e.rank)
    generation = sl.unended.get(key)
    if generation is not None and generation <= e.restarts:
        del sl.unended[key]  # an exit ends the start of its generation or an earlier one
    job = _current(sl, e.job_id, e.attempt, e.rank)
    if job is None:
        return
    prev = job.report(e.rank)
    if prev is not None and prev.status == "exited":
        return
    st = RankState(node_id=e.node_id, status="restarting" if e.will_restart else "exited", exit_code=e.exit_code,
                   reason=e.reason, restarts=e.restarts, started_at=prev.started_at if prev is not None else 0.0,
                   exited_at=at)
    job = _with_report(job, e.rank, st)
    if job.done:
        del sl.work[e.job_id]
    else:
        sl.work[e.job_id] = job
