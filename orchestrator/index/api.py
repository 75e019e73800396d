"""The index's request/reply protocol: subjects and msgspec JSON messages, shared by the service and the CLI.

The subjects are outside `corral.>` (the stream captures that), so a request
is never stored as an event:

    corral-index.usage    UsageRequest  -> UsageReply
    corral-index.jobs     JobsRequest   -> JobsReply     (a page; `next_after` asks for the next)
    corral-index.job      JobRequest    -> JobReply
    corral-index.events   EventsRequest -> EventsReply   (a page of a job's story, as stored in the stream)

Every reply says how far the index has folded (`as_of_seq`, `as_of_time`)
and is bounded (a page of at most `limit` items and MAX_REPLY_BYTES). A bad
request gets `ok: false` with `error` (bad_request, not_found, unavailable,
internal, not_ready) and a message; the service never dies of one.

Readiness is part of the protocol: an index answers only once it has caught
up with the log (it joins QUEUE_GROUP then), and a request whose `at_least`
it has not folded within AT_LEAST_WAIT_S gets `error: not_ready` (NOT_READY).
An asker then asks again -- the queue group may hand the request to another
replica -- a few times (orchestrator/cli/indexed.py), then reads the log
itself or exits non-zero naming what is missing; never an answer from part
of the log.
"""

from __future__ import annotations

from typing import Literal

import msgspec

PREFIX = "corral-index"
USAGE = f"{PREFIX}.usage"
JOBS = f"{PREFIX}.jobs"
JOB = f"{PREFIX}.job"
EVENTS = f"{PREFIX}.events"
SUBJECTS = (USAGE, JOBS, JOB, EVENTS)
#: Replicas of the service share the requests (each joins once caught up).
QUEUE_GROUP = "corral-index"
#: The `error` of a reply from an index that has not folded what the request needs (`at_least`).
NOT_READY = "not_ready"

#: Most items a page holds, and the default.
MAX_LIMIT = 1000
DEFAULT_LIMIT = 500
#: A reply stops adding items past this many bytes (NATS's default max_payload is 1 MiB).
MAX_REPLY_BYTES = 512 * 1024

#: Seconds the service waits for `at_least` before it answers as of where it is.
AT_LEAST_WAIT_S = 2.0

GroupBy = Literal["queue", "user", "state"]


class _Request(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    #: Read your writes: answer once the index has folded this position (the asker's view of the log's
    #: end), or after AT_LEAST_WAIT_S with what it has; the reply's `as_of_seq` says which.
    at_least: int = 0


class UsageRequest(_Request):
    by: GroupBy = "queue"
    since: float | None = None
    until: float | None = None
    #: Where a reservation still held is charged up to (the asker's "now"); default the service's clock.
    end: float | None = None


class JobsRequest(_Request):
    since: float | None = None
    until: float | None = None
    user: str | None = None
    states: list[str] = []
    queue: str | None = None
    #: The page's cursor: jobs submitted after this log position.
    after: int = 0
    limit: int = DEFAULT_LIMIT


class JobRequest(_Request):
    job_id: str


class EventsRequest(_Request):
    job_id: str
    #: The page's cursor: positions after this one.
    after: int = 0
    limit: int = DEFAULT_LIMIT


class Reply(msgspec.Struct, kw_only=True):
    ok: bool = True
    error: str = ""
    message: str = ""
    as_of_seq: int = 0
    as_of_time: float = 0.0


class UsageRow(msgspec.Struct, kw_only=True):
    key: str
    gpu_seconds: float
    reservations: int
    finished: dict[str, int]


class UsageReply(Reply, kw_only=True):
    rows: list[UsageRow] = []
    #: Events the index has folded.
    events: int = 0


class JobInfo(msgspec.Struct, kw_only=True):
    """A job's row: what `corral usage`-like listings need, and its fold record for `jobs`/`job`."""

    job_id: str
    user: str
    queue: str
    name: str
    submit_seq: int
    submitted_at: float
    started_at: float | None
    ended_at: float | None
    state: str
    end_reason: str
    ranks: int
    gpus_per_rank: int
    gpu_seconds: float
    attempts: int
    preemptions: int
    #: The job's newest record in the fold (orchestrator.core.model.state.Job, msgpack).
    record: bytes


class JobsReply(Reply, kw_only=True):
    jobs: list[JobInfo] = []
    #: Ask again with `after` = this for the next page; None: this was the last.
    next_after: int | None = None


class JobReply(Reply, kw_only=True):
    job: JobInfo | None = None


class StoredEvent(msgspec.Struct, kw_only=True):
    """One event of a story as the stream stores it (the reader decodes `data` like any event)."""

    seq: int
    subject: str
    time: float
    data: bytes
    #: The job's own event, or context its fold needs (a node, the cluster, a related job's submission).
    own: bool
    #: Why the index's fold recorded it void (None: it took effect).
    void: str | None = None


class EventsReply(Reply, kw_only=True):
    events: list[StoredEvent] = []
    next_after: int | None = None


encode = msgspec.json.Encoder().encode
REQUESTS: dict[str, type[_Request]] = {USAGE: UsageRequest, JOBS: JobsRequest, JOB: JobRequest, EVENTS: EventsRequest}
REPLIES: dict[str, type[Reply]] = {USAGE: UsageReply, JOBS: JobsReply, JOB: JobReply, EVENTS: EventsReply}
