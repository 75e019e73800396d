"""The fold's GPU bookkeeping: who owns each GPU, which are earmarked for a preemptor, when gangs end.

Job and node events change these only through here, so owners, earmarks,
`ends` and its change list stay in step (what decide's memos follow).
"""

from __future__ import annotations

from bisect import bisect_left

from orchestrator.core.model.state import FREE, ClusterState, Job
from orchestrator.core.model.usage import charge
from schemas.events import RankPlacement


def set_owner(state: ClusterState, ranks: tuple[RankPlacement, ...], owner: str) -> None:
    for rp in ranks:
        if rp.gpus:
            owners = list(state.owners[rp.node_id])
            for g in rp.gpus:
                owners[g] = owner
            state.owners[rp.node_id] = tuple(owners)


def release(state: ClusterState, job: Job, at: float) -> None:
    """Free the job's GPUs (only those it still owns) and uncharge its queue."""
    if job.job_id not in state.active:
        return
    state.freed_seq = state.seq
    for rp in job.placement:
        current = state.owners.get(rp.node_id)
        if current is None or not rp.gpus:
            continue
        owners = list(current)
        for g in rp.gpus:
            if g < len(owners) and owners[g] == job.job_id:
                owners[g] = FREE
        state.owners[rp.node_id] = tuple(owners)
    charge(state, job.queue, -job.gpus, at)
    del state.active[job.job_id]
    key = job.end_key
    i = bisect_left(state.ends, key)
    if i < len(state.ends) and state.ends[i] == key:
        del state.ends[i]
        end_changed(state, key, False)
    state.ranks.pop(job.job_id, None)


#: `ClusterState.ends_changes` keeps between this many changes and twice as many.
ENDS_CHANGES_KEPT = 256


def end_changed(state: ClusterState, key: tuple[float, float, str], added: bool) -> None:
    changes = state.ends_changes
    changes.append((state.seq, key, added))
    if len(changes) > 2 * ENDS_CHANGES_KEPT:
        state.ends_dropped = changes[-ENDS_CHANGES_KEPT - 1][0]
        del changes[:-ENDS_CHANGES_KEPT]


def set_earmark(state: ClusterState, ranks: tuple[RankPlacement, ...], job_id: str) -> None:
    for rp in ranks:
        size = len(state.owners.get(rp.node_id, ()))
        if not rp.gpus or size == 0:
            continue
        marks = list(state.earmarks.get(rp.node_id) or (FREE,) * size)
        for g in rp.gpus:
            if g < size and marks[g] == FREE:
                marks[g] = job_id
        state.earmarks[rp.node_id] = tuple(marks)


def clear_earmark(state: ClusterState, job: Job) -> None:
    if job.earmark:
        state.freed_seq = state.seq
    for rp in job.earmark:
        marks = state.earmarks.get(rp.node_id)
        if marks is None:
            continue
        cleared = tuple(FREE if m == job.job_id else m for m in marks)
        if any(m != FREE for m in cleared):
            state.earmarks[rp.node_id] = cleared
        else:
            del state.earmarks[rp.node_id]
