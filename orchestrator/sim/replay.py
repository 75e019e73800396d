"""Event-log files: read one, fold it, or turn it into a scenario to re-run under another policy.

A log file is what the simulator writes and what forensics tools read: one
`schemas.encode(event)` JSON object per line, in log order. Folding it with
the normal `evolve` gives the simulation's final state, byte for byte.

`from_log` takes the jobs of a log (the JobSubmitted events, with their exact
specs and submit times) and its cluster -- the ClusterConfigured,
QueueDefined and NodeRegistered events, or a cluster spec given instead --
and node outages (NodeFailed, until the node registers again) and GPU faults
(GpuUnhealthy, until GpuHealthy), so the same
workload can be re-run under another policy. A job's duration comes from the
`SIM_DURATION_S` the simulator put in its spec; for logs of a real cluster,
from the last attempt's run (reserved to completed), else its time limit;
jobs with neither are left out and counted. Dependencies and job arrays
are kept (they are in the specs); holds are not (JobHeld / JobReleased are
users' acts, not submissions: a job submitted held runs as if submitted
free). Lines that are no event this
version reads (corrupt JSON, a newer event type) are counted too, with their
positions: the caller says so, since a lost JobSubmitted is a job missing
from the re-run.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import msgspec

from events.logfile import read_events
from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import ClusterState
from orchestrator.sim.cluster import EPOCH, ClusterSpec, setup_events
from orchestrator.sim.engine import Scenario
from orchestrator.sim.specs import DURATION_ENV, SimJob
from orchestrator.sim.trace import Outage, TraceError
from schemas.events import (
    GPU_FATAL,
    AnyEvent,
    ClusterConfigured,
    Event,
    GangReserved,
    GpuHealthy,
    GpuUnhealthy,
    JobCompleted,
    JobSubmitted,
    NodeFailed,
    NodeRecovered,
    NodeRegistered,
    QueueDefined,
    SchedulerElected,
    Unknown,
)
from schemas.jobspec import JobSpec

read_log = read_events


def fold_log(path: str | Path) -> ClusterState:
    state = ClusterState()
    for e in read_log(path):
        evolve(state, e)
    return state


class LoggedScenario(NamedTuple):
    scenario: Scenario
    #: Jobs left out because nothing says how long they run.
    skipped: tuple[str, ...]
    #: Lines (log positions) that are no event this version reads: corrupt JSON, or a newer event type.
    unreadable: tuple[int, ...] = ()
    #: The policies its elections name, in order, each once (`corral scheduler --policy`); none named (a
    #: simulation's log, a cluster's from before the option) reads as corral's.
    decided_by: tuple[str, ...] = ()


def _duration(e: JobSubmitted) -> float | None:
    raw = e.spec.env.get(DURATION_ENV)
    if raw is not None:
        try:
            v = float(raw)
        except ValueError:
            return None
        return v if math.isfinite(v) and v > 0 else None
    return None


def from_log(path: str | Path, cluster: ClusterSpec | None = None) -> LoggedScenario:
    """The workload (and, unless `cluster` is given, the cluster and outages) of a log file."""
    submitted: dict[str, JobSubmitted] = {}
    setup: list[Event] = []
    seen_nodes: set[str] = set()
    reserved_at: dict[str, float] = {}
    ran: dict[str, float] = {}
    down_since: dict[str, tuple[float, int]] = {}
    gpu_down: dict[tuple[str, int], tuple[float, int]] = {}
    outages: list[Outage] = []
    unreadable: list[int] = []
    lines: dict[str, int] = {}
    decided_by: dict[str, None] = {}
    for n, e in _numbered(path):
        if isinstance(e, Unknown):
            unreadable.append(n)
        elif isinstance(e, JobSubmitted):
            lines.setdefault(e.job_id, n)
            submitted.setdefault(e.job_id, e)
        elif isinstance(e, GangReserved):
            reserved_at[e.job_id] = e.occurred_at
        elif isinstance(e, SchedulerElected):
            if isinstance(e.policy, str):
                decided_by.setdefault(e.policy)
        elif isinstance(e, JobCompleted) and e.job_id in reserved_at:
            ran[e.job_id] = e.occurred_at - reserved_at[e.job_id]
        elif cluster is None:
            if isinstance(e, (ClusterConfigured, QueueDefined)):
                setup.append(e)
            elif isinstance(e, NodeRegistered):
                if e.node_id not in seen_nodes:
                    seen_nodes.add(e.node_id)
                    setup.append(e)
                elif e.node_id in down_since:
                    at, line = down_since.pop(e.node_id)
                    outages.append(Outage(e.node_id, at, _span(at, e.occurred_at), line))
            elif isinstance(e, NodeRecovered) and e.node_id in down_since:
                at, line = down_since.pop(e.node_id)
                outages.append(Outage(e.node_id, at, _span(at, e.occurred_at), line))
            elif isinstance(e, NodeFailed) and e.node_id in seen_nodes and e.node_id not in down_since:
                down_since[e.node_id] = (e.occurred_at, n)
            elif isinstance(e, GpuUnhealthy) and e.severity == GPU_FATAL and e.node_id in seen_nodes:
                gpu_down.setdefault((e.node_id, e.gpu_index), (e.occurred_at, n))
            elif isinstance(e, GpuHealthy) and (e.node_id, e.gpu_index) in gpu_down:
                at, line = gpu_down.pop((e.node_id, e.gpu_index))
                outages.append(Outage(e.node_id, at, _span(at, e.occurred_at), line, e.gpu_index))
    outages += [Outage(node, at, math.inf, line) for node, (at, line) in down_since.items()]
    outages += [Outage(node, at, math.inf, line, gpu) for (node, gpu), (at, line) in gpu_down.items()]
    if not submitted:
        raise TraceError([f"{path}: no JobSubmitted events"])
    if cluster is not None:
        setup = setup_events(cluster)
    else:
        if not seen_nodes:
            raise TraceError([f"{path}: no NodeRegistered events; give a cluster spec"])
        start = min(e.occurred_at for e in submitted.values())
        setup.insert(min(1, len(setup)), SchedulerElected(event_id="sim:elect", occurred_at=start, epoch=EPOCH,
                                                          scheduler_id="sim"))
        # The cluster exists before the first job, whenever its agents registered in the original.
        setup = [_at(e, min(e.occurred_at, start)) for e in setup]
    jobs: list[SimJob] = []
    skipped: list[str] = []
    for e in submitted.values():
        d = _duration(e) or ran.get(e.job_id) or e.spec.time_limit_s
        if d is None or d <= 0:
            skipped.append(e.job_id)
            continue
        jobs.append(SimJob(e.job_id, e.occurred_at, d, _unheld(e.spec), lines[e.job_id]))
    jobs.sort(key=lambda j: j.submit_time)
    return LoggedScenario(Scenario(tuple(setup), tuple(jobs), tuple(sorted(outages, key=lambda o: o.time))),
                          tuple(skipped), tuple(unreadable), tuple(decided_by))


def _unheld(spec: JobSpec) -> JobSpec:
    """`spec` not submitted held: a re-run replays submissions, not the holds and releases users gave them
    (they are JobHeld / JobReleased, which a re-run leaves out), so a job held at submit would never start."""
    if not spec.gating.hold:
        return spec
    return msgspec.structs.replace(spec, gates=msgspec.structs.replace(spec.gating, hold=False))


def _numbered(path: str | Path) -> Iterator[tuple[int, AnyEvent | Unknown]]:
    """(position, event) of every line, streamed; TraceError, not an OSError, for a file that cannot be read."""
    try:
        with Path(path).open("rb"):
            pass
    except OSError as e:
        raise TraceError([f"{path}: cannot read: {e.strerror or e}"]) from None
    return enumerate(read_log(path), start=1)


def _span(a: float, b: float) -> float:
    """b - a, nudged so that a + span == b exactly (the re-run repairs the node at the logged instant)."""
    d = b - a
    while a + d < b:
        d = math.nextafter(d, math.inf)
    while a + d > b:
        d = math.nextafter(d, -math.inf)
    return d


def _at(e: Event, t: float) -> Event:
    return msgspec.structs.replace(e, occurred_at=t) if e.occurred_at != t else e
