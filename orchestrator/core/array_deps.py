"""Dependencies on a whole job array, settled from the fold's counters of the array.

`corral submit --after-ok ARRAY` names the array once (`Gates.after_ok_arrays`):
the dependent waits until every element completed (a failed, cancelled or
rejected one dooms it, as a failed job dooms an after-ok on it), and with
`after_any_arrays` until every element ended, however. The fold keeps one
`ArrayTally` per array -- elements declared, submitted, ended, succeeded --
and each end of an element moves it; the dependents are looked at only when
the verdict can have changed (an element ended other than completed, or the
last one ended), so a 2,000-element array costs its dependents nothing per
element. Every reader folds the same counters from the same log, so the
verdict survives any restart of the scheduler.

An array the log does not know when the dependent is submitted (no element
yet) never will be in its past: the dependency is doomed, like one on an
unknown job. An element's dependency on its own array would wait for itself:
doomed too.
"""

from __future__ import annotations

from msgspec.structs import replace

from orchestrator.core.model.arrays import ArrayTally
from orchestrator.core.model.state import TERMINAL, ClusterState, Job

#: A verdict: the dependency is met, must still wait, or can never be met (the reason).
MET = "met"
WAIT = "wait"


def verdict(tally: ArrayTally | None, array_id: str, ok: bool) -> str:
    """MET, WAIT, or why the dependency on `array_id` can never be met."""
    if tally is None:
        return f"array {array_id} does not exist"
    if ok and tally.first_failure:
        return f"array {array_id}: task {tally.first_failure}"
    return MET if tally.all_ended else WAIT


def counted_submit(state: ClusterState, job: Job) -> None:
    """An element of an array was submitted (the first time): count it."""
    arr = job.spec.gating.array
    if arr is None:
        return
    t = state.arrays.get(arr.array_id, ArrayTally())
    declared = arr.count if isinstance(arr.count, int) else 0
    state.arrays[arr.array_id] = replace(t, declared=max(t.declared, declared), submitted=t.submitted + 1)


def blocking_arrays(state: ClusterState, job: Job) -> tuple[tuple[str, ...], str]:
    """At submit: the arrays `job` must wait for, and why one can never be met ("" if none); noted as dependents."""
    g = job.spec.gating
    own = g.array.array_id if g.array is not None else None
    blocked: list[str] = []
    doomed = ""
    for aid, ok in [*((a, True) for a in g.after_ok_arrays), *((a, False) for a in g.after_any_arrays)]:
        if aid == own:
            doomed = doomed or f"array {aid} is its own array"
            continue
        v = verdict(state.arrays.get(aid), aid, ok or aid in g.after_ok_arrays)
        if v == WAIT:
            if aid not in blocked:
                blocked.append(aid)
        elif v != MET:
            doomed = doomed or v
    for aid in blocked:
        state.array_dependents[aid] = (*state.array_dependents.get(aid, ()), job.job_id)
    return tuple(blocked), doomed


def counted_end(state: ClusterState, job: Job) -> list[Job]:
    """An element of an array ended (`job` as it ended): count it; the dependents whose verdict it changed,
    updated in `state.jobs` (doomed, or no longer blocked by the array) for the caller to gate or let in."""
    arr = job.spec.gating.array
    if arr is None or job.status not in TERMINAL:
        return []
    aid = arr.array_id
    t = state.arrays.get(aid)
    if t is None:  # (an element whose submit the fold never saw: a log cut short; count it all the same)
        t = ArrayTally(submitted=1)
    ok = job.status == "completed"
    t = state.arrays[aid] = replace(t, ended=t.ended + 1, succeeded=t.succeeded + ok,
                                    first_failure=t.first_failure or ("" if ok else f"{job.job_id} {job.status}"))
    if ok and not t.all_ended:
        return []  # nothing a dependent waits for changed
    dependents = state.array_dependents.get(aid, ())
    if t.all_ended:
        state.array_dependents.pop(aid, None)
    moved: list[Job] = []
    for dep in dependents:
        d = state.jobs.get(dep)
        if d is None or d.status != "pending" or aid not in d.blocked_on_arrays or d.doomed:
            continue
        v = verdict(t, aid, aid in d.spec.gating.after_ok_arrays)
        if v == WAIT:
            continue
        # The verdict is in: it no longer waits for this array, either way.
        d = replace(d, blocked_on_arrays=tuple(a for a in d.blocked_on_arrays if a != aid),
                    doomed="" if v == MET else v)
        state.jobs[dep] = d
        moved.append(d)
    return moved


def array_reasons(state: ClusterState, job: Job) -> list[str]:
    """"waiting for array A to complete ok: 1,234 of 2,000 tasks done", one per array it waits for."""
    ok = set(job.spec.gating.after_ok_arrays)
    out: list[str] = []
    for aid in job.blocked_on_arrays:
        t = state.arrays.get(aid, ArrayTally())
        out.append(f"waiting for array {aid} to {'complete ok' if aid in ok else 'end'}: {t.progress()}")
    return out
