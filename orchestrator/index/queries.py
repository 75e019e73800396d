"""What the index answers, read from its tables: usage, jobs, one job, a job's event positions.

Plain functions over a read connection (each query runs in a thread on its
own connection, so the follower writing the tables is never blocked, and WAL
lets it write while they read). Each answer names the position the tables
hold (`AsOf`): the reader says how fresh the answer is.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from orchestrator.core.accounting import Account
from orchestrator.core.model.state import TERMINAL
from orchestrator.index.api import JobInfo
from orchestrator.index.projection import DAY_S, day_of


class AsOf(NamedTuple):
    """Where the tables are: the last position folded, its stream time, events folded, unreadable ones."""

    seq: int
    time: float
    events: int
    unreadable: int


def as_of(conn: sqlite3.Connection) -> AsOf:
    row = conn.execute("SELECT seq, stream_time, events, unreadable FROM position").fetchone()
    return AsOf(0, 0.0, 0, 0) if row is None else AsOf(int(row[0]), float(row[1]), int(row[2]), int(row[3]))


#: The rollups' column of each `--by` (usage_days keys a closed reservation by how it ended).
_ROLLUP_KEY = {"queue": "queue", "user": "user", "state": "status"}
#: SQL for the account a reservation is charged to: the same keys as accounting.GpuTime.key. A
#: reservation still held counts under the job's status now, as GpuTime.held_until does.
_OPEN_KEY = {"queue": "r.queue", "user": "r.user", "state": "(SELECT state FROM jobs WHERE jobs.job_id = r.job_id)"}
_CLOSED_KEY = {"queue": "r.queue", "user": "r.user", "state": "r.status"}
_FINISHED_KEY = {"queue": "queue", "user": "user", "state": "state"}
_FINAL = tuple(sorted(TERMINAL))
_LOW, _HIGH = -1e300, 1e300


def usage(conn: sqlite3.Connection, by: str, since: float | None, until: float | None,
          end: float) -> dict[str, Account]:
    """GPU-seconds, reservations and finished jobs per account over [since, until], as `corral usage`
    computes them from the log (orchestrator/core/accounting.py): each reservation clipped to the window,
    one still held counted up to `end`.

    Whole days inside the window come from the day rollups; only the two edge days' reservations and
    jobs are read one by one, and the reservations still held (at most the cluster's running jobs).
    """
    out: dict[str, Account] = {}

    def charge(rows: Iterable[tuple[str, float | None, int | None]]) -> None:
        for k, seconds, n in rows:
            if not seconds and not n:  # an edge day's reservation outside the window
                continue
            acct = out.setdefault(k, Account())
            acct.gpu_seconds += float(seconds or 0.0)
            acct.reservations += int(n or 0)

    def finish(rows: Iterable[tuple[str, str, int]]) -> None:
        for k, state, n in rows:
            acct = out.setdefault(k, Account())
            acct.finished[state] = acct.finished.get(state, 0) + int(n)

    lo = _LOW if since is None else since
    hi = _HIGH if until is None else until
    if hi < lo:
        return out
    charge(conn.execute(
        f"SELECT {_OPEN_KEY[by]} AS k, SUM(r.gpus * (MIN(:end, :hi) - MAX(r.start, :lo))), COUNT(*) "
        f"FROM reservations r WHERE r.end IS NULL AND r.gpus > 0 AND r.start <= :hi "
        f"AND MIN(:end, :hi) >= MAX(r.start, :lo) GROUP BY k", {"lo": lo, "hi": hi, "end": end}))
    first = None if since is None else day_of(since)
    last = None if until is None else day_of(until)
    whole = " AND ".join(["1", *(["day > :first"] if first is not None else []),
                          *(["day < :last"] if last is not None else [])])
    days = {"first": first, "last": last}
    rkey = _ROLLUP_KEY[by]
    charge(conn.execute(f"SELECT {rkey}, SUM(gpu_us) / 1e6, SUM(started) FROM usage_days WHERE {whole} "
                        f"GROUP BY {rkey}", days))
    finish(conn.execute(f"SELECT {_FINISHED_KEY[by]}, state, SUM(jobs) FROM finished_days WHERE {whole} "
                        f"GROUP BY {_FINISHED_KEY[by]}, state", days))
    for day in sorted({d for d in (first, last) if d is not None}):
        # Clipped to the window and the day (the day's other part is another day's), counted once: in
        # the day it started if that is inside the window, else in the window's first day if it spans lo.
        edge = {"lo": lo, "hi": hi, "a": day * DAY_S, "b": (day + 1) * DAY_S, "day": day, "first": first}
        charge(conn.execute(
            f"SELECT {_CLOSED_KEY[by]} AS k, SUM(r.gpus * MAX(0.0, MIN(r.end, :hi, :b) - MAX(r.start, :lo, :a))), "
            f"SUM(CASE WHEN (r.start >= :a AND r.start < :b AND r.start >= :lo AND r.start <= :hi) "
            f"OR (:day = :first AND r.start < :lo AND r.end >= :lo) THEN 1 ELSE 0 END) "
            f"FROM reservation_days d JOIN reservations r ON r.job_id = d.job_id AND r.open_seq = d.open_seq "
            f"WHERE d.day = :day GROUP BY k", edge))
        finish(conn.execute(
            f"SELECT {_FINISHED_KEY[by]}, state, COUNT(*) FROM jobs WHERE state IN {_FINAL!r} "
            f"AND ended_at >= MAX(:lo, :a) AND ended_at < :b AND ended_at <= :hi "
            f"GROUP BY {_FINISHED_KEY[by]}, state", edge))
    return out


#: The jobs table's columns of a JobInfo, in its field order.
_JOB_FIELDS = JobInfo.__struct_fields__
_JOB_COLUMNS = ", ".join(_JOB_FIELDS)


def _job_info(r: tuple[Any, ...]) -> JobInfo:
    return JobInfo(**dict(zip(_JOB_FIELDS, r, strict=True)))


def jobs(conn: sqlite3.Connection, *, since: float | None = None, until: float | None = None,
         user: str | None = None, states: Sequence[str] = (), queue: str | None = None, after: int = 0,
         limit: int = 500) -> list[JobInfo]:
    """Jobs in submit order after position `after` (a page's cursor), submitted in [since, until], of
    `user`, in `states` (empty: any), of `queue` (named in the spec or charged); at most `limit`."""
    where = ["submit_seq > :after"]
    params: dict[str, object] = {"after": after, "limit": limit}
    if since is not None:
        where.append("submitted_at >= :since")
        params["since"] = since
    if until is not None:
        where.append("submitted_at <= :until")
        params["until"] = until
    if user is not None:
        where.append("user = :user")
        params["user"] = user
    if queue is not None:
        where.append("(queue = :queue OR spec_queue = :queue)")
        params["queue"] = queue
    if states:
        names = [f":s{i}" for i in range(len(states))]
        where.append(f"state IN ({', '.join(names)})")
        params.update({f"s{i}": s for i, s in enumerate(states)})
    sql = f"SELECT {_JOB_COLUMNS} FROM jobs WHERE {' AND '.join(where)} ORDER BY submit_seq LIMIT :limit"
    return [_job_info(r) for r in conn.execute(sql, params)]


def job(conn: sqlite3.Connection, job_id: str) -> JobInfo | None:
    r = conn.execute(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
    return None if r is None else _job_info(r)


class Position(NamedTuple):
    """A log position to fetch for a job's story, and what the fold said of it there."""

    seq: int
    type: str
    #: The job's own event (else context: a node, the cluster, a related job's submission).
    own: bool
    #: Why the fold recorded it as void (None: it took effect).
    void: str | None


def story_positions(conn: sqlite3.Connection, job_id: str) -> list[Position]:
    """The positions `explain` folds for a job, in log order (empty: the index knows no event about it).

    The job's own events, and the context its fold needs to judge them as the whole log's fold did, up to
    its last one: the events of the jobs its events name (its preemptor, its victims: they hold and
    earmark the GPUs it is judged against, and the story names them), the events about no job (settings,
    queues, elections), and those of the nodes any of these jobs ran on.
    """
    own = [Position(int(s), t, True, v) for s, t, v in conn.execute(
        "SELECT seq, type, void FROM job_events WHERE job_id = ? ORDER BY seq", (job_id,))]
    if not own:
        return []
    last = own[-1].seq
    related = [r for (r,) in conn.execute("SELECT other FROM job_links WHERE job_id = ?", (job_id,))]
    jobs = [job_id, *related]
    marks = ", ".join("?" * len(jobs))
    nodes = [f"node:{n}" for (n,) in conn.execute(
        f"SELECT DISTINCT node_id FROM job_nodes WHERE job_id IN ({marks})", jobs)]
    found = {p.seq: p for p in own}
    for i in range(0, len(related), 500):  # (SQLite allows a few hundred parameters per statement)
        part = related[i:i + 500]
        for seq, kind in conn.execute(
                f"SELECT seq, type FROM job_events WHERE seq <= ? AND job_id IN ({', '.join('?' * len(part))})",
                [last, *part]):
            found.setdefault(int(seq), Position(int(seq), kind, False, None))
    for i in range(0, len(nodes), 500):
        part = nodes[i:i + 500]
        for seq, kind in conn.execute(
                f"SELECT seq, type FROM context_events WHERE seq <= ? AND key IN ({', '.join('?' * len(part))})",
                [last, *part]):
            found.setdefault(int(seq), Position(int(seq), kind, False, None))
    for seq, kind in conn.execute("SELECT seq, type FROM context_events WHERE key = 'cluster' AND seq <= ?", (last,)):
        found.setdefault(int(seq), Position(int(seq), kind, False, None))
    return sorted(found.values(), key=lambda p: p.seq)
