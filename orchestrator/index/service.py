"""`corral index`: follow the log into the SQLite index and answer queries from it over NATS.

One loop folds: catch up from the stored position (any source with Bus's
`replay`, such as an archive-then-stream history), then tail the stream live.
It never skips: a gap it cannot read past stops it (LogGap, exit non-zero),
as every reader of the log does (events/follow.py). It folds from seq 1, so
every answer covers the whole log up to `as_of_seq`: on a stream whose head
retention removed, without the archive, it stops naming the range rather
than answer from what is left (#30). What is folded is
committed in batches, and at least every COMMIT_S while events trickle in.

Requests (orchestrator/index/api.py) are answered once the fold has caught
up: only then does the service join the requests' queue group, so an index
still catching up (a second replica, a rebuild) takes no share of them; and a
request whose `at_least` it has not folded within AT_LEAST_WAIT_S gets
`not_ready` (api.py), never an answer from part of the log. Each query runs
in a worker thread on its own read-only connection (WAL), so a slow query
never holds up the fold, and the fold never blocks a query. `explain`'s
events are read back by their stored positions: from the archive where it
holds them (`corral --archive PATH index`: positions retention dropped from
the stream), else from the stream (a direct get), so a laptop far from the
cluster needs nothing but NATS.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import sqlite3
import time
from collections.abc import AsyncGenerator, Callable, Iterable
from contextlib import aclosing
from pathlib import Path
from typing import Any, Protocol

import msgspec
import nats.errors
import nats.js.errors
import structlog
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

from events.archive import Manifest, Record, SegmentRefused
from events.bus import Bus, Envelope, LogGap
from events.follow import Rereads
from events.history import History as ArchiveHistory
from events.subjects import valid_id
from events.swallowed_cancel import stop_if_cancelled
from events.telemetry import ServiceRegistry, gauge
from orchestrator.core.model.state import JobStatus
from orchestrator.index import api, queries
from orchestrator.index.projection import DB_NAME, Projection, connect

log = structlog.get_logger("corral.index")

#: Seconds between commits while following live (a query sees an event at most this late).
COMMIT_S = 0.2
#: Direct gets in flight while fetching a story's events.
FETCH_CONCURRENCY = 32

_STATUSES: frozenset[str] = frozenset(JobStatus.__args__)  # type: ignore[attr-defined]


class History(Protocol):
    """What the index catches up from: the stream (a Bus), or an archive followed by the stream."""

    def replay(self, from_seq: int = 1) -> AsyncGenerator[list[Envelope], None]: ...

    async def last_seq(self) -> int: ...

    async def missing(self, seq: int) -> str | None: ...


class BadRequest(ValueError):
    """A request the index cannot answer as asked: `error` says which kind."""

    def __init__(self, message: str, error: str = "bad_request") -> None:
        super().__init__(message)
        self.error = error


def index_path(data_dir: str | Path) -> Path:
    return Path(data_dir) / DB_NAME


def remove_index(path: Path) -> None:
    """Delete the index file and its WAL: `--rebuild` folds from position 1 again."""
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            Path(f"{path}{suffix}").unlink()


class IndexService:
    """Folds the log into the index and answers queries. Create, then `await run()` until cancelled."""

    def __init__(self, bus: Bus, data_dir: str | Path, *, history: History | None = None, rebuild: bool = False,
                 queue_group: str = api.QUEUE_GROUP) -> None:
        self.bus = bus
        self.history: History = history if history is not None else bus
        self.path = index_path(data_dir)
        self.rebuild = rebuild
        self.queue_group = queue_group
        self.projection: Projection | None = None
        #: Set once the requests are subscribed (answers may still be behind the log).
        self.serving = asyncio.Event()
        #: Set once the fold reached the log's last position as of its start.
        self.caught_up = asyncio.Event()
        #: The log's last position as of the start (taken once): /readyz is 503 until the index folded it.
        self.target: int | None = None
        self.answered = 0
        self.refused = 0

    @property
    def seq(self) -> int:
        return self.projection.seq if self.projection is not None else 0

    async def run(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.rebuild:
            remove_index(self.path)
            log.info("index_rebuild", path=str(self.path))
        self.projection = await asyncio.to_thread(Projection, self.path)
        subs: list[Subscription] = []
        try:
            await self._fold(subs)
        finally:
            nc = self.bus.nc
            for sub in subs:
                if not nc.is_closed:
                    with contextlib.suppress(Exception):
                        await sub.unsubscribe()
            projection, self.projection = self.projection, None
            if projection is not None:
                projection.close()

    # -- folding ---------------------------------------------------------------------------

    async def _fold(self, subs: list[Subscription]) -> None:
        p = self.projection
        assert p is not None
        t0, start = time.perf_counter(), p.seq
        self.target = await self.history.last_seq()
        await self._read(lambda at: self.history.replay(from_seq=at), p.apply_batch)
        p.commit()
        log.info("index_caught_up", seq=p.seq, events=p.seq - start, seconds=round(time.perf_counter() - t0, 2))
        self.caught_up.set()
        await self._serve(subs)
        committer = asyncio.create_task(self._commit_often())
        try:
            # Live from the stream; with an archive, a position purged before it was read comes from there.
            source = self.history if isinstance(self.history, ArchiveHistory) else self.bus
            await self._read(lambda at: source.tail(from_seq=at), lambda env: p.apply_batch([env]))
        finally:
            committer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await committer

    async def _serve(self, subs: list[Subscription]) -> None:
        """Join the queue group of the requests: only now, caught up, so no asker gets an answer from part of
        the log (a second index still catching up takes no share of them)."""
        nc = self.bus.nc
        for subject in api.SUBJECTS:
            subs.append(await nc.subscribe(subject, queue=self.queue_group, cb=self._on_request))
        # Shielded: a flush cancelled mid-way (a stop right after catching up) leaves its PING's future
        # cancelled in nats-py's list, and the PONG's set_result on it kills the connection's read loop.
        await asyncio.shield(nc.flush())
        stop_if_cancelled()  # a SIGTERM the flush's wait swallowed
        self.serving.set()
        log.info("index_serving", path=str(self.path), seq=self.seq)

    async def _read(self, read: Callable[[int], AsyncGenerator[Any, None]], fold: Callable[[Any], None]) -> None:
        """`fold` each item of `read(next position)`; after a gap, read again from the new next position."""
        p = self.projection
        assert p is not None
        h = self.history
        rereads = Rereads(h if isinstance(h, Bus | ArchiveHistory) else self.bus)  # a gap is judged by the archive too
        while True:
            stop_if_cancelled()
            try:
                async with aclosing(read(p.state.seq + 1)) as items:
                    async for item in items:
                        fold(item)
                        await asyncio.sleep(0)  # a catch-up batch at a time: requests get their turn
                return
            except LogGap as gap:
                p.commit()
                await rereads.check(gap)

    async def _commit_often(self) -> None:
        while True:
            await asyncio.sleep(COMMIT_S)
            if self.projection is not None:
                self.projection.commit()

    # -- answering -------------------------------------------------------------------------

    async def _on_request(self, msg: Msg) -> None:
        reply = await self.answer(msg.subject, msg.data)
        if msg.reply:
            with contextlib.suppress(nats.errors.Error):
                await msg.respond(api.encode(reply))

    async def answer(self, subject: str, data: bytes) -> api.Reply:
        """The reply to one request: an answer, or `ok: false` naming what was wrong. Never raises."""
        kind = api.REQUESTS.get(subject)
        try:
            if kind is None:
                raise BadRequest(f"unknown request subject {subject!r}; known: {', '.join(api.SUBJECTS)}")
            try:
                request = msgspec.json.decode(data or b"{}", type=kind)
            except (msgspec.DecodeError, msgspec.ValidationError) as e:
                raise BadRequest(f"bad {subject} request: {e}") from None
            reply = await self._answer(request)
        except BadRequest as e:
            self.refused += 1
            reply_type = api.REPLIES.get(subject, api.Reply)
            reply = reply_type(ok=False, error=e.error, message=str(e))
        except Exception as e:  # a bug or a broken file: this request fails, the service goes on
            self.refused += 1
            log.exception("index_request_failed", subject=subject)
            reply = api.REPLIES.get(subject, api.Reply)(ok=False, error="internal", message=f"index error: {e!r}")
        else:
            self.answered += 1
        return reply

    async def _reach(self, seq: int) -> None:
        """Until the tables hold position `seq` (committed), or AT_LEAST_WAIT_S passed."""
        p = self.projection
        if p is None or seq <= 0:
            return
        deadline = time.monotonic() + api.AT_LEAST_WAIT_S
        while p.seq < seq and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        p.commit()  # (cheap when nothing is pending) what the query reads must include what it waited for

    async def _answer(self, request: Any) -> api.Reply:
        await self._reach(request.at_least)
        if not self.caught_up.is_set() or self.seq < request.at_least:
            # Readiness is part of the answer: never one from part of the log the asker knows of.
            raise BadRequest(f"the index is at #{self.seq}, the asker's log at #{request.at_least}: not caught up "
                             f"after {api.AT_LEAST_WAIT_S:g}s; ask again (another index may answer) or read the log",
                             api.NOT_READY)
        match request:
            case api.UsageRequest():
                return await self._query(lambda c: _usage(c, request))
            case api.JobsRequest():
                _check_jobs(request)
                return await self._query(lambda c: _jobs(c, request))
            case api.JobRequest():
                _check_id(request.job_id)
                return await self._query(lambda c: _job(c, request.job_id))
            case api.EventsRequest():
                _check_id(request.job_id)
                _check_limit(request.limit)
                return await self._events(request)
        raise BadRequest(f"unknown request {type(request).__name__}")

    async def _query(self, run: Callable[[sqlite3.Connection], api.Reply]) -> api.Reply:
        def in_thread() -> api.Reply:
            conn = connect(self.path, readonly=True)
            try:
                with conn:  # one read transaction: the answer and its position agree
                    conn.execute("BEGIN")
                    at = queries.as_of(conn)
                    reply = run(conn)
                reply.as_of_seq, reply.as_of_time = at.seq, at.time
                return reply
            finally:
                conn.close()

        return await asyncio.to_thread(in_thread)

    async def _events(self, request: api.EventsRequest) -> api.Reply:
        def positions(conn: sqlite3.Connection) -> api.Reply:
            found = queries.story_positions(conn, request.job_id)
            if not found:
                raise BadRequest(f"the index has no event about job {request.job_id!r}", "not_found")
            page = [p for p in found if p.seq > request.after]
            more = len(page) > request.limit
            reply = api.EventsReply(events=[api.StoredEvent(seq=p.seq, subject="", time=0.0, data=b"", own=p.own,
                                                            void=p.void) for p in page[:request.limit]])
            reply.next_after = reply.events[-1].seq if more and reply.events else None
            return reply

        reply = await self._query(positions)
        assert isinstance(reply, api.EventsReply)
        sem = asyncio.Semaphore(FETCH_CONCURRENCY)

        async def fetch(ev: api.StoredEvent) -> None:
            async with sem:
                msg = await self._get(ev.seq)
            ev.subject = msg.subject or ""
            ev.data = msg.data or b""
            ev.time = stamp_seconds((msg.headers or {}).get("Nats-Time-Stamp", ""))

        archived = await self._archived([ev.seq for ev in reply.events])
        for ev in reply.events:
            if (r := archived.get(ev.seq)) is not None:
                ev.subject, ev.data, ev.time = r.subject, r.data, r.time_ns / 1e9  # as a replay of it gives
        await asyncio.gather(*(fetch(ev) for ev in reply.events if ev.seq not in archived))
        size, keep = 0, list[api.StoredEvent]()
        for ev in reply.events:  # bounded: a page of huge events ends early, the cursor says where
            size += len(ev.data) * 4 // 3 + len(ev.subject) + 200
            if keep and size > api.MAX_REPLY_BYTES:
                reply.next_after = keep[-1].seq
                break
            keep.append(ev)
        reply.events = keep
        return reply

    async def _archived(self, seqs: list[int]) -> dict[int, Record]:
        """The records of `seqs` the archive holds (none without one), each segment read once.

        The archive first, as History reads: the stream drops only what the archive held, so a
        position the archive lacks now is still in the stream when it is fetched.
        """
        history = self.history
        if not isinstance(history, ArchiveHistory) or not seqs:
            return {}
        archive = history.archive

        def read() -> dict[int, Record]:
            wanted = set(seqs)
            lo, hi = min(wanted), max(wanted)
            out: dict[int, Record] = {}
            segs: list[Manifest] = [m for m in archive.segments() if m.last_seq >= lo and m.first_seq <= hi]
            for m in segs:
                if any(m.first_seq <= s <= m.last_seq for s in wanted):
                    out.update((r.seq, r) for r in archive.read(m) if r.seq in wanted)
            return out

        try:
            return await asyncio.to_thread(read)
        except SegmentRefused as e:
            raise BadRequest(f"events of the story cannot be read from the archive: {e}", "unavailable") from None

    async def _get(self, seq: int) -> Any:
        try:
            return await self.bus.message_at(seq)
        except nats.js.errors.NotFoundError:
            why = await self.history.missing(seq) or f"seq {seq} is not in the stream"
            raise BadRequest(f"event #{seq} of the story cannot be read: {why}", "unavailable") from None


def stamp_seconds(stamp: str) -> float:
    """A direct get's `Nats-Time-Stamp` (RFC 3339, nanoseconds) as a replay gives it: ns / 1e9, to the bit.

    Parsing it as a datetime keeps microseconds only, and the story's times would differ from a
    replay's in the last digits. 0.0 if missing or unreadable.
    """
    base, _, frac = stamp.rstrip("Z").partition(".")
    try:
        whole = int(dt.datetime.fromisoformat(base).replace(tzinfo=dt.UTC).timestamp())
        ns = int((frac + "000000000")[:9]) if frac else 0
    except ValueError:
        return 0.0
    return (whole * 1_000_000_000 + ns) / 1e9


# -- checks and queries (run in a worker thread) -------------------------------------------


def _check_id(job_id: str) -> None:
    if not valid_id(job_id):
        raise BadRequest(f"job id {job_id[:200]!r} is not a valid corral id")


def _check_limit(limit: int) -> None:
    if not 1 <= limit <= api.MAX_LIMIT:
        raise BadRequest(f"limit {limit} is not in 1..{api.MAX_LIMIT}")


def _check_jobs(request: api.JobsRequest) -> None:
    _check_limit(request.limit)
    bad = [s for s in request.states if s not in _STATUSES]
    if bad:
        raise BadRequest(f"unknown job state(s) {', '.join(map(repr, bad[:5]))}; known: {', '.join(sorted(_STATUSES))}")
    if request.user is not None and len(request.user) > 256:
        raise BadRequest("user is longer than 256 characters")
    if request.queue is not None and not valid_id(request.queue):
        raise BadRequest(f"queue {request.queue[:200]!r} is not a valid corral id")


def _usage(conn: sqlite3.Connection, request: api.UsageRequest) -> api.Reply:
    since, until = request.since, request.until
    if since is not None and until is not None and until < since:
        raise BadRequest(f"until {until} is before since {since}")
    end = request.end if request.end is not None else time.time()
    if until is not None:
        end = min(end, until)
    accounts = queries.usage(conn, request.by, since, until, end)
    rows = [api.UsageRow(key=k, gpu_seconds=a.gpu_seconds, reservations=a.reservations,
                         finished=dict(sorted(a.finished.items())))
            for k, a in sorted(accounts.items(), key=lambda kv: (-kv[1].gpu_seconds, kv[0]))]
    return api.UsageReply(rows=rows, events=queries.as_of(conn).events)


def _jobs(conn: sqlite3.Connection, request: api.JobsRequest) -> api.Reply:
    rows = queries.jobs(conn, since=request.since, until=request.until, user=request.user, states=request.states,
                        queue=request.queue, after=request.after, limit=request.limit + 1)
    more = len(rows) > request.limit
    out: list[api.JobInfo] = []
    size = 0
    for row in rows[:request.limit]:
        size += len(row.record) * 4 // 3 + 400
        if out and size > api.MAX_REPLY_BYTES:
            more = True
            break
        out.append(row)
    return api.JobsReply(jobs=out, next_after=out[-1].submit_seq if more and out else None)


def _job(conn: sqlite3.Connection, job_id: str) -> api.Reply:
    row = queries.job(conn, job_id)
    if row is None:
        raise BadRequest(f"the index has no job {job_id!r}", "not_found")
    return api.JobReply(job=row)



# -- metrics -----------------------------------------------------------------------------


class _IndexCollector:
    """`corral_index_*`: how far the index has folded and what it answered (read between two folds)."""

    def __init__(self, service: IndexService) -> None:
        self.service = service

    def collect(self) -> Iterable[Metric]:
        s = self.service
        p = s.projection
        position = gauge("corral_index_position", "Last log position folded into the index")
        position.add_metric([], p.seq if p is not None else 0)
        folded = gauge("corral_index_events_folded", "Events the index has folded since it was built")
        folded.add_metric([], p.events if p is not None else 0)
        unreadable = gauge("corral_index_unreadable_events", "Unreadable messages the index folded as no change")
        unreadable.add_metric([], p.unreadable if p is not None else 0)
        caught_up = gauge("corral_index_caught_up", "1 once the index reached the log's end as of its start")
        caught_up.add_metric([], 1.0 if s.caught_up.is_set() else 0.0)
        answers = gauge("corral_index_requests", "Requests answered and refused since start", ["result"])
        answers.add_metric(["answered"], s.answered)
        answers.add_metric(["refused"], s.refused)
        return [position, folded, unreadable, caught_up, answers]


def watch_index(registry: CollectorRegistry, service: IndexService) -> None:
    registry.register(_IndexCollector(service))
    if isinstance(registry, ServiceRegistry):  # /readyz: 503 until it folded the log as of its start
        registry.require_position("index", lambda: service.seq, lambda: service.target)
