"""What the index answers, read from its tables: usage, jobs, one job, a job's event positions.

Plain functions over a read connection (each query runs in a thread on its
own connection, so the follower writing the tables is never blocked, and WAL
lets it write while they read). Each answer names the position the tables
hold (`AsOf`): the reader says how fresh the answer is.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import NamedTuple

from orchestrator.core.accounting import Account


class AsOf(NamedTuple):
    """Where the tables are: the last position folded, its stream time, events folded, unreadable ones."""

    seq: int
    time: float
    events: int
    unreadable: int


def as_of(conn: sqlite3.Connection) -> AsOf:
    row = conn.execute("SELECT seq, stream_time, events, unreadable FROM position").fetchone()
    return AsOf(0, 0.0, 0, 0) if row is None else AsOf(int(row[0]), float(row[1]), int(row[2]), int(row[3]))


#: SQL for the account a reservation is charged to, by `--by`: the same keys as accounting.GpuTime.key.
_RESERVATION_KEY = {
    "queue": "r.queue",
    "user": "r.user",
    # An open reservation (status NULL) counts under the job's status now, as GpuTime.held_until does.
    "state": "COALESCE(r.status, (SELECT state FROM jobs WHERE jobs.job_id = r.job_id))",
}
_FINISHED_KEY = {"queue": "queue", "user": "user", "state": "state"}
_FINAL = ("completed", "failed", "cancelled", "rejected")

_LOW, _HIGH = -1e300, 1e300


def usage(conn: sqlite3.Connection, by: str, since: float | None, until: float | None,
          end: float) -> dict[str, Account]:
    """GPU-seconds, reservations and finished jobs per account over [since, until], as `corral usage`
    computes them from the log (orchestrator/core/accounting.py): each reservation clipped to the window,
    one still held counted up to `end`."""
    lo = _LOW if since is None else since
    hi = _HIGH if until is None else until
    out: dict[str, Account] = {}
    key = _RESERVATION_KEY[by]
    held_to = "COALESCE(r.end, :end)"
    rows = conn.execute(
        f"SELECT {key} AS k, SUM(r.gpus * (MIN({held_to}, :hi) - MAX(r.start, :lo))), COUNT(*) "
        f"FROM reservations r WHERE r.gpus > 0 AND (r.end IS NULL OR r.end >= :lo) AND r.start <= :hi "
        f"AND MIN({held_to}, :hi) >= MAX(r.start, :lo) GROUP BY k",
        {"lo": lo, "hi": hi, "end": end})
    for k, seconds, n in rows:
        out[k] = Account(gpu_seconds=float(seconds or 0.0), reservations=int(n))
    fkey = _FINISHED_KEY[by]
    rows = conn.execute(
        f"SELECT {fkey}, state, COUNT(*) FROM jobs WHERE ended_at IS NOT NULL AND ended_at >= :lo "
        f"AND ended_at <= :hi AND state IN {_FINAL!r} GROUP BY {fkey}, state", {"lo": lo, "hi": hi})
    for k, state, n in rows:
        acct = out.setdefault(k, Account())
        acct.finished[state] = int(n)
    return out


class JobRow(NamedTuple):
    """One job's row: the accounting columns and its newest fold record (msgpack `Job`)."""

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
    record: bytes


_JOB_COLUMNS = ("job_id, user, queue, name, submit_seq, submitted_at, started_at, ended_at, state, end_reason, ranks, "
                "gpus_per_rank, gpu_seconds, attempts, preemptions, record")


def jobs(conn: sqlite3.Connection, *, since: float | None = None, until: float | None = None,
         user: str | None = None, states: Sequence[str] = (), queue: str | None = None, after: int = 0,
         limit: int = 500) -> list[JobRow]:
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
    return [JobRow(*r) for r in conn.execute(sql, params)]


def job(conn: sqlite3.Connection, job_id: str) -> JobRow | None:
    r = conn.execute(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
    return None if r is None else JobRow(*r)


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
