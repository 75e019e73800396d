"""Workload traces: the jobs (and node outages) a simulation replays, read from CSV.

Jobs: a header naming `job_id,submit_time,duration,num_gpus,queue` and any of
`priority,preemptible,gpu_model,topology,time_limit,datasets,locality`, in any
order; times are seconds. `topology` is a level name with an optional mode ("leaf",
"leaf:require", "none"); `time_limit` is the user's estimate that backfill
plans with (empty: no limit). `datasets` (issue #33) names the datasets the job
trains on with their sizes in GB, `name:GB` separated by `;` ("imagenet:150;
tokens:40"): the simulator stages them onto each node of the gang before its
ranks start; `locality` is `prefer` (default) or `require`. Outages, a separate CSV: `node_id,time,duration`
(seconds down; empty: never back), plus an optional `gpu` column: a row with a
GPU index is a GPU fault (GpuUnhealthy, then GpuHealthy when it ends), not a
node outage.

Every problem is reported with its file and line, all at once, so a
hand-written trace is fixed in one round trip.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple, TextIO, TypeVar

from schemas.datasets import NAME_RE

REQUIRED = ("job_id", "submit_time", "duration", "num_gpus", "queue")
OPTIONAL = ("priority", "preemptible", "gpu_model", "topology", "time_limit", "datasets", "locality")
#: The columns written only when some job uses them (traces without datasets keep their bytes).
DATASET_COLUMNS = ("datasets", "locality")
OUTAGE_COLUMNS = ("node_id", "time", "duration")
OUTAGE_OPTIONAL = ("gpu",)

#: Errors listed before giving up on a file (a wrong delimiter fails every line).
MAX_ERRORS = 20

_TRUE = {"1", "true", "yes", "y", "t"}
_FALSE = {"0", "false", "no", "n", "f"}


_Row = TypeVar("_Row")

class TraceError(ValueError):
    """A trace that cannot be simulated; `problems` are "file:line: what" strings."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        more = "" if len(problems) <= MAX_ERRORS else f"\n... and {len(problems) - MAX_ERRORS} more"
        super().__init__("\n".join(problems[:MAX_ERRORS]) + more)


class TraceJob(NamedTuple):
    job_id: str
    submit_time: float
    duration: float
    num_gpus: int
    queue: str
    priority: int = 0
    preemptible: bool = True
    gpu_model: str | None = None
    #: (level, mode) or None: the simulator picks a default from the gang's shape.
    topology: tuple[str, str] | None = None
    time_limit: float | None = None
    #: Line in the trace file (0 when made in memory), for error messages.
    line: int = 0
    #: (name, size in GB) of each dataset it trains on (issue #33), and "prefer" or "require".
    datasets: tuple[tuple[str, float], ...] = ()
    locality: str = "prefer"


class Outage(NamedTuple):
    node_id: str
    time: float
    #: Seconds down; math.inf: the node never comes back.
    duration: float
    line: int = 0
    #: A GPU index: only that GPU fails (a GPU fault), not the node.
    gpu: int | None = None


class Trace(NamedTuple):
    jobs: tuple[TraceJob, ...]
    outages: tuple[Outage, ...] = ()
    source: str = "<memory>"


def _number(raw: str, what: str, *, nonzero: bool = False) -> float:
    try:
        v = float(raw)
    except ValueError:
        raise ValueError(f"{what} must be a number of seconds, got {raw!r}") from None
    if not math.isfinite(v) or v < 0 or (nonzero and v == 0):
        raise ValueError(f"{what} must be a finite number {'> 0' if nonzero else '>= 0'}, got {raw!r}")
    return v


def _integer(raw: str, what: str, lo: int, hi: int) -> int:
    try:
        v = int(raw)
    except ValueError:
        raise ValueError(f"{what} must be an integer, got {raw!r}") from None
    if not lo <= v <= hi:
        raise ValueError(f"{what} must be between {lo} and {hi}, got {v}")
    return v


def _topology(raw: str) -> tuple[str, str] | None:
    raw = raw.strip()
    if not raw or raw.lower() == "none":
        return None
    level, _, mode = raw.partition(":")
    mode = mode or "prefer"
    if not level or mode not in ("prefer", "require"):
        raise ValueError(f"topology must look like 'leaf' or 'leaf:require', got {raw!r}")
    return level, mode


def parse_datasets(raw: str) -> tuple[tuple[str, float], ...]:
    """"imagenet:150;tokens:40" -> (("imagenet", 150.0), ("tokens", 40.0)); "" -> ()."""
    out: list[tuple[str, float]] = []
    for part in raw.split(";"):
        part = part.strip()
        if not part:
            continue
        name, sep, size = part.partition(":")
        name = name.strip()
        if not sep or not NAME_RE.fullmatch(name):
            raise ValueError(f"datasets must look like 'name:GB;name:GB' with names of letters, digits and _ "
                             f"(a letter first), got {part!r}")
        if any(n == name for n, _ in out):
            raise ValueError(f"dataset {name!r} is named twice")
        out.append((name, _number(size.strip(), f"dataset {name}'s size in GB")))
    return tuple(out)


def _boolean(raw: str) -> bool:
    v = raw.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ValueError(f"preemptible must be true or false, got {raw!r}")


def _job(row: dict[str, str], line: int) -> TraceJob:
    job_id = row["job_id"].strip()
    if not job_id:
        raise ValueError("job_id is empty")
    queue = row["queue"].strip()
    if not queue:
        raise ValueError("queue is empty")
    duration = _number(row["duration"], "duration", nonzero=True)
    limit_raw = (row.get("time_limit") or "").strip()
    return TraceJob(
        job_id=job_id,
        submit_time=_number(row["submit_time"], "submit_time"),
        duration=duration,
        num_gpus=_integer(row["num_gpus"], "num_gpus", 1, 65_536),
        queue=queue,
        priority=_integer(row.get("priority") or "0", "priority", -1_000_000, 1_000_000),
        preemptible=_boolean(row.get("preemptible") or "true"),
        gpu_model=(row.get("gpu_model") or "").strip() or None,
        topology=_topology(row.get("topology") or ""),
        time_limit=_number(limit_raw, "time_limit", nonzero=True) if limit_raw else None,
        line=line,
        datasets=parse_datasets(row.get("datasets") or ""),
        locality=_locality(row.get("locality") or ""),
    )


def _locality(raw: str) -> str:
    v = raw.strip().lower() or "prefer"
    if v not in ("prefer", "require"):
        raise ValueError(f"locality must be prefer or require, got {raw!r}")
    return v


def _header_problems(name: str, header: list[str] | None, required: Iterable[str], optional: Iterable[str]) -> list[str]:
    if not header:
        return [f"{name}:1: empty file; expected a header line {','.join(required)}"]
    cols = [h.strip() for h in header]
    out = []
    missing = [c for c in required if c not in cols]
    if missing:
        out.append(f"{name}:1: missing column(s) {', '.join(missing)}; the header must name "
                   f"{', '.join(required)} (in any order, optional columns anywhere)")
    known = {*required, *optional}
    unknown = [c for c in cols if c not in known]
    if unknown:
        out.append(f"{name}:1: unknown column(s) {', '.join(unknown)}; known columns: {', '.join([*required, *optional])}")
    dup = sorted({c for c in cols if cols.count(c) > 1})
    if dup:
        out.append(f"{name}:1: column(s) {', '.join(dup)} appear more than once")
    return out


def _rows(f: TextIO, name: str, required: tuple[str, ...], optional: tuple[str, ...]) -> tuple[list[tuple[int, dict[str, str]]], list[str]]:
    reader = csv.reader(f)
    rows: list[tuple[int, dict[str, str]]] = []
    try:
        header = next(reader, None)
        problems = _header_problems(name, header, required, optional)
        if problems or header is None:
            return [], problems
        cols = [h.strip() for h in header]
        for fields in reader:
            line = reader.line_num
            if not fields or all(not x.strip() for x in fields) or fields[0].lstrip().startswith("#"):
                continue
            if len(fields) != len(cols):
                problems.append(f"{name}:{line}: {len(fields)} fields, the header has {len(cols)}")
                continue
            rows.append((line, dict(zip(cols, fields, strict=True))))
    except csv.Error as e:  # a field past csv's size limit: the file is told, not a traceback
        return [], [f"{name}:{reader.line_num}: not readable as CSV: {e}"]
    return rows, problems


def read_jobs(f: TextIO, name: str = "<trace>") -> list[TraceJob]:
    rows, problems = _rows(f, name, REQUIRED, OPTIONAL)
    jobs: list[TraceJob] = []
    seen: dict[str, int] = {}
    for line, row in rows:
        try:
            job = _job(row, line)
        except ValueError as e:
            problems.append(f"{name}:{line}: {e}")
            continue
        if job.job_id in seen:
            problems.append(f"{name}:{line}: job_id {job.job_id!r} already used on line {seen[job.job_id]}")
            continue
        seen[job.job_id] = line
        jobs.append(job)
    if problems:
        raise TraceError(problems)
    if not jobs:
        raise TraceError([f"{name}: no jobs"])
    return jobs


def read_outages(f: TextIO, name: str = "<outages>") -> list[Outage]:
    rows, problems = _rows(f, name, OUTAGE_COLUMNS, OUTAGE_OPTIONAL)
    out: list[Outage] = []
    for line, row in rows:
        try:
            node = row["node_id"].strip()
            if not node:
                raise ValueError("node_id is empty")
            down = row["duration"].strip()
            gpu_text = (row.get("gpu") or "").strip()
            if gpu_text and not gpu_text.isdigit():
                raise ValueError(f"gpu must be a GPU index (0, 1, ...) or empty, got {gpu_text!r}")
            out.append(Outage(node, _number(row["time"], "time"),
                              _number(down, "duration") if down else math.inf, line,
                              int(gpu_text) if gpu_text else None))
        except ValueError as e:
            problems.append(f"{name}:{line}: {e}")
    if problems:
        raise TraceError(problems)
    return out


def load_trace(path: str | Path, outages: str | Path | None = None) -> Trace:
    """Jobs from `path` in submit order (ties: file order), plus outages from a second CSV."""
    p = Path(path)
    jobs = _read_csv(p, read_jobs)
    outs = _read_csv(Path(outages), read_outages) if outages is not None else []
    return Trace(jobs=sort_jobs(jobs), outages=tuple(sorted(outs, key=lambda o: (o.time, o.line))), source=str(p))


def _read_csv(p: Path, read: Callable[[TextIO, str], list[_Row]]) -> list[_Row]:
    """`read` over the file; TraceError for a file that cannot be read or is not UTF-8.

    Read as utf-8-sig: a spreadsheet's "CSV UTF-8" export starts with a byte-order mark.
    """
    try:
        with p.open(newline="", encoding="utf-8-sig") as f:
            return read(f, str(p))
    except OSError as e:
        raise TraceError([f"{p}: cannot read: {e.strerror}"]) from None
    except UnicodeDecodeError as e:
        raise TraceError([f"{p}: not UTF-8 text (byte {e.start})"]) from None


def sort_jobs(jobs: Iterable[TraceJob]) -> tuple[TraceJob, ...]:
    return tuple(sorted(jobs, key=lambda j: (j.submit_time, j.line)))


def _fmt(v: float) -> str:
    return repr(v) if v != int(v) else str(int(v))


def write_trace(jobs: Iterable[TraceJob], f: TextIO) -> None:
    """Jobs as CSV with every optional column (the generator's output format); the dataset columns only
    when some job has datasets."""
    jobs = list(jobs)
    data = any(j.datasets or j.locality != "prefer" for j in jobs)
    optional = OPTIONAL if data else tuple(c for c in OPTIONAL if c not in DATASET_COLUMNS)
    w = csv.writer(f, lineterminator="\n")
    w.writerow([*REQUIRED, *optional])
    for j in jobs:
        topo = f"{j.topology[0]}:{j.topology[1]}" if j.topology else ""
        row = [
            j.job_id, _fmt(j.submit_time), _fmt(j.duration), j.num_gpus, j.queue, j.priority,
            "true" if j.preemptible else "false", j.gpu_model or "", topo,
            "" if j.time_limit is None else _fmt(j.time_limit),
        ]
        if data:
            row += [";".join(f"{n}:{_fmt(gb)}" for n, gb in j.datasets), j.locality]
        w.writerow(row)


def write_outages(outages: Iterable[Outage], f: TextIO) -> None:
    outages = list(outages)
    gpus = any(o.gpu is not None for o in outages)  # (the column only when used: older files stay as they were)
    w = csv.writer(f, lineterminator="\n")
    w.writerow([*OUTAGE_COLUMNS, *OUTAGE_OPTIONAL] if gpus else OUTAGE_COLUMNS)
    for o in outages:
        row = [o.node_id, _fmt(o.time), "" if math.isinf(o.duration) else _fmt(o.duration)]
        w.writerow([*row, "" if o.gpu is None else o.gpu] if gpus else row)
