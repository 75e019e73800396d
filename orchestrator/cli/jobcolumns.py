"""The columns of `corral jobs`: the squeue-like default, the sacct-like history, and `--format`'s choice.

Each column has a header, the names `--format` knows it by (sacct's among them), its `--json` key and how
a job fills it, so the table and the JSON of one listing carry the same fields whichever answered it (the
index or the fold: both hand over the fold's record of each job).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any, NamedTuple

from orchestrator.cli.errors import USAGE, CliError
from orchestrator.cli.output import human_duration
from orchestrator.cli.timespec import SIMULATED_BEFORE_S, LogClock
from orchestrator.cli.views import (
    job_age,
    job_elapsed,
    job_exit_code,
    job_note,
    job_queue,
    job_shape,
    job_started_at,
    readable,
)
from orchestrator.core.model.state import TERMINAL, ClusterState, Job

Cell = Callable[[ClusterState, Job, float], Any]


class Column(NamedTuple):
    name: str
    header: str
    #: The key of `corral jobs --json` it shows (`--format` with `--json` keeps these keys).
    key: str
    cell: Cell
    #: Other names `--format` takes for it (sacct's spelling first).
    aliases: tuple[str, ...] = ()


def _moment(ts: float | None, now: float) -> str:
    """A time in a column: a cluster's to the second, as sacct prints it; a simulated clock's as `--at` reads it."""
    if ts is None:
        return "-"
    if now < SIMULATED_BEFORE_S:
        return LogClock(simulated=True).instant(ts)
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%dT%H:%M:%S")


def _exit(job: Job) -> str:
    code = job_exit_code(job)
    return "-" if code is None else str(code)


COLUMNS: tuple[Column, ...] = (
    Column("job", "JOB", "job_id", lambda s, j, n: j.job_id, ("jobid",)),
    Column("name", "NAME", "name", lambda s, j, n: j.spec.name, ("jobname",)),
    Column("user", "USER", "submitted_by", lambda s, j, n: j.submitted_by or "-"),
    Column("queue", "QUEUE", "queue", lambda s, j, n: job_queue(s, j), ("partition",)),
    Column("state", "STATE", "status", lambda s, j, n: j.status),
    Column("attempt", "ATTEMPT", "attempt", lambda s, j, n: j.attempt, ("restarts",)),
    Column("gpus", "GPUS", "gpus", lambda s, j, n: job_shape(j), ("allocgpus", "shape")),
    Column("priority", "PRIO", "priority", lambda s, j, n: j.spec.priority, ("prio",)),
    Column("age", "AGE", "age_s", lambda s, j, n: human_duration(job_age(j, n))),
    Column("submit", "SUBMIT", "submitted_at", lambda s, j, n: _moment(j.submitted_at, n)),
    Column("start", "START", "started_at", lambda s, j, n: _moment(job_started_at(j), n)),
    Column("end", "END", "ended_at",
           lambda s, j, n: _moment(j.finished_at if j.status in TERMINAL else None, n)),
    Column("elapsed", "ELAPSED", "elapsed_s", lambda s, j, n: human_duration(job_elapsed(j, n))),
    Column("exitcode", "EXIT", "exit_code", lambda s, j, n: _exit(j), ("exit",)),
    Column("reason", "WHERE / WHY", "end_reason", lambda s, j, n: readable(job_note(j, s), n), ("note", "where")),
)
_BY_NAME = {name: c for c in COLUMNS for name in (c.name, *c.aliases)}

#: `corral jobs` (like squeue): what is running where, what waits and why.
DEFAULT = ("job", "name", "user", "queue", "state", "attempt", "gpus", "priority", "age", "reason")
#: `corral jobs --all` or a final --state (like sacct): when each job ran, how long, how it ended.
HISTORY = ("job", "name", "user", "queue", "state", "attempt", "gpus", "submit", "start", "end", "elapsed",
           "exitcode", "reason")


def columns(names: tuple[str, ...]) -> list[Column]:
    return [_BY_NAME[n] for n in names]


def parse_format(text: str) -> list[Column]:
    """`--format job,state,elapsed` (case-insensitive, sacct's names too) -> the columns; exit 2 naming the
    known ones for a name that is none."""
    out: list[Column] = []
    for part in filter(None, (p.strip().lower() for p in text.split(","))):
        found = _BY_NAME.get(part)
        if found is None:
            known = ", ".join(c.name for c in COLUMNS)
            raise CliError(f"unknown column {part!r} in --format; known: {known}", USAGE)
        out.append(found)
    if not out:
        raise CliError("--format names no column", USAGE)
    return out


def rows(state: ClusterState, jobs: list[Job], now: float, cols: list[Column]) -> list[list[Any]]:
    return [[c.cell(state, j, now) for c in cols] for j in jobs]


def json_fields(summary: dict[str, Any], job: Job, now: float, cols: list[Column]) -> dict[str, Any]:
    """A job's `--json` object cut to the chosen columns (its id always). Asked for, `age_s` and a job's
    `elapsed_s` while it holds GPUs count to `now` (without --format the JSON holds only the log's facts)."""
    full = {**summary, "age_s": job_age(job, now), "elapsed_s": job_elapsed(job, now)}
    return {"job_id": summary["job_id"], **{c.key: full[c.key] for c in cols}}
