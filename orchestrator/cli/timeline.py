"""A job's story from the log alone: what `corral explain` prints.

The whole log is folded alongside, for two reasons: a decision may be void
(a GangReserved whose GPUs were taken by the time it landed says nothing
happened), which only the fold at that position knows; and the fold supplies
context an event only names, such as who the preemptor is (its name, queue
and priority) or what a resumed attempt resumes from.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple, assert_never

import msgspec

from events.bus import Envelope
from orchestrator.cli.render import (
    gates_text,
    mb,
    placement_summary,
    printable,
    unreadable,
    update_request_text,
    updated_text,
)
from orchestrator.core.evolve import evolve
from orchestrator.core.gating import gate_reason
from orchestrator.core.model.state import UNSTARTABLE, ClusterState, Job
from schemas import (
    AnyEvent,
    CancelRequested,
    Checkpointed,
    ClusterConfigured,
    DatasetEvicted,
    DatasetEvictRequested,
    DatasetFailed,
    DatasetReady,
    DatasetStaging,
    GangReserved,
    GangRestarted,
    GpuHealthy,
    GpuUnhealthy,
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobHeld,
    JobRejected,
    JobReleased,
    JobRequeued,
    JobRunning,
    JobSubmitted,
    JobUpdated,
    JobUpdateRequested,
    JobWaiting,
    NodeCordoned,
    NodeDatasets,
    NodeFailed,
    NodeHealthChecked,
    NodeRecovered,
    NodeRegistered,
    NodeUncordoned,
    Preempted,
    PreemptionRequested,
    QueueDefined,
    QueueDeleted,
    RequeueRequested,
    ReservationCreated,
    ReservationDeleted,
    SchedulerElected,
    Unknown,
    WorkAssigned,
    WorkChanged,
    WorkerExited,
    WorkerStarted,
    tag_of,
)


class Entry(NamedTuple):
    seq: int
    time: float
    type: str
    text: str
    #: The fold recorded this decision as void: it changed nothing.
    void: bool
    event: Any

    def to_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "time": self.time, "type": self.type, "text": self.text, "void": self.void,
                "event": msgspec.to_builtins(self.event)}


def _who(state: ClusterState, job_id: str) -> str:
    """`j-1 (eval, queue prod, priority 100)`: a job named with what makes it matter."""
    job = state.jobs.get(job_id)
    if job is None:
        return job_id
    return f"{job_id} ({job.spec.name}, queue {job.queue or job.spec.queue}, priority {job.spec.priority})"


def _exit(e: WorkerExited) -> str:
    if e.reason == UNSTARTABLE:  # never ran: the agent's reason instead of an exit code
        return f"rank {e.rank} could not start on {e.node_id}: {printable(e.log_tail, 300)}"
    how = f"exit code {e.exit_code}" if e.signal is None else f"signal {e.signal}"
    again = ", will restart" if e.will_restart else ""
    failed = ""
    if e.checkpoint_error:
        lost = f"{e.steps_lost} steps lost" if e.steps_lost >= 0 else "steps lost unknown"
        failed = f"; checkpoint failed: {e.checkpoint_error} ({lost})"
    return f"rank {e.rank} exited on {e.node_id}: {e.reason} ({how}{again}){failed}"


def _text(ev: AnyEvent, job_id: str, before: Job | None, state: ClusterState) -> str | None:
    """What `ev` means for `job_id`; None when it is not about it.

    Exhaustive over the event types, so a new one cannot enter a story blank
    (an unreadable message, `Unknown`, is told by `Story.add` from its subject).
    """
    match ev:
        case PreemptionRequested() if ev.preemptor_job_id == job_id and ev.job_id != job_id:
            return f"preempting {_who(state, ev.job_id)} to make room: {ev.reason}"
        case Preempted() if ev.preemptor_job_id == job_id and ev.job_id != job_id:
            return f"{ev.job_id} yielded its GPUs for this job"
        case GpuUnhealthy() if before is not None and not before.gpu_fault:
            after = state.jobs.get(job_id)
            if after is not None and after.gpu_fault:  # one of this attempt's GPUs failed under it
                return f"{after.gpu_fault} under attempt {after.attempt}: the gang stops and is requeued"
    if getattr(ev, "job_id", None) != job_id:
        return None
    match ev:
        case JobSubmitted(spec=s):
            by = f" by {ev.submitted_by}" if ev.submitted_by else ""
            topo = f", {s.topology.mode} one {s.topology.level}" if s.topology else ""
            gates = gates_text(s)
            return (f"submitted{by}: {s.name} to queue {s.queue}, {s.ranks}x{s.gpus_per_rank} GPUs{topo}, "
                    f"priority {s.priority}{'' if s.preemptible else ', not preemptible'}"
                    + (f";{gates}" if gates else ""))
        case JobRejected():
            return "rejected: " + "; ".join(ev.reasons)
        case JobWaiting():
            return f"pending ({ev.code}): {ev.message}"
        case GangReserved():
            why = f": {ev.reason}" if ev.reason else ""
            return f"reserved attempt {ev.attempt} on {placement_summary(ev.ranks)}{why}"
        case WorkerStarted():
            again = f" (restart {ev.restarts})" if ev.restarts else ""
            return f"rank {ev.rank} started on {ev.node_id}{again}"
        case WorkerExited():
            return _exit(ev)
        case JobRunning():
            job = state.jobs.get(job_id)
            ranks = job.spec.ranks if job else "all"
            resumed = job.resume_from if job is not None and ev.attempt > 1 else None
            tail = f", resumed from {resumed}" if resumed else ""
            return f"running: all {ranks} rank(s) of attempt {ev.attempt} started{tail}"
        case PreemptionRequested():
            return (f"preemption requested by {_who(state, ev.preemptor_job_id)}: {ev.reason}; checkpoint signal, "
                    f"grace {ev.grace_s:g}s")
        case Checkpointed():
            return f"checkpoint at step {ev.step} (attempt {ev.attempt}, rank {ev.rank}): {ev.path}"
        case Preempted():
            frm = ev.resume_from or (before.newest_checkpoint if before else None)
            return (f"preempted: GPUs yielded to {ev.preemptor_job_id or 'the preemptor'}; requeued as attempt "
                    f"{ev.attempt + 1} (its place in line is now), resumes from {frm or 'scratch (no checkpoint)'}")
        case JobRequeued():
            frm = ev.resume_from or (before.newest_checkpoint if before else None)
            return f"requeued as attempt {ev.attempt}: {ev.reason}; resumes from {frm or 'scratch'}"
        case GangRestarted():
            return f"gang restarted as attempt {ev.attempt}: {ev.reason or 'a rank crashed'}"
        case CancelRequested():
            by = f" by {ev.requested_by}" if ev.requested_by else ""
            return f"cancel requested{by}" + (f": {ev.reason}" if ev.reason else "")
        case JobCompleted():
            return f"completed (attempt {ev.attempt})"
        case JobFailed():
            return f"failed (attempt {ev.attempt}): {ev.reason}"
        case JobCancelled():
            return "cancelled" + (f": {ev.reason}" if ev.reason else "")
        case JobHeld():
            by = f" by {ev.requested_by}" if ev.requested_by else ""
            return f"held{by}" + (f": {ev.reason}" if ev.reason else "")
        case JobReleased():
            return "released" + (f" by {ev.requested_by}" if ev.requested_by else "")
        case DatasetStaging():
            if before is not None and before.staging is not None and before.staging.attempt == ev.attempt and any(
                    i.node_id == ev.node_id and i.dataset == ev.dataset for i in before.staging.items):
                return None  # progress of a staging already told: the story says when it began and ended
            total = f" of {mb(ev.bytes_total)}" if ev.bytes_total else ""
            return f"staging dataset {ev.dataset} on {ev.node_id} (attempt {ev.attempt}){total}"
        case DatasetReady():
            how = "cache hit, 0 bytes staged" if ev.cached else f"staged {mb(ev.staged_bytes)}"
            line = f"dataset {ev.dataset} ready on {ev.node_id}: {mb(ev.size_bytes)} ({how})"
            after = state.jobs.get(job_id)
            stg = after.staging if after is not None else None
            if stg is not None and stg.attempt == ev.attempt and stg.ready and (
                    before is None or before.staging is None or not before.staging.ready
                    or before.staging.attempt != ev.attempt):
                line += f"; all datasets ready on every node after {stg.ready_at - stg.started_at:.1f}s of staging"
            return line
        case JobUpdateRequested():
            return update_request_text(ev)
        case JobUpdated():
            return updated_text(ev)
        case RequeueRequested():
            return "requeue requested" + (f" by {ev.requested_by}" if ev.requested_by else "") + (
                f": {ev.reason}" if ev.reason else "")
        case WorkAssigned() | WorkChanged():
            return None  # a node's copy of the scheduler's decision, already told by the decision itself
        case DatasetFailed():
            return f"dataset {ev.dataset} failed on {ev.node_id} (attempt {ev.attempt}): {printable(ev.reason, 300)}"
        case (NodeRegistered() | NodeFailed() | NodeRecovered() | NodeCordoned() | NodeUncordoned() | QueueDefined()
              | QueueDeleted() | SchedulerElected() | ClusterConfigured() | GpuUnhealthy() | GpuHealthy()
              | NodeHealthChecked() | DatasetEvicted() | NodeDatasets() | ReservationCreated()
              | ReservationDeleted() | DatasetEvictRequested()):
            return None  # about no job: the job_id test above has already left
        case _:
            assert_never(ev)


class Story:
    """Feed it the whole log in order (`add`); it keeps the entries of one job's story."""

    def __init__(self, job_id: str, state: ClusterState | None = None) -> None:
        self.job_id = job_id
        self.state = state if state is not None else ClusterState()
        self.entries: list[Entry] = []
        #: The job's newest record: kept after the fold forgets it (past FINISHED_KEPT finished jobs).
        self.job: Job | None = None
        #: Stream time of the log's last event: where a wait still open ends.
        self.end = 0.0

    def add(self, env: Envelope) -> None:
        s, ev = self.state, env.event
        before = s.jobs.get(self.job_id)
        gate_before = self._gate(before)
        voids = s.voids
        evolve(s, ev, env.seq)
        self.end = env.stream_time
        self.job = s.jobs.get(self.job_id, self.job)
        if isinstance(ev, Unknown):  # about this job if published on its subjects: its story shows the gap
            parts = env.subject.split(".")
            if len(parts) >= 4 and parts[1] == "job" and parts[2] == self.job_id:
                self.entries.append(Entry(env.seq, env.stream_time, "Unknown", unreadable(env.seq, ev), False, ev))
            return
        text = _text(ev, self.job_id, before, s)
        gate = self._gate_change(gate_before, ev)
        if gate is not None:
            text = gate if text is None else f"{text}; {gate}"
        if text is None:
            return
        void = s.voids > voids
        if void:
            text = f"{text} -- VOID, changed nothing ({s.last_void.partition(': ')[2]})"
        self.entries.append(Entry(env.seq, env.stream_time, tag_of(ev), text, void, ev))


    def _gate(self, job: Job | None) -> tuple[object, ...] | None:
        """What keeps the job out of its line (core/gating.py), as a value to compare; None: nothing."""
        if job is None or self.job_id not in self.state.gated:
            return None
        return (job.held, job.blocked_on, job.doomed, job.status)

    def _gate_change(self, before: tuple[object, ...] | None, ev: AnyEvent) -> str | None:
        """A line for a change of the job's gates (held, dependencies, array slot), whichever event made it."""
        job = self.state.jobs.get(self.job_id)
        after = self._gate(job)
        if after == before or job is None:
            return None
        if after is not None:
            return f"gated: {gate_reason(self.state, job)}"
        if job.status == "pending":
            other: str = getattr(ev, "job_id", self.job_id)
            cause = self.state.jobs.get(other) if other != self.job_id else None
            why = f" ({other} {cause.status})" if cause is not None else ""
            return f"gates open{why}: in its queue's line"
        return None

    def add_void(self, env: Envelope, why: str) -> None:
        """`add` for an event the whole log's fold recorded as void (the index says so, having folded it):
        told as `add` tells it, folded as the no change it was. For a story folded from the job's events
        and their context only, which cannot judge it the way the whole log did."""
        self.end = env.stream_time
        ev = env.event
        if isinstance(ev, Unknown):
            return
        text = _text(ev, self.job_id, self.state.jobs.get(self.job_id), self.state)
        if text is not None:
            self.entries.append(Entry(env.seq, env.stream_time, tag_of(ev),
                                      f"{text} -- VOID, changed nothing ({why})", True, ev))


class Run(NamedTuple):
    """Entries in a row that say the same thing: one, or a reason told again and again."""

    first: Entry
    last: Entry
    told: int


def runs(entries: Iterable[Entry]) -> list[Run]:
    """`entries` with consecutive pending reasons of one code as one run.

    A job waiting its turn on a busy cluster is told its reason again with
    new numbers every REFRESH_S (core/explain.py): a day's wait is hundreds of
    lines of "needs 32 GPUs, 9 free", "... 7 free". A human reads the run
    once, with how long it lasted and its newest numbers; --json keeps
    every entry.
    """
    out: list[Run] = []
    for e in entries:
        prev = out[-1] if out else None
        if (prev is not None and isinstance(e.event, JobWaiting) and isinstance(prev.last.event, JobWaiting)
                and e.event.code == prev.last.event.code and not e.void and not prev.last.void):
            out[-1] = Run(prev.first, e, prev.told + 1)
        else:
            out.append(Run(e, e, 1))
    return out


#: After these the job waits no more: it holds GPUs, or it is over.
_DONE_WAITING = (GangReserved, JobCompleted, JobFailed, JobCancelled, JobRejected)


def pending_by_reason(entries: Iterable[Entry], end: float) -> dict[str, float]:
    """Seconds the job was pending under each reason code, longest first.

    A reason holds from its JobWaiting until the next one, a reservation or
    the end; a wait still open at the log's end runs to `end`. It answers
    "why did it wait so long" in one line: 12 h for capacity, 3 h behind a
    backfill reservation, 1 h holding one.
    """
    total: dict[str, float] = {}
    code: str | None = None
    since = 0.0
    for e in entries:
        ev = e.event
        if e.void or not isinstance(ev, (JobWaiting, *_DONE_WAITING)):
            continue
        if code is not None:
            total[code] = total.get(code, 0.0) + e.time - since
        code, since = (ev.code, e.time) if isinstance(ev, JobWaiting) else (None, 0.0)
    if code is not None:
        total[code] = total.get(code, 0.0) + max(end - since, 0.0)
    return dict(sorted(total.items(), key=lambda kv: -kv[1]))


def job_timeline(envelopes: Iterable[Envelope], job_id: str) -> list[Entry]:
    """The entries of `job_id`'s story in a whole log."""
    story = Story(job_id)
    for env in envelopes:
        story.add(env)
    return story.entries


def story_summary(job: Job | None, job_id: str, entries: list[Entry]) -> str:
    """One line on top: where the job is now (its newest record, `Story.job`) and what happened to it."""
    if job is None:
        return (f"{job_id}: its submission is not in the log (an unreadable line, or before the log's start): "
                "the steps below are all it says about the job")
    preemptions = sum(1 for e in entries if isinstance(e.event, Preempted) and e.event.job_id == job_id)
    extra = []
    if job.attempt > 1:
        extra.append(f"{job.attempt} attempts")
    if preemptions:
        extra.append(f"preempted {preemptions}x")
    if job.restarts:
        extra.append(f"{job.restarts} gang restart(s)")
    tail = f" ({', '.join(extra)})" if extra else ""
    return f"{job_id} ({job.spec.name}) is {job.status}{tail}"
