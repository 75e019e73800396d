"""One readable line per event: what `corral tail`, the demo and `corral top` print."""

from __future__ import annotations

import datetime as dt
from typing import assert_never

from events.bus import Envelope
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
    JobSpec,
    JobSubmitted,
    JobUpdateByOperator,
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
    RankPlacement,
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
from schemas.events import REFUSED


def placement_summary(ranks: tuple[RankPlacement, ...]) -> str:
    """`n1[0-7] n2[0-7]`: nodes in rank order with their GPU indices."""
    by_node: dict[str, list[int]] = {}
    for p in sorted(ranks, key=lambda p: p.rank):
        by_node.setdefault(p.node_id, []).extend(p.gpus)
    return " ".join(f"{n}[{_ranges(g)}]" for n, g in by_node.items())


def _ranges(xs: list[int]) -> str:
    xs = sorted(xs)
    out: list[str] = []
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(out)


def essentials(event: AnyEvent | Unknown) -> str:
    """The few facts of an event an operator scans for; exhaustive, so a new event type cannot print blank."""
    match event:
        case JobSubmitted(spec=s):
            topo = f" {s.topology.mode} {s.topology.level}" if s.topology else ""
            return f"{s.name} queue={s.queue} prio={s.priority} {s.ranks}x{s.gpus_per_rank} GPU{topo}{gates_text(s)}"
        case GangReserved():
            return f"attempt={event.attempt} epoch={event.epoch} {placement_summary(event.ranks)} {event.reason}".rstrip()
        case JobWaiting():
            return f"{event.code}: {event.message}"
        case WorkerStarted():
            return f"attempt={event.attempt} rank={event.rank} on {event.node_id}" + (
                f" restart {event.restarts}" if event.restarts else "")
        case WorkerExited():
            how = f"exit={event.exit_code}" if event.signal is None else f"signal={event.signal}"
            again = " (restarting)" if event.will_restart else ""
            failed = f" checkpoint_failed={event.checkpoint_error!r} steps_lost={event.steps_lost}" if (
                event.checkpoint_error) else ""
            return f"attempt={event.attempt} rank={event.rank} {event.reason} {how}{again}{failed}"
        case JobRunning() | JobCompleted():
            return f"attempt={event.attempt}"
        case PreemptionRequested():
            return f"attempt={event.attempt} for {event.preemptor_job_id}: {event.reason} (grace {event.grace_s:g}s)"
        case Checkpointed():
            return f"attempt={event.attempt} rank={event.rank} step={event.step} {event.path}"
        case Preempted():
            return f"attempt={event.attempt} by {event.preemptor_job_id} resume_from={event.resume_from or '-'}"
        case GangRestarted() | JobRequeued():
            extra = f" resume_from={event.resume_from}" if isinstance(event, JobRequeued) and event.resume_from else ""
            return f"attempt={event.attempt} {event.reason}{extra}"
        case JobFailed():
            return f"attempt={event.attempt} {event.reason}"
        case JobRejected():
            return "; ".join(event.reasons)
        case JobCancelled():
            return event.reason
        case CancelRequested():
            by = f" by {event.requested_by}" if event.requested_by else ""
            return f"{event.reason}{by}".strip()
        case NodeRegistered():
            inv = event.inventory
            model = inv.gpus[0].model if inv.gpus else "no GPUs"
            labels = ",".join(f"{k}={v}" for k, v in sorted(inv.labels.items()))
            return f"{inv.gpu_count}x {model} at {event.address} {labels}".rstrip()
        case NodeFailed():
            return event.reason
        case NodeRecovered():
            return f"incarnation={event.incarnation}"
        case NodeCordoned():
            return event.reason
        case NodeUncordoned():
            return "uncordoned: takes new work again"
        case QueueDefined():
            limit = "-" if event.limit_gpus is None else event.limit_gpus
            parent = f" parent={event.parent}" if event.parent else ""
            return f"weight={event.weight:g} guarantee={event.guaranteed_gpus} limit={limit}{parent}"
        case QueueDeleted():
            return "deleted"
        case SchedulerElected():
            policy = f" policy={event.policy}" if isinstance(event.policy, str) else ""  # (UNSET: before --policy)
            return f"epoch={event.epoch} {event.scheduler_id}{policy}"
        case ClusterConfigured():
            return f"levels={'>'.join(event.topology_levels) or '-'} min_runtime={event.min_runtime_s:g}s"
        case JobHeld():
            by = f" by {event.requested_by}" if event.requested_by else ""
            return f"held{by}" + (f": {event.reason}" if event.reason else "")
        case JobReleased():
            return "released" + (f" by {event.requested_by}" if event.requested_by else "")
        case GpuUnhealthy():
            job = f" job={event.running_job}" if event.running_job else ""
            return f"GPU {event.gpu_index} {event.severity}: {event.reason} ({event.source}){job}"
        case GpuHealthy():
            return f"GPU {event.gpu_index} healthy: {event.reason or 'back in service'} ({event.source})"
        case NodeHealthChecked():
            return "health check passed" if event.ok else f"health check failed (exit {event.exit_code}): {event.output}"
        case DatasetStaging():
            total = f"/{mb(event.bytes_total)}" if event.bytes_total else ""
            return f"attempt={event.attempt} {event.dataset} on {event.node_id}: {mb(event.bytes_done)}{total}"
        case DatasetReady():
            how = "cache hit" if event.cached else f"staged {mb(event.staged_bytes)}"
            return f"attempt={event.attempt} {event.dataset} on {event.node_id}: {mb(event.size_bytes)} ({how})"
        case DatasetFailed():
            return f"attempt={event.attempt} {event.dataset} on {event.node_id}: {event.reason}"
        case DatasetEvicted():
            return f"{event.key} {mb(event.size_bytes)} {event.reason}".rstrip()
        case DatasetEvictRequested():
            by = f" by {event.requested_by}" if event.requested_by else ""
            return f"{event.key} evict asked{by} {event.reason}".rstrip()
        case NodeDatasets():
            cap = f" of {mb(event.capacity_bytes)}" if event.capacity_bytes else ""
            used = sum(d.size_bytes for d in event.datasets)
            return f"{len(event.datasets)} cached dataset(s), {mb(used)}{cap}"
        case WorkAssigned():
            ranks = ",".join(str(r.rank) for r in event.ranks)
            return (f"attempt={event.attempt} epoch={event.epoch} {event.job_id} ranks {ranks} on {event.node_id} "
                    f"intent={event.intent}")
        case WorkChanged():
            return f"attempt={event.attempt} epoch={event.epoch} {event.job_id} intent={event.intent} {event.reason}".rstrip()
        case JobUpdateRequested():  # (JobUpdateByOperator too)
            return update_request_text(event)
        case JobUpdated():
            return updated_text(event)
        case RequeueRequested():
            return "requeue requested" + (f" by {event.requested_by}" if event.requested_by else "") + (
                f": {event.reason}" if event.reason else "")
        case ReservationCreated():
            who = ",".join(event.users) or "any user"
            queue = f" queue={event.queue}" if event.queue else ""
            return (f"{event.name}: nodes {','.join(event.nodes)} t={event.start:.0f}..{event.end:.0f} "
                    f"users={who}{queue}" + (f" by {event.created_by}" if event.created_by else ""))
        case ReservationDeleted():
            return f"{event.name}: deleted" + (f" by {event.deleted_by}" if event.deleted_by else "")
        case Unknown():
            return printable(event.error, WHY_CHARS)
        case _:
            assert_never(event)


def limit_text(v: object) -> str:
    """A FieldChange value for people: a time limit of None is "none"."""
    return "none" if v is None else f"{v:g}" if isinstance(v, float) else str(v)


def update_request_text(e: JobUpdateRequested) -> str:
    asked = [f"{k}={limit_text(v) if k != 'time_limit_s' or v else 'none'}"
             for k, v in (("priority", e.priority), ("time_limit_s", e.time_limit_s), ("queue", e.queue))
             if v is not None]
    who = " as operator" if isinstance(e, JobUpdateByOperator) else ""
    by = f" by {e.requested_by}" if e.requested_by else ""
    return f"update requested{by}{who}: {' '.join(asked) or 'nothing'}"


def updated_text(e: JobUpdated) -> str:
    by = f" (asked by {e.requested_by})" if e.requested_by else ""
    if e.refused:
        return f"update refused{by}: {e.refused}"
    return "updated " + ", ".join(f"{c.field} {limit_text(c.old)} -> {limit_text(c.new)}" for c in e.changes) + by


def mb(n: int) -> str:
    """A byte count for people: `12.3 MB`."""
    return f"{n / 1e6:.1f} MB" if n < 10**10 else f"{n / 1e9:.1f} GB"


def gates_text(spec: JobSpec) -> str:
    """` array=j-1[3] of 0-99%8 after-ok=j-0 held`: a spec's gates, "" for a job without."""
    g = spec.gating
    parts = []
    if g.array is not None:
        limit = f"%{g.array.limit}" if g.array.limit else ""
        parts.append(f"array={g.array.array_id}[{g.array.index}] of {g.array.indexes or '?'}{limit}")
    if g.after_ok:
        parts.append("after-ok=" + ",".join(g.after_ok))
    if g.after_any:
        parts.append("after-any=" + ",".join(g.after_any))
    if g.after_ok_arrays:
        parts.append("after-ok=array:" + ",array:".join(g.after_ok_arrays))
    if g.after_any_arrays:
        parts.append("after-any=array:" + ",array:".join(g.after_any_arrays))
    if g.hold:
        parts.append("held")
    return "".join(f" {p}" for p in parts)


#: Most characters of an unreadable message's reason a line shows (`--json` has all of it).
WHY_CHARS = 160


def printable(text: str, limit: int | None = None) -> str:
    """`text` as one line of printable characters, cut at `limit`.

    Whatever a publisher put in a payload can reach a reader's screen (a tag, a
    name, msgspec quoting a bad value): escaped, a line break or a terminal
    escape cannot split one event into two lines or repaint the terminal.
    """
    cut = text if limit is None else text[:limit]
    if not cut.isprintable():
        cut = "".join(c if c.isprintable() else repr(c)[1:-1] for c in cut)
    return cut if limit is None or len(text) <= limit else cut + "..."


def unreadable(seq: int, event: Unknown) -> str:
    """What `tail`, `replay` and `explain` say about a message no reader can decode, or one every reader refused
    (events/authorship.py): where and why, one line."""
    if event.reason == REFUSED:
        return f"refused at position {seq}: {printable(event.error.removeprefix('refused: '), WHY_CHARS)}"
    return f"unreadable at position {seq}: {printable(event.error, WHY_CHARS)}"


def line(env: Envelope) -> str:
    ts = dt.datetime.fromtimestamp(env.stream_time).strftime("%H:%M:%S.%f")[:-3]
    ev = env.event
    entity = env.subject.split(".")[2] if env.subject.count(".") >= 3 else "-"
    if isinstance(ev, Unknown):
        what = "Refused" if ev.reason == REFUSED else "Unreadable"
        return printable(f"{ts} #{env.seq:<6} {what:<20} {entity:<16} {unreadable(env.seq, ev)}")
    return printable(f"{ts} #{env.seq:<6} {tag_of(ev):<20} {entity:<16} {essentials(ev)}".rstrip())
