"""Prometheus metrics of the scheduler and the node agents.

Two kinds, for two reasons:
- Counters and the decide-latency histogram are bumped where things happen
  (an append, a decide call, an event folded); they are process-lifetime
  facts that no state holds.
- Gauges (GPUs per node and queue, pending jobs by reason, heartbeat ages)
  are computed from the folded state at scrape time by a custom collector, so
  they are always exactly the projection every other reader sees, never a
  second bookkeeping that could drift from it.

The HTTP endpoint runs on the service's own event loop (`asyncio.start_server`),
so a scrape reads the state between two folds, never in the middle of one: no
locks, no threads, and a scrape of `corral_log_position` tells which log
position the other gauges describe.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib.metadata
import platform
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import structlog
from prometheus_client import (
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from orchestrator.core.state import FREE, ClusterState, snapshot
from orchestrator.core.usage import ancestors, resolve_queue
from schemas import GangReserved, GangRestarted, PreemptionRequested, Unknown, WorkerStarted, tag_of
from schemas.events import UNREADABLE_REASONS

if TYPE_CHECKING:
    from events.bus import Envelope
    from events.follow import Follower
    from nodeagent.agent import Agent
    from orchestrator.service import Scheduler

log = structlog.get_logger("corral.metrics")

# `*_created` series (one per counter child) double the output and tell nothing a restart does not.
disable_created_metrics()  # type: ignore[no-untyped-call]

# Created without a registry: each exposed registry registers them (tests build several in one process).
EVENTS_APPENDED = Counter("corral_events_appended", "Events this process appended to the log", ["service"],
                          registry=None)
EVENTS_READ = Counter("corral_events_read", "Events this process folded from the log", ["service", "type"],
                      registry=None)
DECIDE_SECONDS = Histogram("corral_decide_seconds", "Time of one scheduling decision (decide over the state)",
                           buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
                           registry=None)
PREEMPTIONS = Counter("corral_preemptions", "Preemptions requested (PreemptionRequested folded)", registry=None)
RESTARTS = Counter("corral_restarts", "Restarts folded from the log: gang (GangRestarted) or rank (a worker "
                   "started again by its agent)", ["kind"], registry=None)

UNREADABLE_EVENTS = Counter("corral_unreadable_events", "Messages this process could not decode and folded as no "
                            "change, by why (schemas.events.UNREADABLE_REASONS)", ["service", "reason"],
                            registry=None)

#: Jobs that reached a final status, by it: counted when the scheduler's fold finished them (so a void
#: or duplicate completion is not counted), by the queue charged.
JOBS_FINISHED = Counter("corral_jobs_finished", "Jobs the fold finished, by outcome (completed, failed, cancelled, "
                        "rejected) and queue", ["outcome", "queue"], registry=None)
#: From submit (or the preemption that put it back in line) to the GangReserved that placed it.
QUEUE_WAIT = Histogram("corral_queue_wait_seconds", "Time a job waited in line before its gang was reserved, by "
                       "queue", ["queue"], buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400,
                                                    43200, 86400), registry=None)
#: GPUs x seconds of reservations that ended (completed, failed, cancelled, preempted, requeued): what
#: `corral usage` sums from the whole log, here since this process started.
QUEUE_GPU_SECONDS = Counter("corral_queue_gpu_seconds", "GPU-seconds of reservations that ended, by the queue "
                            "charged", ["queue"], registry=None)

PROCESS_METRICS = (EVENTS_APPENDED, EVENTS_READ, DECIDE_SECONDS, PREEMPTIONS, RESTARTS, UNREADABLE_EVENTS,
                   JOBS_FINISHED, QUEUE_WAIT, QUEUE_GPU_SECONDS)


def build_info() -> Metric:
    """`corral_build_info{version, python} 1`: which corral a process runs (dashboards join on it)."""
    try:
        version = importlib.metadata.version("corral")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    info = GaugeMetricFamily("corral_build_info", "corral version this process runs (value 1)",
                             labels=["version", "python"])
    info.add_metric([version, platform.python_version()], 1)
    return info


class _BuildInfo:
    def collect(self) -> Iterable[Metric]:
        return [build_info()]


def count_outcomes(follower: Follower[ClusterState]) -> None:
    """Jobs finished by outcome, queue waits and GPU-seconds per queue, from what the fold did with each event.

    Read after each event is folded: a job the event finished is in `state.finished` at that event's
    position; a gang it placed is active with `reserved_at` the event's time. The reservations being
    watched (at most the active gangs) are the only memory kept.
    """
    held: dict[str, tuple[str, int, float]] = {}  # job -> (queue, gpus, reserved_at) while it holds GPUs

    def on_event(env: Envelope) -> None:
        job_id = getattr(env.event, "job_id", None)
        if not isinstance(job_id, str):
            return
        state = follower.state
        job = state.jobs.get(job_id)
        at = getattr(env.event, "occurred_at", 0.0)
        was = held.get(job_id)
        holding = job is not None and job_id in state.active
        if was is not None and (not holding or job is None or job.reserved_at != was[2]):
            del held[job_id]
            QUEUE_GPU_SECONDS.labels(was[0]).inc(max(0.0, was[1] * (at - was[2])))
        if job is None:
            return
        queue = job.queue or resolve_queue(state, job.spec.queue)
        if holding and job_id not in held:
            held[job_id] = (queue, job.gpus, job.reserved_at)
            if isinstance(env.event, GangReserved):
                QUEUE_WAIT.labels(queue).observe(max(0.0, job.reserved_at - job.waiting_since))
        if state.finished.get(job_id) == env.seq:
            JOBS_FINISHED.labels(job.status, queue).inc()

    follower.on_event(on_event)


def count_folded(follower: Follower[ClusterState], service: str, *, cluster_facts: bool) -> None:
    """Count what `follower` folds; `cluster_facts` also counts preemptions and restarts (one reader per process)."""
    children: dict[str, Any] = {}

    def on_event(env: Envelope) -> None:
        ev = env.event
        if isinstance(ev, Unknown):
            # Labelled by the closed set of reasons, not by the tag it claimed: a publisher picks that.
            reason = ev.reason if ev.reason in UNREADABLE_REASONS else "malformed"
            UNREADABLE_EVENTS.labels(service, reason).inc()
            tag = "Unknown"
        else:
            tag = tag_of(ev)
        child = children.get(tag)
        if child is None:
            child = children[tag] = EVENTS_READ.labels(service, tag)
        child.inc()
        if not cluster_facts:
            return
        if isinstance(ev, PreemptionRequested):
            PREEMPTIONS.inc()
        elif isinstance(ev, GangRestarted):
            RESTARTS.labels("gang").inc()
        elif isinstance(ev, WorkerStarted) and ev.restarts > 0:
            RESTARTS.labels("rank").inc()

    follower.on_event(on_event)


def state_digest(state: ClusterState) -> int:
    """48 bits of a hash of the state's snapshot (a gauge's float holds them exactly).

    Two readers at the same log position with the same digest hold the same projection: how a
    fault test checks that a service which lived through pauses, kills and reconnects folded the
    log exactly as a fresh replay does.
    """
    return int.from_bytes(hashlib.sha256(snapshot(state)).digest()[:6], "big")


def _fold_gauges(states: Iterable[tuple[str | None, ClusterState]]) -> list[Metric]:
    """Where each reader's fold is (`corral_log_position`) and what it holds (`corral_state_digest`)."""
    rows = list(states)
    labels = ["node"] if rows and rows[0][0] is not None else []
    position = _gauge("corral_log_position", "Last log sequence folded into the state these gauges describe", labels)
    digest = _gauge("corral_state_digest", "48-bit hash of the folded state's snapshot: equal for equal folds",
                    labels)
    for name, state in rows:
        key = [name] if name is not None else []
        position.add_metric(key, state.seq)
        digest.add_metric(key, state_digest(state))
    return [position, digest]


def _gauge(name: str, doc: str, labels: Sequence[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def state_metrics(state: ClusterState, heartbeat_ages: dict[str, float] | None = None) -> list[Metric]:
    """Gauges of one folded state: a pure function, so a test can check it without HTTP."""
    epoch = _gauge("corral_scheduler_epoch", "Newest SchedulerElected epoch in the log")
    epoch.add_metric([], state.epoch)

    node_gpus = _gauge("corral_node_gpus", "GPUs of a node by state (allocated: held by a gang)", ["node", "state"])
    node_cond = _gauge("corral_node_condition", "1 for the node's condition (ready, cordoned, failed)",
                       ["node", "condition"])
    cluster_free = 0
    for nid, node in state.nodes.items():
        owners = state.owners.get(nid, ())
        used = sum(1 for o in owners if o != FREE)
        node_gpus.add_metric([nid, "allocated"], used)
        node_gpus.add_metric([nid, "free"], len(owners) - used)
        cond = "failed" if node.failed else "cordoned" if node.cordoned else "ready"
        node_cond.add_metric([nid, cond], 1)
        if node.schedulable:
            cluster_free += len(owners) - used

    q_alloc = _gauge("corral_queue_gpus_allocated", "GPUs a queue holds now (its own jobs)", ["queue"])
    q_free = _gauge("corral_queue_gpus_free", "GPUs a queue could still take now: free schedulable GPUs, capped "
                    "by its and its parents' limits", ["queue"])
    q_guar = _gauge("corral_queue_gpus_guaranteed", "GPUs guaranteed to a queue", ["queue"])
    q_limit = _gauge("corral_queue_gpus_limit", "Most GPUs a queue may hold (absent: no limit)", ["queue"])
    q_weight = _gauge("corral_queue_weight", "Fair-share weight of a queue", ["queue"])
    q_pending = _gauge("corral_queue_pending_jobs", "Pending jobs of a queue", ["queue"])
    pending_by_queue: dict[str, int] = {}
    pending_by_reason: dict[str, int] = {}
    for jid in state.pending:
        job = state.jobs[jid]
        qn = job.queue or resolve_queue(state, job.spec.queue)
        pending_by_queue[qn] = pending_by_queue.get(qn, 0) + 1
        code = job.waiting.code if job.waiting is not None else "unexplained"
        pending_by_reason[code] = pending_by_reason.get(code, 0) + 1
    names = list(dict.fromkeys([*state.queues, *state.usage, *pending_by_queue]))
    for name in names:
        q = state.queues.get(name)
        u = state.usage.get(name)
        q_alloc.add_metric([name], u.gpus if u else 0)
        headroom = cluster_free
        for a in ancestors(state.queues, name):
            aq, au = state.queues.get(a), state.usage.get(a)
            if aq is not None and aq.limit_gpus is not None:
                headroom = min(headroom, aq.limit_gpus - (au.tree_gpus if au else 0))
        q_free.add_metric([name], max(0, headroom))
        q_guar.add_metric([name], q.guaranteed_gpus if q else 0)
        if q is not None and q.limit_gpus is not None:
            q_limit.add_metric([name], q.limit_gpus)
        q_weight.add_metric([name], q.weight if q else 1.0)
        q_pending.add_metric([name], pending_by_queue.get(name, 0))

    pending = _gauge("corral_pending_jobs", "Pending jobs by the scheduler's reason code", ["reason"])
    for code, n in sorted(pending_by_reason.items()):
        pending.add_metric([code], n)
    jobs = _gauge("corral_jobs", "Jobs by status", ["status"])
    counts: dict[str, int] = {}
    for job in state.jobs.values():
        counts[job.status] = counts.get(job.status, 0) + 1
    for status, n in sorted(counts.items()):
        jobs.add_metric([status], n)
    # A counter: the fold only ever adds to it (exposed as corral_void_decisions_total).
    voids = CounterMetricFamily("corral_void_decisions", "Decisions the fold recorded as void (stale epoch, GPUs "
                                "taken), since the log began")
    voids.add_metric([], state.voids)

    out: list[Metric] = [*_fold_gauges([(None, state)]), epoch, node_gpus, node_cond, q_alloc, q_free, q_guar,
                         q_limit, q_weight, q_pending, pending, jobs, voids]
    if heartbeat_ages is not None:
        hb = _gauge("corral_node_heartbeat_age_seconds", "Seconds since the scheduler last received the node's "
                    "heartbeat (its own clock)", ["node"])
        for nid, age in sorted(heartbeat_ages.items()):
            hb.add_metric([nid], age)
        out.append(hb)
    return out


class StateCollector:
    """Gauges from a live state, computed when scraped."""

    def __init__(self, state: Callable[[], ClusterState],
                 heartbeat_ages: Callable[[], dict[str, float] | None] = lambda: None) -> None:
        self._state = state
        self._heartbeat_ages = heartbeat_ages

    def collect(self) -> Iterable[Metric]:
        return state_metrics(self._state(), self._heartbeat_ages())


class AgentCollector:
    """Per-node worker counts of the agents in this process."""

    def __init__(self, agents: Sequence[Agent]) -> None:
        self._agents = agents

    def collect(self) -> Iterable[Metric]:
        workers = _gauge("corral_agent_workers", "Workers an agent runs now", ["node"])
        for agent in self._agents:
            workers.add_metric([agent.node_id], len(agent.workers))
        return [workers, *_fold_gauges((a.node_id, a.follower.state) for a in self._agents)]


def scheduler_heartbeat_ages(sched: Scheduler) -> dict[str, float] | None:
    """Per live node, seconds since the scheduler's monitor received its heartbeat (None before it runs)."""
    monitor = sched.monitor
    if monitor is None:
        return None
    return monitor.silence((n.node_id, n.incarnation) for n in sched.state.nodes.values() if not n.failed)


class ServiceRegistry(CollectorRegistry):
    """The registry of a process's services, which also knows whether they can work (`/readyz`)."""

    def __init__(self, buses: Sequence[Any] = ()) -> None:
        super().__init__()
        self._buses = list(buses)

    def not_ready(self) -> str:
        """Empty when every service's NATS connection is up, else why not (a Kubernetes readiness probe)."""
        for bus in self._buses:
            nc = getattr(bus, "nc", None)
            if nc is not None and not nc.is_connected:
                return "not connected to NATS"
        return ""


def registry_for(scheduler: Scheduler | None = None, agents: Sequence[Agent] = ()) -> ServiceRegistry:
    """A registry with the process metrics and the gauges of the services run in this process.

    Call before the services run so their catch-up is counted too.
    """
    reg = ServiceRegistry([*([scheduler.bus] if scheduler is not None else []), *(a.bus for a in agents)])
    for metric in PROCESS_METRICS:
        reg.register(metric)
    # process_* (CPU, memory, open files) and python_info, as any Prometheus client exposes them.
    reg.register(PROCESS_COLLECTOR)
    reg.register(PLATFORM_COLLECTOR)
    reg.register(_BuildInfo())
    if scheduler is not None:
        count_folded(scheduler.follower, "scheduler", cluster_facts=True)
        count_outcomes(scheduler.follower)
        reg.register(StateCollector(lambda: scheduler.state, lambda: scheduler_heartbeat_ages(scheduler)))
    if agents:
        for agent in agents:
            count_folded(agent.follower, f"agent/{agent.node_id}", cluster_facts=False)
        reg.register(AgentCollector(agents))
    return reg


# --- the endpoint ------------------------------------------------------------------------------


class MetricsServer:
    """`GET /metrics` on the running event loop. Start with `await MetricsServer(...).start()`."""

    def __init__(self, registry: CollectorRegistry, host: str = "0.0.0.0", port: int = 9464) -> None:
        self.registry = registry
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}/metrics"

    async def start(self) -> MetricsServer:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("metrics_serving", url=self.url)
        return self

    async def close(self) -> None:
        """Idempotent."""
        if self._server is not None:
            server, self._server = self._server, None
            server.close()
            with contextlib.suppress(Exception):
                await server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            parts = head.split(b"\r\n", 1)[0].split()
            method, path = (parts[0], parts[1]) if len(parts) >= 2 else (b"", b"")
            route = path.split(b"?")[0]
            if method not in (b"GET", b"HEAD") or route not in (b"/metrics", b"/", b"/healthz", b"/readyz"):
                status, ctype, body = "404 Not Found", "text/plain", b"try /metrics, /healthz or /readyz\n"
            elif route == b"/healthz":  # liveness: the service's event loop answers (a wedged loop does not)
                status, ctype, body = "200 OK", "text/plain", b"ok\n"
            elif route == b"/readyz":  # readiness: and its NATS connection is up
                why = self.registry.not_ready() if isinstance(self.registry, ServiceRegistry) else ""
                status, ctype, body = ("503 Service Unavailable", "text/plain", why.encode() + b"\n") if why else \
                    ("200 OK", "text/plain", b"ready\n")
            else:
                t0 = time.perf_counter()
                status, ctype, body = "200 OK", CONTENT_TYPE_LATEST, generate_latest(self.registry)
                log.debug("metrics_scraped", ms=round((time.perf_counter() - t0) * 1000, 2))
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                         "Connection: close\r\n\r\n".encode() + (b"" if method == b"HEAD" else body))
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
