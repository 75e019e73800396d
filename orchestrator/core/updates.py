"""`corral update` (issue #41, like Slurm's `scontrol update`): a user's request, the scheduler's answer.

A client appends JobUpdateRequested (an operator JobUpdateByOperator); the
fold keeps it in `ClusterState.update_asks` until the scheduler answers with
a JobUpdated (`answer_updates`, a stage of decide): the changes it made,
old -> new, or why it refused. The answer is a decision like any other:
fenced by epoch, and checked again when folded (`job_updated`), so an answer
decided on a state that moved on (the job started meanwhile, or another
update landed first) is void and the request is answered afresh.

What may change (`changes_for`):
- a pending job: its priority, time limit and queue (it takes its new place
  in line at once: the fold moves it);
- a job holding GPUs: its time limit only, and lower only, unless an operator
  asks (Slurm: only an operator may raise a running job's limit). A lower
  limit already passed stops the job at the next cycle, as any limit does.
- a finished job: nothing.
"""

from __future__ import annotations

from bisect import insort
from typing import TYPE_CHECKING

from msgspec.structs import replace

from orchestrator.core.evolve_fencing import stale, void
from orchestrator.core.evolve_gpus import clear_earmark, end_changed
from orchestrator.core.gating import line_in, line_out
from orchestrator.core.model.estimates import claim_of
from orchestrator.core.model.state import HOLDING, TERMINAL, ClusterState, Job, UpdateAsk
from orchestrator.core.model.usage import resolve_queue
from schemas.events import FieldChange, JobUpdateByOperator, JobUpdated, JobUpdateRequested
from schemas.jobspec import JobSpec

if TYPE_CHECKING:
    from orchestrator.core.cycle import Cycle

#: Most unanswered update requests the fold keeps (a flood of them must not grow the state without bound).
ASKS_KEPT = 10_000


def update_requested(state: ClusterState, e: JobUpdateRequested) -> None:
    """Remember a request about a known job until the scheduler answers it."""
    if e.job_id not in state.jobs or len(state.update_asks) >= ASKS_KEPT:
        return
    state.update_asks[e.event_id] = UpdateAsk(
        job_id=e.job_id, requested_by=e.requested_by, operator=isinstance(e, JobUpdateByOperator),
        priority=e.priority, time_limit_s=e.time_limit_s, queue=e.queue, seq=state.seq)


def _limit(value: float | None) -> float | None:
    """A requested time limit as the spec holds it: 0 (or less) asks for none."""
    return None if value is None or value <= 0 else float(value)


def _raises(old: float | None, new: float | None) -> bool:
    return old is not None and (new is None or new > old)


def changes_for(job: Job | None, ask: UpdateAsk) -> tuple[tuple[FieldChange, ...], str]:
    """The changes `ask` makes to `job` (old -> new), or () and why it is refused."""
    if job is None:
        return (), f"unknown job {ask.job_id}"
    if job.status in TERMINAL:
        return (), f"job {job.job_id} is {job.status}: nothing to update (`corral requeue` runs it again)"
    spec = job.spec
    out: list[FieldChange] = []
    pending = job.status == "pending"
    if ask.priority is not None and ask.priority != spec.priority:
        if not pending:
            return (), f"job {job.job_id} is {job.status}: only a pending job's priority can change"
        out.append(FieldChange(field="priority", old=spec.priority, new=ask.priority))
    if ask.queue is not None and ask.queue != spec.queue:
        if not pending:
            return (), f"job {job.job_id} is {job.status}: only a pending job's queue can change"
        out.append(FieldChange(field="queue", old=spec.queue, new=ask.queue))
    if ask.time_limit_s is not None:
        new = _limit(ask.time_limit_s)
        if new != spec.time_limit_s:
            if job.status in HOLDING and _raises(spec.time_limit_s, new) and not ask.operator:
                return (), (f"job {job.job_id} is {job.status}: only an operator may raise its time limit "
                            "(`corral update --operator`, with the admin role's credentials)")
            out.append(FieldChange(field="time_limit_s", old=spec.time_limit_s, new=new))
    if not out:
        return (), f"job {job.job_id} already has these values: nothing to change"
    return tuple(out), ""


def answer_updates(c: Cycle) -> list[JobUpdated]:
    """Stage of decide: a JobUpdated for each update request the log holds unanswered."""
    state = c.state
    out: list[JobUpdated] = []
    for request_id, ask in state.update_asks.items():
        changes, refused = changes_for(state.jobs.get(ask.job_id), ask)
        out.append(JobUpdated(event_id=f"updated:{request_id}:{state.seq}", occurred_at=c.now, job_id=ask.job_id,
                              request_id=request_id, epoch=c.epoch, requested_by=ask.requested_by, changes=changes,
                              refused=refused))
    return out


def job_updated(state: ClusterState, e: JobUpdated) -> None:
    """Apply the scheduler's answer, if it still holds at this position (else void: the request stays asked)."""
    if stale(state, e.event_id, e.epoch, unstamped_ok=False):
        return
    ask = state.update_asks.get(e.request_id)
    if ask is None or ask.job_id != e.job_id:
        return  # answered already (a second scheduler's answer to the same request)
    job = state.jobs.get(e.job_id)
    if e.refused:
        del state.update_asks[e.request_id]
        return
    expected, _ = changes_for(job, ask)
    if job is None or expected != e.changes:
        void(state, e.event_id, f"job {e.job_id} changed since the answer was decided")
        return
    del state.update_asks[e.request_id]
    spec = job.spec
    for ch in e.changes:
        if ch.field == "priority" and isinstance(ch.new, int):
            spec = replace(spec, priority=ch.new)
        elif ch.field == "queue" and isinstance(ch.new, str):
            spec = replace(spec, queue=ch.new)
        elif ch.field == "time_limit_s":
            spec = replace(spec, time_limit_s=None if ch.new is None else float(ch.new))
    shown = ", ".join(f"{c.field} {_shown(c.old)} -> {_shown(c.new)}" for c in e.changes)
    job = replace(job, last_update=shown + (f" by {e.requested_by}" if e.requested_by else ""))
    if job.status == "pending":
        _repend(state, job, spec)
    else:
        _relimit(state, job, spec)


def _shown(v: object) -> str:
    return "none" if v is None else f"{v:g}" if isinstance(v, float) else str(v)


def _repend(state: ClusterState, job: Job, spec: JobSpec) -> None:
    """A pending job with a new spec: out of its line and back in at the place the new spec gives it."""
    in_line = job.job_id not in state.gated
    if in_line:
        line_out(state, job)
    clear_earmark(state, job)  # (a preemptor's earmark was planned for its old place)
    job = replace(job, spec=spec, waiting=None, earmark=())
    claim, source = claim_of(state, job, resolve_queue(state, job.spec.queue))
    job = state.jobs[job.job_id] = replace(job, claim=claim, claim_from=source)
    if in_line:
        line_in(state, job)
    else:
        state.unexplained.pop(job.job_id, None)


def _relimit(state: ClusterState, job: Job, spec: JobSpec) -> None:
    """A gang holding GPUs with a new time limit: its end moves in `ends` (react stops it when passed)."""
    old = job.end_key
    job = state.jobs[job.job_id] = replace(job, spec=spec)
    new = job.end_key
    ends = state.ends
    try:
        ends.remove(old)
    except ValueError:
        return
    end_changed(state, old, False)
    insort(ends, new)
    end_changed(state, new, True)
    if new < old:
        state.freed_seq = state.seq  # it ends sooner than its time limit said: backfill may plan on it
