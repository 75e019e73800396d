"""An independent checker of time judgements in an exported log (`corral tail --no-follow --json`).

It imports nothing of corral: it reads the export's JSON records, whose
`time` is the stream's (the NATS server stored the message then; one clock,
whatever the publishers' clocks say), so a bug in the code under test cannot
hide in the checker too. What it knows of the rules, from DESIGN.md, the
event catalogue (schemas/events.py) and the README, re-stated here:

- a scheduler decision stamped with an epoch older than the newest elected one
  is void, and not held against the run;
- a gang restart's backoff is what the scheduler wrote: `not_before -
  occurred_at` of the GangRestarted (both its own stamps, so a duration on one
  clock); every rank of the restarted attempt waits that long after the
  GangRestarted was stored, within `tolerance` of it either way. No rank's
  WorkerStarted is stored sooner than (1 - tolerance) x the backoff after it
  (from the log alone). What the runtime takes to start a worker is not
  backoff (0.3-1 s for a process on a loaded machine), so the upper bound is
  on when the agent set out to start it (`decided`, given by the caller, who
  knows each agent's clock: e.g. its `worker_starting` log line, less the
  skew the fault injected), on the test machine's true clock, the NATS
  server's too;
- a job's time limit runs from its reservation (the GangReserved that placed
  the attempt that is stopped); the scheduler's stop for it ("time limit" in
  the CancelRequested reason) must not be stored before the limit passed;
- a running job may be preempted only after `--min-runtime` seconds from its
  reservation (a PreemptionRequested stored sooner is a violation);
- every submitted job ends (completed, failed, cancelled or rejected).

Double booking, epochs and unexplained NodeFailed are chaos_check's (also
corral-free), which a test runs on the same records.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tests.faults.chaos_check import SCHEDULER_EVENTS, TERMINAL, Stored


@dataclass(frozen=True)
class Record:
    seq: int
    time: float  # stream time, epoch seconds
    type: str
    event: dict[str, object]


@dataclass
class Report:
    #: (job, attempt, rank, configured backoff s, seconds waited) per restarted rank.
    backoffs: list[tuple[str, int, int, float, float]] = field(default_factory=list)
    #: (job, limit s, seconds from reservation to the stop).
    limits: list[tuple[str, float, float]] = field(default_factory=list)
    #: (job, attempt, seconds from reservation to the preemption request).
    preemptions: list[tuple[str, int, float]] = field(default_factory=list)
    ended: dict[str, str] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)


def read_export(path: Path) -> list[Record]:
    """The records of a `corral tail --no-follow --json` file, in order."""
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            out.append(Record(int(rec["seq"]), float(rec["time"]), str(rec["type"]), dict(rec["event"])))
    return out


def as_stored(records: Iterable[Record]) -> list[Stored]:
    """The records in chaos_check's form (it reads each event's JSON itself)."""
    return [Stored(r.seq, r.time, json.dumps(r.event).encode()) for r in records]


def check(records: Iterable[Record], *, min_runtime_s: float, tolerance: float = 0.2,
          decided: Mapping[tuple[str, int, int], float] | None = None) -> Report:
    """`decided`: (job, attempt, rank) -> when its agent set out to start the worker (true time, epoch s)."""
    r = Report()
    decided = decided or {}
    epoch = 0
    limits: dict[str, float] = {}
    submitted: list[str] = []
    reserved: dict[tuple[str, int], float] = {}
    started: set[tuple[str, int]] = set()
    #: Reservation time in force per job (a gang restart keeps its reservation and its time limit).
    holding: dict[str, float] = {}
    restarts: dict[tuple[str, int], tuple[float, float]] = {}  # -> (stored at, configured backoff)
    ranks_started: dict[tuple[str, int], set[int]] = {}
    #: (node, job, attempt, rank, raw seconds from the GangRestarted, configured backoff, seq), judged at the end.
    waits: list[tuple[str, int, int, float, float, float, int]] = []
    for m in records:
        e, kind = m.event, m.type
        if kind == "SchedulerElected":
            if e.get("epoch") == epoch + 1:
                epoch += 1
            continue
        if kind in SCHEDULER_EVENTS | {"PreemptionRequested", "GangRestarted", "CancelRequested"}:
            stamped = e.get("epoch", 0)
            if isinstance(stamped, int) and stamped and stamped < epoch:
                continue  # void
        job = str(e.get("job_id", ""))
        attempt = e.get("attempt")
        if kind == "JobSubmitted":
            submitted.append(job)
            spec = e.get("spec")
            limit = spec.get("time_limit_s") if isinstance(spec, dict) else None
            if isinstance(limit, int | float):
                limits[job] = float(limit)
        elif kind == "GangReserved" and isinstance(attempt, int) and (job, attempt) not in started:
            reserved[(job, attempt)] = m.time  # the newest before the attempt's first start: stricter, never laxer
            holding[job] = m.time
        elif kind == "WorkerStarted" and isinstance(attempt, int):
            started.add((job, attempt))
            rank = e.get("rank")
            if e.get("restarts", 0) != 0 or not isinstance(rank, int) \
                    or rank in ranks_started.setdefault((job, attempt), set()):
                continue
            ranks_started[(job, attempt)].add(rank)
            if (job, attempt) in restarts:
                at, backoff = restarts[(job, attempt)]
                waits.append((job, attempt, rank, at, m.time, backoff, m.seq))
        elif kind == "GangRestarted" and isinstance(attempt, int) and (job, attempt) not in restarts:
            nb, oa = e.get("not_before", 0.0), e.get("occurred_at", 0.0)
            if isinstance(nb, int | float) and isinstance(oa, int | float) and nb > 0:
                restarts[(job, attempt)] = (m.time, float(nb) - float(oa))
        elif kind == "PreemptionRequested" and isinstance(attempt, int):
            since = reserved.get((job, attempt))
            if since is not None:
                ran = m.time - since
                r.preemptions.append((job, attempt, ran))
                if ran < min_runtime_s:
                    r.violations.append(f"seq {m.seq}: {job} attempt {attempt} preempted {ran:.2f}s after its "
                                        f"reservation, inside --min-runtime {min_runtime_s:g}s")
        elif kind == "CancelRequested" and "time limit" in str(e.get("reason", "")):
            since = holding.get(job)
            limit = limits.get(job)
            if since is None or limit is None:
                r.violations.append(f"seq {m.seq}: {job} stopped for a time limit it does not have or before a "
                                    "reservation")
            elif (ran := m.time - since) < limit:
                r.limits.append((job, limit, ran))
                r.violations.append(f"seq {m.seq}: {job} stopped for its time limit {limit:g}s after {ran:.2f}s")
            else:
                r.limits.append((job, limit, ran))
        if kind in TERMINAL and job and job not in r.ended:
            r.ended[job] = kind
    for job, attempt, rank, at, stored, backoff, seq in waits:
        when = decided.get((job, attempt, rank))
        took = (when if when is not None else stored) - at
        r.backoffs.append((job, attempt, rank, backoff, took))
        if stored - at < (1 - tolerance) * backoff or took > (1 + tolerance) * backoff:
            r.violations.append(f"seq {seq}: {job} attempt {attempt} rank {rank} set out to start {took:.2f}s after "
                                f"its GangRestarted (stored {stored - at:.2f}s after it); the backoff is "
                                f"{backoff:.2f}s (+-{tolerance:.0%})")
    for job in submitted:
        if job not in r.ended:
            r.violations.append(f"end: {job} never ended")
    return r
