"""The log folded into SQLite: one row per job, its reservations, and the positions of its events.

What `corral usage`, `jobs --all`, `job OLD` and `explain OLD` read instead of
the whole log (like slurmdbd's tables behind `sacct`). The rules are not
written here again: every event goes through `orchestrator.core.accounting.
account` (the shared `evolve` plus the charging `corral usage` does from the
log), and this module only records what it says.

Tables (`SCHEMA`):

* `jobs`: one row per job (user, queue charged, name, submit/start/end,
  state, end reason, ranks x GPUs, GPU-seconds, attempts, preemptions) and
  the job's newest fold record (msgpack `Job`), so `corral job OLD` prints
  what the fold printed while it still kept the job.
* `reservations`: each time a job held GPUs, from its GangReserved to the
  event that released it (end NULL: still held); a usage window clips them.
* `usage_days`, `reservation_days`, `finished_days`: the closed reservations'
  GPU-seconds and starts, and the finished jobs, summed per UTC day and account,
  and the days each closed reservation overlaps. `usage` sums whole days from
  the rollups and clips only the reservations of the window's two edge days, so
  its cost follows the days and accounts in the window, not the jobs in them.
* `job_events`: (job, position, type, stream time, void reason) of every
  event about a job (the preemptor's too), what `explain` fetches by position.
* `job_links`: the jobs a job's events name (its preemptor, its victims), both ways.
* `context_events`: positions of events about no job (nodes, queues,
  elections, settings) that a job's story needs folded beside its own.
* `position`: the last position folded, written in the same transaction as
  the rows (pyeventsourcing's tracking record): a restart resumes after it and
  never records an event twice. `fold_state`: a snapshot of the fold at some
  position <= it, so a restart refolds only the events since the snapshot
  (into memory, writing nothing) before it records again.

Events are committed in batches (`commit_every`): thousands per transaction.
An unreadable event (Unknown) is counted and recorded on its job's subject;
nothing an event holds can stop the fold.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import structlog

from events.bus import Envelope, LogGap
from orchestrator.core.accounting import NO_USER, Accounted, account
from orchestrator.core.model.state import TERMINAL, ClusterState, Job, restore, snapshot
from orchestrator.core.model.usage import resolve_queue
from schemas import Preempted, PreemptionRequested, Unknown, tag_of

log = structlog.get_logger("corral.index")

#: Bumped when the tables change meaning; an index of another format is rebuilt, never misread.
FORMAT = 2

#: The index file under a service's data dir.
DB_NAME = "index.sqlite"

SCHEMA = """
CREATE TABLE IF NOT EXISTS position (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    format INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    stream_time REAL NOT NULL,
    events INTEGER NOT NULL,
    unreadable INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS fold_state (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    seq INTEGER NOT NULL,
    data BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    user TEXT NOT NULL,
    queue TEXT NOT NULL,
    spec_queue TEXT NOT NULL,
    name TEXT NOT NULL,
    submit_seq INTEGER NOT NULL,
    submitted_at REAL NOT NULL,
    started_at REAL,
    ended_at REAL,
    state TEXT NOT NULL,
    end_reason TEXT NOT NULL,
    ranks INTEGER NOT NULL,
    gpus_per_rank INTEGER NOT NULL,
    gpu_seconds REAL NOT NULL,
    attempts INTEGER NOT NULL,
    preemptions INTEGER NOT NULL,
    record BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_by_submit ON jobs (submit_seq);
CREATE INDEX IF NOT EXISTS jobs_by_submitted_at ON jobs (submitted_at);
CREATE INDEX IF NOT EXISTS jobs_by_user ON jobs (user, submitted_at);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state, submitted_at);
CREATE INDEX IF NOT EXISTS jobs_by_end ON jobs (state, ended_at, queue, user);
CREATE TABLE IF NOT EXISTS reservations (
    job_id TEXT NOT NULL,
    open_seq INTEGER NOT NULL,
    queue TEXT NOT NULL,
    user TEXT NOT NULL,
    gpus INTEGER NOT NULL,
    start REAL NOT NULL,
    end REAL,
    status TEXT,
    PRIMARY KEY (job_id, open_seq)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS reservations_by_end ON reservations (end);
CREATE INDEX IF NOT EXISTS reservations_open ON reservations (job_id) WHERE end IS NULL;
CREATE TABLE IF NOT EXISTS usage_days (
    day INTEGER NOT NULL,
    queue TEXT NOT NULL,
    user TEXT NOT NULL,
    status TEXT NOT NULL,
    gpu_us INTEGER NOT NULL,
    started INTEGER NOT NULL,
    PRIMARY KEY (day, queue, user, status)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS reservation_days (
    day INTEGER NOT NULL,
    job_id TEXT NOT NULL,
    open_seq INTEGER NOT NULL,
    PRIMARY KEY (day, job_id, open_seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS finished_days (
    day INTEGER NOT NULL,
    queue TEXT NOT NULL,
    user TEXT NOT NULL,
    state TEXT NOT NULL,
    jobs INTEGER NOT NULL,
    PRIMARY KEY (day, queue, user, state)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS job_events (
    job_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    time REAL NOT NULL,
    void TEXT,
    PRIMARY KEY (job_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS job_links (
    job_id TEXT NOT NULL,
    other TEXT NOT NULL,
    PRIMARY KEY (job_id, other)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS job_nodes (
    job_id TEXT NOT NULL,
    node_id TEXT NOT NULL,
    PRIMARY KEY (job_id, node_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS context_events (
    seq INTEGER PRIMARY KEY,
    key TEXT NOT NULL,
    type TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS context_by_key ON context_events (key, seq);
"""

#: The rollups' bucket: a UTC day of the events' own times.
DAY_S = 86400.0

#: Events folded per transaction.
COMMIT_EVERY = 5000
#: Events between snapshots of the fold (a restart refolds at most this many into memory).
SNAPSHOT_EVERY = 200_000

_record = msgspec.msgpack.Encoder()
record_decoder = msgspec.msgpack.Decoder(Job)


class IndexFormatError(RuntimeError):
    """The index file was written in another format (or is no index): rebuild it (`corral index --rebuild`)."""


def connect(path: str | Path, *, readonly: bool = False) -> sqlite3.Connection:
    """A connection to the index file in WAL mode: readers never block the one writer, nor it them."""
    if readonly:
        conn = sqlite3.connect(f"file:{Path(path)}?mode=ro", uri=True, check_same_thread=False)
    else:
        conn = sqlite3.connect(str(path), check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")  # WAL: a crash loses at most the last commits, never consistency
    conn.execute("PRAGMA busy_timeout=5000")
    return conn


def job_user(job: Job) -> str:
    return job.submitted_by or NO_USER


@dataclass
class _Dirty:
    """One job's changes since the last commit."""

    record: Job
    queue: str
    gpu_seconds: float = 0.0
    preemptions: int = 0
    started_at: float | None = None
    ended_at: float | None = None


@dataclass
class _Pending:
    jobs: dict[str, _Dirty] = field(default_factory=dict)
    opened: list[tuple[str, int, str, str, int, float]] = field(default_factory=list)
    closed: list[tuple[float, str, str, str, int, str, int]] = field(default_factory=list)
    events: list[tuple[str, int, str, float, str | None]] = field(default_factory=list)
    nodes: set[tuple[str, str]] = field(default_factory=set)
    links: set[tuple[str, str]] = field(default_factory=set)
    context: list[tuple[int, str, str]] = field(default_factory=list)
    #: (day, queue, user, status) -> [GPU-microseconds in the day, reservations started in it]: integers, so
    #: the sums do not depend on where commits split them (a resumed fold writes the same tables).
    days: dict[tuple[int, str, str, str], list[int]] = field(default_factory=dict)
    res_days: list[tuple[int, str, int]] = field(default_factory=list)
    finished: dict[tuple[int, str, str, str], int] = field(default_factory=dict)
    count: int = 0

    def roll(self, job_id: str, open_seq: int, gpus: int, start: float, end: float, key: tuple[str, str, str]) -> None:
        """A closed reservation into the day rollups: its GPU-seconds split at day bounds, its start counted."""
        first, last = day_of(start), day_of(end)
        for day in range(first, last + 1):
            lo, hi = max(start, day * DAY_S), min(end, (day + 1) * DAY_S)
            acc = self.days.setdefault((day, *key), [0, 0])
            acc[0] += round(gpus * max(hi - lo, 0.0) * 1e6)
            if day == first:
                acc[1] += 1
            self.res_days.append((day, job_id, open_seq))


def day_of(t: float) -> int:
    return math.floor(t / DAY_S)


class Projection:
    """The index's writer: `apply` envelopes in log order, `commit` (also every `commit_every` events).

    `seq` is the position the tables hold; `state.seq` the fold's, which runs
    behind it only while a restart refolds from the snapshot (nothing is
    written for positions at or below `seq`).
    """

    def __init__(self, path: str | Path, *, commit_every: int = COMMIT_EVERY,
                 snapshot_every: int = SNAPSHOT_EVERY) -> None:
        self.path = Path(path)
        self.commit_every = commit_every
        self.snapshot_every = snapshot_every
        try:
            self.conn = connect(self.path)
        except sqlite3.DatabaseError as e:
            raise IndexFormatError(f"{self.path} is not a corral index ({e}): rebuild it (corral index --rebuild)") \
                from None
        try:
            self._open()
        except Exception:
            self.conn.close()
            raise

    def _open(self) -> None:
        try:
            self.conn.executescript(SCHEMA)
            row = self.conn.execute("SELECT format, seq, stream_time, events, unreadable FROM position").fetchone()
        except sqlite3.DatabaseError as e:
            raise IndexFormatError(f"{self.path} is not a corral index ({e}): rebuild it (corral index --rebuild)") \
                from None
        if row is None:
            self.conn.execute("INSERT INTO position VALUES (1, ?, 0, 0.0, 0, 0)", (FORMAT,))
            self.conn.commit()
            row = (FORMAT, 0, 0.0, 0, 0)
        if row[0] != FORMAT:
            raise IndexFormatError(f"{self.path} is index format {row[0]}, this corral reads format {FORMAT}: "
                                   "rebuild it (corral index --rebuild)")
        self.seq, self.stream_time, self.events, self.unreadable = int(row[1]), float(row[2]), int(row[3]), int(row[4])
        snap = self.conn.execute("SELECT seq, data FROM fold_state").fetchone()
        self.state = ClusterState()
        if snap is not None and 0 < snap[0] <= self.seq:
            try:
                self.state = restore(snap[1])
            except Exception as e:  # another corral's snapshot: refold from the start, writing nothing twice
                log.warning("index_snapshot_unusable", error=repr(e), seq=snap[0])
        if self.state.seq > self.seq:
            self.state = ClusterState()
        #: job id -> open_seq of the reservation it holds now (as the tables say at `seq`).
        self._open_res: dict[str, int] = dict(self.conn.execute(
            "SELECT job_id, open_seq FROM reservations WHERE end IS NULL").fetchall())
        self._snapshot_at = self.state.seq
        self._pending = _Pending()
        self._bad_logged = False
        self._closed = False

    # -- folding ---------------------------------------------------------------------------

    def apply_batch(self, batch: Iterable[Envelope], *, contiguous: bool = True) -> None:
        """Fold a batch in order; positions already folded are skipped, a gap raises LogGap (after the
        events before it are folded) when `contiguous` (the stream), a log file folds what it holds."""
        for env in batch:
            seq = env.seq
            if seq <= self.state.seq:
                continue
            if contiguous and seq != self.state.seq + 1:
                raise LogGap(self.state.seq + 1, seq)
            self.apply(env)

    def apply(self, env: Envelope) -> None:
        """Fold one event at the next position; recorded unless the tables already hold it."""
        event, seq = env.event, env.seq
        if seq <= self.seq:  # refolding after a restart: the tables have it, the fold needs it
            self.state, _ = account(self.state, event, seq)
            return
        state = self.state
        job_id = getattr(event, "job_id", None)
        job_id = job_id if isinstance(job_id, str) else None
        before = state.jobs.get(job_id) if job_id is not None else None
        holding = job_id is not None and job_id in state.active
        voids = state.voids
        self.state, done = account(state, event, seq)
        try:
            self._record(env, job_id, before, holding, voids, done)
        except Exception as e:  # the fold is right; a row this event would have changed is not
            if not self._bad_logged:
                self._bad_logged = True
                log.error("index_event_not_recorded", seq=seq, error=repr(e))
        self.seq, self.stream_time = seq, env.stream_time
        self.events += 1
        self._pending.count += 1
        if self._pending.count >= self.commit_every:
            self.commit()

    def _record(self, env: Envelope, job_id: str | None, before: Job | None, holding: bool, voids: int,
                done: Accounted | None) -> None:
        state, event, seq, p = self.state, env.event, env.seq, self._pending
        if isinstance(event, Unknown):
            self.unreadable += 1
            parts = env.subject.split(".")
            if len(parts) >= 4 and parts[1] == "job":
                p.events.append((parts[2], seq, "Unknown", env.stream_time, None))
            return
        void = state.last_void.partition(": ")[2] if state.voids > voids else None
        kind = tag_of(event)
        if job_id is None:
            node = getattr(event, "node_id", None)
            p.context.append((seq, f"node:{node}" if isinstance(node, str) else "cluster", kind))
            return
        p.events.append((job_id, seq, kind, env.stream_time, void))
        if isinstance(event, PreemptionRequested | Preempted) and event.preemptor_job_id and \
                event.preemptor_job_id != job_id:
            p.events.append((event.preemptor_job_id, seq, kind, env.stream_time, void))
            p.links.update(((job_id, event.preemptor_job_id), (event.preemptor_job_id, job_id)))
        after = state.jobs.get(job_id)
        if after is None:  # about a job the fold does not hold (never submitted, or long forgotten)
            return
        d = p.jobs.get(job_id)
        queue = self._queue(done.finished if done is not None and done.finished is not None else after)
        if d is None:
            d = p.jobs[job_id] = _Dirty(after, queue)
        else:
            d.record, d.queue = after, queue
        if done is not None and done.released is not None:
            r = done.released
            open_seq = self._open_res.pop(job_id, None)
            if open_seq is None:  # (never seen opening: count it from here, as the log scan does)
                open_seq = -seq
                p.opened.append((job_id, open_seq, self._queue(r), job_user(r), r.gpus, r.reserved_at))
            p.closed.append((done.at, done.status, self._queue(r), job_user(r), r.gpus, job_id, open_seq))
            if r.gpus > 0 and done.at >= r.reserved_at:
                d.gpu_seconds += r.gpus * (done.at - r.reserved_at)
                p.roll(job_id, open_seq, r.gpus, r.reserved_at, done.at, (self._queue(r), job_user(r), done.status))
        if job_id in state.active and (not holding or before is None or after.reserved_at != before.reserved_at):
            self._open_res[job_id] = seq
            p.opened.append((job_id, seq, self._queue(after), job_user(after), after.gpus, after.reserved_at))
            p.nodes.update((job_id, rp.node_id) for rp in after.placement)
            if d.started_at is None:
                d.started_at = after.reserved_at
        if isinstance(event, Preempted) and void is None:
            d.preemptions += 1
        if done is not None and done.finished is not None:
            d.ended_at = done.at
            if after.status in TERMINAL:
                key = (day_of(done.at), queue, job_user(after), after.status)
                p.finished[key] = p.finished.get(key, 0) + 1

    def _queue(self, job: Job) -> str:
        return job.queue or resolve_queue(self.state, job.spec.queue)

    # -- writing ---------------------------------------------------------------------------

    def commit(self) -> None:
        """Write what was folded since the last commit, with its position, in one transaction."""
        p = self._pending
        snap = self.state.seq - self._snapshot_at >= self.snapshot_every and self.state.seq == self.seq
        if p.count == 0 and not snap:
            return
        c = self.conn
        with c:  # one transaction: the rows and the position they are at, or neither
            c.executemany(
                "INSERT INTO jobs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (job_id) DO UPDATE SET user = excluded.user, queue = excluded.queue, "
                "spec_queue = excluded.spec_queue, name = excluded.name, submit_seq = excluded.submit_seq, "
                "submitted_at = excluded.submitted_at, started_at = COALESCE(jobs.started_at, excluded.started_at), "
                "ended_at = COALESCE(excluded.ended_at, jobs.ended_at), state = excluded.state, "
                "end_reason = excluded.end_reason, ranks = excluded.ranks, gpus_per_rank = excluded.gpus_per_rank, "
                "gpu_seconds = jobs.gpu_seconds + excluded.gpu_seconds, attempts = excluded.attempts, "
                "preemptions = jobs.preemptions + excluded.preemptions, record = excluded.record",
                [(j.job_id, job_user(j), d.queue, j.spec.queue, j.spec.name, j.submit_seq, j.submitted_at,
                  d.started_at, d.ended_at, j.status, j.end_reason, j.spec.ranks, j.spec.gpus_per_rank,
                  d.gpu_seconds, j.attempt, d.preemptions, _record.encode(j))
                 for d in p.jobs.values() for j in (d.record,)])
            c.executemany("INSERT OR IGNORE INTO reservations VALUES (?, ?, ?, ?, ?, ?, NULL, NULL)", p.opened)
            c.executemany("UPDATE reservations SET end = ?, status = ?, queue = ?, user = ?, gpus = ? "
                          "WHERE job_id = ? AND open_seq = ?", p.closed)
            c.executemany("INSERT OR IGNORE INTO job_events VALUES (?, ?, ?, ?, ?)", p.events)
            c.executemany("INSERT OR IGNORE INTO job_nodes VALUES (?, ?)", sorted(p.nodes))
            c.executemany("INSERT OR IGNORE INTO job_links VALUES (?, ?)", sorted(p.links))
            c.executemany("INSERT OR IGNORE INTO context_events VALUES (?, ?, ?)", p.context)
            c.executemany("INSERT INTO usage_days VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO UPDATE SET "
                          "gpu_us = gpu_us + excluded.gpu_us, started = started + excluded.started",
                          [(*k, *v) for k, v in p.days.items()])
            c.executemany("INSERT OR IGNORE INTO reservation_days VALUES (?, ?, ?)", p.res_days)
            c.executemany("INSERT INTO finished_days VALUES (?, ?, ?, ?, ?) ON CONFLICT DO UPDATE SET "
                          "jobs = jobs + excluded.jobs", [(*k, n) for k, n in p.finished.items()])
            c.execute("UPDATE position SET seq = ?, stream_time = ?, events = ?, unreadable = ?",
                      (self.seq, self.stream_time, self.events, self.unreadable))
            if snap:
                c.execute("INSERT OR REPLACE INTO fold_state VALUES (1, ?, ?)", (self.state.seq, snapshot(self.state)))
        if snap:
            self._snapshot_at = self.state.seq
        self._pending = _Pending()

    def close(self, *, snapshot_fold: bool = True) -> None:
        """Commit, keep a snapshot of the fold for a quick restart, and close. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if snapshot_fold and self.state.seq == self.seq and self.state.seq > self._snapshot_at:
                self.snapshot_every = 0
            self.commit()
        finally:
            self.conn.close()
