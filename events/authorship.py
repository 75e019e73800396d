"""Who may author which event, and the check every reader makes as it decodes one (issue #39).

An event counts only where its subject, its type and its entity agree: a
GpuUnhealthy about node n2 counts on `corral.node.n2.GpuUnhealthy` and nowhere
else; an agent's report about job j on node n1 only on
`corral.job.j.WorkerStarted.n1` (or, in a log written before #40, on
`corral.job.j.WorkerStarted`). The subject is what NATS authorization checks
(deploy/nats/permissions.py renders AUTHORS into each user's publish rights),
the payload is what the fold acts on; where the two disagree, whoever
published it wrote a fact that was not theirs to write: a client's
GpuUnhealthy on its own `corral.job.<id>.JobSubmitted`, an agent's fault
report about another node on its own node's subject. So with auth on:

- every subject a role may publish on names one type (the type token) and one
  entity (a job, a queue, its own node for an agent), and
- the fold counts only events whose subject is the one `subject_for` gives them,

and together a client contributes only its requests (AUTHORS["client"]), an
agent only its own node's facts and reports, and only the scheduler its
decisions. Without auth anyone can publish on any subject: the check still
refuses a payload on another entity's or another type's subject, but not a
forgery on the right one (README, "Who may write to the log").

A refused event reaches the fold as an `Unknown` with reason REFUSED, so it
folds as no change everywhere (the scheduler, the agents, the CLI, the index,
replay); the fold counts it (`ClusterState.refused_events`) and the services
export corral_refused_events_total. Every reader decodes through `read_event`
(or `judged` for one it decoded itself), nothing else: the bus's reads,
history (archive + stream), log files, the index's stories.

A submission nobody can read (bad JSON, bad fields, the wrong type or entity
on `corral.job.<id>.JobSubmitted`) keeps the job id of that subject in
`Unknown.submitted_as`: the scheduler rejects that job with the reason
(JobRejected), so a malformed submit is answered, never silently dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import msgspec

from events.subjects import NODE_REPORT_TAGS, ROOT, subject_for, valid_id
from schemas import AnyEvent, Unknown, decode, encode, entity_of, tag_of
from schemas.events import REFUSED

#: Which role authors which event type (DESIGN.md, "Lifecycle protocol"), rendered into the NATS
#: permissions (deploy/nats/permissions.py). The scheduler may publish any type (a new decision needs no
#: config change); the others only theirs, each on its own entity's subject. tests/test_authorship.py
#: checks that every type has an author and that the rendered permissions and `judged` agree.
AUTHORS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "client": ("JobSubmitted", "CancelRequested", "JobHeld", "JobReleased", "JobUpdateRequested", "RequeueRequested"),
    # (admins also append GpuUnhealthy / GpuHealthy for any node: `corral gpu drain|undrain`, and every client type)
    "admin": ("QueueDefined", "QueueDeleted", "NodeCordoned", "NodeUncordoned", "JobUpdateByOperator",
              "ReservationCreated", "ReservationDeleted", "DatasetEvictRequested"),
    "agent": ("NodeRegistered", "NodeRecovered", "WorkerStarted", "WorkerExited", "Checkpointed", "GpuUnhealthy",
              "GpuHealthy", "NodeHealthChecked", "DatasetStaging", "DatasetReady", "DatasetFailed", "DatasetEvicted",
              "NodeDatasets"),
    "scheduler": (
        "GangReserved", "PreemptionRequested", "Preempted", "JobRunning", "JobCompleted", "JobFailed",
        "JobCancelled", "JobRejected", "JobWaiting", "JobRequeued", "GangRestarted", "NodeFailed",
        "SchedulerElected", "ClusterConfigured", "WorkAssigned", "WorkChanged", "JobUpdated",
    ),
})  # fmt: skip

_SUBMITTED = ".JobSubmitted"


def read_event(subject: str, data: bytes | bytearray | memoryview) -> AnyEvent | Unknown:
    """The event a reader folds for the message `data` stored on `subject`: decoded, then `judged`."""
    return judged(subject, decode(data), data)


def judged(subject: str, event: AnyEvent | Unknown,
           raw: bytes | bytearray | memoryview | None = None) -> AnyEvent | Unknown:
    """`event` if it may count on `subject`, else an Unknown (REFUSED) saying why; never raises.

    `raw`: the bytes as stored (kept in the Unknown, like an unreadable message's); None: `event` re-encoded.
    """
    if isinstance(event, Unknown):
        job = submission_of(subject) if subject.endswith(_SUBMITTED) else ""
        return msgspec.structs.replace(event, submitted_as=job) if job else event
    why = disagreement(subject, event)
    if why is None:
        return event
    return Unknown(raw=encode(event) if raw is None else bytes(raw), error=why, type=tag_of(event), reason=REFUSED,
                   submitted_as=submission_of(subject) if subject.endswith(_SUBMITTED) else "")


def disagreement(subject: str, event: AnyEvent) -> str | None:
    """Why `event` does not count on `subject` (its type or its entity is another's); None if it agrees."""
    tag = tag_of(event)
    kind, ident = entity_of(event)
    t = subject.split(".")
    n = len(t)
    if kind == "sched":
        if n == 3 and t[0] == ROOT and t[1] == "sched" and t[2] == tag:
            return None
    elif 4 <= n <= 5 and t[3] == tag and t[2] == ident and t[1] == kind and t[0] == ROOT and valid_id(ident):
        if n == 4:
            return None  # (a node report in the form a log written before #40 holds is one too)
        if tag in NODE_REPORT_TAGS and t[4] == getattr(event, "node_id", ""):
            return None
    try:
        where = f"it belongs on {subject_for(event)}"
    except ValueError as e:
        where = f"no subject can carry it ({e})"
    what = f"{kind} {ident!r}" if kind != "sched" else "the scheduler"
    return (f"refused: a {tag} about {what} on {subject} ({where}); only its author's subject may carry an event: "
            "see README, 'Who may write to the log'")


def submission_of(subject: str) -> str:
    """The job id of a submission subject (corral.job.<id>.JobSubmitted); '' for any other subject."""
    t = subject.split(".")
    if len(t) == 4 and t[0] == ROOT and t[1] == "job" and t[3] == "JobSubmitted" and valid_id(t[2]):
        return t[2]
    return ""

