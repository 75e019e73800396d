"""Holds, dependencies and array limits: which pending jobs may stand in their queue's line at all.

A pending job is either in its queue's line (`ClusterState.lines`: admission
picks its candidates there and nowhere else) or gated (`ClusterState.gated`):
held (JobHeld, or submitted with `gates.hold`) until JobReleased; waiting for
the jobs it depends on (`gates.after_ok`: each must complete; `after_any`:
each must end, however); or an array element waiting for one of its array's
slots. The fold moves jobs between the two as the facts arrive, so every
reader -- scheduler, agents, `explain`, the simulator -- agrees on it, and a
GangReserved for a gated job is void (evolve_jobs.reservation_problem): a
placement decided before a hold landed loses to it by log order.

Array slots: an element of an array with a limit N (`--array 0-99%8`) takes
one of N slots when it enters its line and keeps it while it holds GPUs (a
requeue or preemption keeps it) until it ends or is held. Elements in line
plus elements holding GPUs never exceed N, however many one decide cycle
places; a freed slot goes to the waiting element submitted first.

A dependency that can never be met -- after_ok on a job that failed, was
cancelled or rejected, or on a job the log does not know when this one is
submitted (nor this job itself) -- dooms the job: it stays gated,
`ClusterState.doomed` lists it, and react ends it as JobCancelled with the
reason. Dependencies point back in the log (the job must be known at submit),
so they never form a cycle.
"""

from __future__ import annotations

from bisect import bisect_left, insort

import msgspec
from msgspec.structs import replace

from orchestrator.core import array_deps
from orchestrator.core.evolve_gpus import clear_earmark
from orchestrator.core.model.state import BIG_GANG_GPUS, HOLDING, TERMINAL, ClusterState, Job
from schemas.events import JobHeld, JobReleased
from schemas.jobspec import Gates, jobspec_problems

#: Prefix of the reason a doomed job is cancelled with.
NEVER_SATISFIED = "dependency never satisfied"
#: Prefix of each reason a gated job is rejected with at once (as reject.py's stage words it).
INVALID_SPEC = "invalid spec: "


def has_gates(g: Gates) -> bool:
    return bool(g.after_ok or g.after_any or g.after_ok_arrays or g.after_any_arrays or g.hold or g.array is not None)


def is_blocked(job: Job) -> bool:
    """Gated whatever its array says: held, or a dependency not met (yet, or ever)."""
    return job.held or bool(job.blocked_on) or bool(job.blocked_on_arrays) or bool(job.doomed)


# --- the line itself ---------------------------------------------------------


def line_in(state: ClusterState, job: Job) -> None:
    """Put a pending job in its queue's line (a job never explained is owed a first reason)."""
    if job.waiting is None:
        state.unexplained[job.job_id] = job.submit_seq
    insort(state.lines.setdefault(job.spec.queue, []), job.line_key)
    if job.spec.total_gpus >= BIG_GANG_GPUS:  # what the starvation bound watches (core/starving.py)
        insort(state.big_pending, (job.waiting_since, job.job_id))


def line_out(state: ClusterState, job: Job) -> None:
    """Take a pending job out of its queue's line (no change if it is not there)."""
    if job.job_id in state.holders:
        state.holders.remove(job.job_id)
    state.unexplained.pop(job.job_id, None)
    if job.spec.total_gpus >= BIG_GANG_GPUS:
        big = state.big_pending
        i = bisect_left(big, (job.waiting_since, job.job_id))
        if i < len(big) and big[i][1] == job.job_id:
            del big[i]
    line = state.lines.get(job.spec.queue)
    if line is None:
        return
    key = job.line_key
    i = bisect_left(line, key)
    if i < len(line) and line[i] == key:
        del line[i]
    if not line:
        del state.lines[job.spec.queue]


# --- moves of the fold -------------------------------------------------------


def submitted(state: ClusterState, job: Job) -> Job:
    """`job` (just submitted) with its gates settled against the log so far; its dependencies noted."""
    g = job.spec.gating
    if not has_gates(g):
        return job
    array_deps.counted_submit(state, job)
    invalid = invalid_gates(job)
    if invalid:  # (rejected by react: it waits for nothing)
        return replace(job, held=g.hold, doomed=invalid)
    blocked: list[str] = []
    doomed = ""
    for target, ok in [*((t, True) for t in g.after_ok), *((t, False) for t in g.after_any)]:
        t = state.jobs.get(target)
        if t is None:
            doomed = doomed or f"job {target} does not exist"
        elif t.status in TERMINAL:
            if ok and t.status != "completed":
                doomed = doomed or f"job {target} {t.status}"
        elif target not in blocked:
            blocked.append(target)
    for target in blocked:
        state.dependents[target] = (*state.dependents.get(target, ()), job.job_id)
    arrays, doomed_by = array_deps.blocking_arrays(state, job) if g.after_ok_arrays or g.after_any_arrays else ((), "")
    return replace(job, held=g.hold, blocked_on=tuple(blocked), blocked_on_arrays=arrays, doomed=doomed or doomed_by)


def invalid_gates(job: Job) -> str:
    """Why the scheduler refuses `job` at once ("invalid spec: ..."), "" if it does not: a job that depends on
    others or is held is validated when it is submitted, not when its gates open (which may be never, or after
    the whole array it waits for ran). react rejects it with this reason."""
    g = job.spec.gating
    if not (g.after_ok or g.after_any or g.after_ok_arrays or g.after_any_arrays or g.hold):
        return ""
    return "; ".join(invalid_reasons(job))


def invalid_reasons(job: Job) -> tuple[str, ...]:
    """Every problem of `job`'s spec, as the reasons it is rejected with (empty: valid)."""
    return tuple(f"{INVALID_SPEC}{p}" for p in jobspec_problems(msgspec.to_builtins(job.spec)))


def enter(state: ClusterState, job: Job) -> None:
    """A pending job (submitted, requeued, released, its dependencies met) goes to its line, or is gated."""
    jid = job.job_id
    if is_blocked(job):
        _gate(state, job)
        return
    arr = job.spec.gating.array
    if arr is not None and arr.limit > 0:
        slots = state.array_slots.setdefault(arr.array_id, {})
        if jid not in slots:
            if len(slots) >= arr.limit:
                _gate(state, job)
                waiting = state.array_waiting.setdefault(arr.array_id, [])
                key = (job.submit_seq, jid)
                i = bisect_left(waiting, key)
                if i == len(waiting) or waiting[i] != key:
                    waiting.insert(i, key)
                return
            slots[jid] = None
    state.gated.pop(jid, None)
    line_in(state, job)


def _gate(state: ClusterState, job: Job) -> None:
    state.gated[job.job_id] = job.submit_seq
    if job.doomed:
        state.doomed[job.job_id] = job.submit_seq


def leave(state: ClusterState, job: Job) -> None:
    """A job leaves `pending` (reserved, rejected, ended): out of its line or of the gated ones."""
    if state.pending.pop(job.job_id, None) is None:
        return
    if state.gated.pop(job.job_id, None) is not None:
        state.doomed.pop(job.job_id, None)
        _unwait(state, job)
    else:
        line_out(state, job)


def ended(state: ClusterState, job: Job) -> None:
    """`job` ended (its record in `state.jobs` says how): free its array slot, settle its dependents."""
    arr = job.spec.gating.array
    if arr is not None and arr.limit > 0:
        _free_slot(state, arr.array_id, job.job_id, arr.limit)
    for moved in array_deps.counted_end(state, job):
        if moved.doomed:
            state.doomed[moved.job_id] = moved.submit_seq
        elif not is_blocked(moved):
            enter(state, moved)
    dependents = state.dependents.pop(job.job_id, ())
    for dep in dependents:
        d = state.jobs.get(dep)
        if d is None or d.status != "pending" or job.job_id not in d.blocked_on:
            continue
        ok = job.job_id in d.spec.gating.after_ok
        doomed = d.doomed or (f"job {job.job_id} {job.status}" if ok and job.status != "completed" else "")
        d = state.jobs[dep] = replace(d, blocked_on=tuple(t for t in d.blocked_on if t != job.job_id), doomed=doomed)
        if d.doomed:
            state.doomed[dep] = d.submit_seq
        elif not is_blocked(d):
            enter(state, d)


def _unwait(state: ClusterState, job: Job) -> None:
    arr = job.spec.gating.array
    if arr is None:
        return
    waiting = state.array_waiting.get(arr.array_id)
    if waiting is None:
        return
    i = bisect_left(waiting, (job.submit_seq, job.job_id))
    if i < len(waiting) and waiting[i] == (job.submit_seq, job.job_id):
        del waiting[i]
    if not waiting:
        del state.array_waiting[arr.array_id]


def _free_slot(state: ClusterState, array_id: str, job_id: str, limit: int) -> None:
    """`job_id` gives its slot back; the elements waiting longest take the free ones."""
    slots = state.array_slots.get(array_id)
    if slots is None or job_id not in slots:
        return
    del slots[job_id]
    waiting = state.array_waiting.get(array_id)
    if waiting is not None:
        while waiting and len(slots) < limit:
            _, wid = waiting.pop(0)
            slots[wid] = None
            state.gated.pop(wid, None)
            line_in(state, state.jobs[wid])
        if not waiting:
            del state.array_waiting[array_id]
    if not slots:
        del state.array_slots[array_id]


def held(state: ClusterState, e: JobHeld) -> None:
    job = state.jobs.get(e.job_id)
    if job is None or job.status != "pending" or job.held:
        return  # only a pending job is held (as Slurm's `scontrol hold`); holding twice is holding once
    was_gated = e.job_id in state.gated
    clear_earmark(state, job)  # a held preemptor gives up the GPUs earmarked for it
    job = state.jobs[e.job_id] = replace(job, held=True, earmark=())
    if was_gated:
        _unwait(state, job)  # a held element waits for its release, not for a slot
        return
    line_out(state, job)
    _gate(state, job)
    arr = job.spec.gating.array
    if arr is not None and arr.limit > 0:
        _free_slot(state, arr.array_id, job.job_id, arr.limit)


def released(state: ClusterState, e: JobReleased) -> None:
    job = state.jobs.get(e.job_id)
    if job is None or job.status != "pending" or not job.held:
        return
    job = state.jobs[e.job_id] = replace(job, held=False)
    enter(state, job)


def end_ungates(state: ClusterState, job_id: str) -> bool:
    """Whether the end of `job_id` (not folded yet) moves other jobs: ones that depend on it, or its array's
    elements waiting for a slot. (The simulator settles another round for them.)"""
    if job_id in state.dependents:
        return True
    job = state.jobs.get(job_id)
    arr = job.spec.gating.array if job is not None else None
    return arr is not None and (arr.array_id in state.array_waiting or arr.array_id in state.array_dependents)


# --- what readers tell -------------------------------------------------------


def gate_reason(state: ClusterState, job: Job) -> str | None:
    """Why a gated job is not in its line ("held", "waiting for j-1 to complete ok", "array 0-99%8: 8 running");
    None for a job in its line, or not pending."""
    if job.status != "pending" or job.job_id not in state.gated:
        return None
    if job.doomed.startswith(INVALID_SPEC):
        return f"to be rejected: {job.doomed}"
    if job.doomed:
        return f"{NEVER_SATISFIED}: {job.doomed}"
    parts: list[str] = []
    if job.held:
        parts.append(f"held (`corral release {job.job_id}` lets it start)")
    ok = set(job.spec.gating.after_ok)
    for t in job.blocked_on:
        parts.append(f"waiting for {t} to complete ok" if t in ok else f"waiting for {t} to end")
    parts.extend(array_deps.array_reasons(state, job))
    arr = job.spec.gating.array
    if not parts and arr is not None:
        slots = state.array_slots.get(arr.array_id, {})
        running = sum(1 for j in slots if (s := state.jobs.get(j)) is not None and s.status in HOLDING)
        starting = len(slots) - running
        more = f", {starting} starting" if starting else ""
        parts.append(f"array {arr.indexes or arr.array_id}%{arr.limit}: {running} running{more}")
    return "; ".join(parts) or "gated"
