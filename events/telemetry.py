"""What every corral service exposes to Prometheus, and the HTTP endpoint that serves it.

Each service owns its own gauges and counters (the scheduler's in
orchestrator/scheduler/metrics.py, the agent's in nodeagent/metrics.py) and registers
them in one `ServiceRegistry` per process; this module holds what they share:
the registry (with the process, platform and build facts any process
exposes), the counters every reader of the log bumps (events appended, read,
unreadable), the fold's position and digest gauges, and `MetricsServer`.

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
from typing import Any, TypeVar

import structlog
from prometheus_client import PLATFORM_COLLECTOR, PROCESS_COLLECTOR, CollectorRegistry, Counter, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from events.bus import Envelope
from events.follow import Follower, Positioned
from schemas import Unknown, tag_of
from schemas.events import EVENT_TAGS, REFUSED, UNREADABLE_REASONS

log = structlog.get_logger("corral.metrics")

S = TypeVar("S", bound=Positioned)

# `*_created` series (one per counter child) double the output and tell nothing a restart does not.
disable_created_metrics()  # type: ignore[no-untyped-call]

# Created without a registry: each exposed registry registers them (tests build several in one process).
EVENTS_APPENDED = Counter("corral_events_appended", "Events this process appended to the log", ["service"],
                          registry=None)
EVENTS_READ = Counter("corral_events_read", "Events this process folded from the log", ["service", "type"],
                      registry=None)
UNREADABLE_EVENTS = Counter("corral_unreadable_events", "Messages this process could not decode and folded as no "
                            "change, by why (schemas.events.UNREADABLE_REASONS)", ["service", "reason"],
                            registry=None)
REFUSED_EVENTS = Counter("corral_refused_events", "Events this process refused as read and folded as no change: "
                         "their subject, type and entity disagree, so their publisher had no right to write them "
                         "(events/authorship.py), by the type they claimed", ["service", "type"], registry=None)

#: What every reader counts; each service registers its own beside them.
READER_METRICS = (EVENTS_APPENDED, EVENTS_READ, UNREADABLE_EVENTS, REFUSED_EVENTS)


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


def count_folded(follower: Follower[Any], service: str) -> None:
    """Count what `follower` folds, by event type, and the unreadable messages among them by why."""
    children: dict[str, Any] = {}

    def on_event(env: Envelope) -> None:
        ev = env.event
        if isinstance(ev, Unknown):
            if ev.reason == REFUSED:  # (a refused event decoded: its type is one of EVENT_TAGS, a closed set)
                REFUSED_EVENTS.labels(service, ev.type if ev.type in EVENT_TAGS else "Unknown").inc()
            else:
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

    follower.on_event(on_event)


def gauge(name: str, doc: str, labels: Sequence[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def digest(snapshot: bytes) -> int:
    """48 bits of a hash of a state's snapshot (a gauge's float holds them exactly).

    Two readers at the same log position with the same digest hold the same projection: how a
    fault test checks that a service which lived through pauses, kills and reconnects folded the
    log exactly as a fresh replay does.
    """
    return int.from_bytes(hashlib.sha256(snapshot).digest()[:6], "big")


def fold_gauges(states: Iterable[tuple[str | None, S]], snapshot: Callable[[S], bytes]) -> list[Metric]:
    """Where each reader's fold is (`corral_log_position`) and what it holds (`corral_state_digest`).

    `states`: (node, state) per reader, node None for a process's one reader (no label).
    """
    rows = list(states)
    labels = ["node"] if rows and rows[0][0] is not None else []
    position = gauge("corral_log_position", "Last log sequence folded into the state these gauges describe", labels)
    state_digest = gauge("corral_state_digest", "48-bit hash of the folded state's snapshot: equal for equal folds",
                         labels)
    for name, state in rows:
        key = [name] if name is not None else []
        position.add_metric(key, state.seq)
        state_digest.add_metric(key, digest(snapshot(state)))
    return [position, state_digest]


def catching_up(seq: int, target: int | None) -> str:
    """Empty once a reader folded up to `target` (the log's last position at its start), else the gap."""
    if target is None:
        return "starting: the log's last position is not read yet"
    if seq < target:
        return f"catching up: folded seq {seq} of {target} ({target - seq} behind)"
    return ""


#: A reader's progress for readiness: (where its fold is, the log's end at its start or None before it read it).
Progress = tuple[Callable[[], int], Callable[[], int | None]]


class _CatchUp:
    """`corral_catch_up_behind{service}`: one family for every reader of the process (scheduler, agents, index)."""

    def __init__(self, readers: list[tuple[str, Progress]]) -> None:
        self._readers = readers

    def collect(self) -> Iterable[Metric]:
        behind = gauge("corral_catch_up_behind", "Events between a reader's fold and the log's last position at "
                       "its start (0 once caught up; -1 before it read the log): /readyz is 503 until 0",
                       ["service"])
        for service, (seq, target) in self._readers:
            at, end = seq(), target()
            behind.add_metric([service], -1 if end is None else max(0, end - at))
        return [behind] if self._readers else []


class ServiceRegistry(CollectorRegistry):
    """The registry of a process's services, which also knows whether they can work (`/readyz`).

    Create it before the services run, so their catch-up is counted too; it holds the readers'
    counters and the process's own facts, and each service registers its collectors in it, and
    what it needs to be ready (`require`, `require_caught_up`).
    """

    def __init__(self, buses: Sequence[Any] = ()) -> None:
        super().__init__()
        self._buses = list(buses)
        self._checks: list[tuple[str, Callable[[], str]]] = []
        self._readers: list[tuple[str, Progress]] = []
        for metric in READER_METRICS:
            self.register(metric)
        # process_* (CPU, memory, open files) and python_info, as any Prometheus client exposes them.
        self.register(PROCESS_COLLECTOR)
        self.register(PLATFORM_COLLECTOR)
        self.register(_BuildInfo())
        self.register(_CatchUp(self._readers))

    def collect(self) -> Iterable[Metric]:
        """Every family once, however many services of this process describe it.

        Several services share a process (`corral up`: the scheduler and every agent each report where their
        fold is, `corral_log_position` and `corral_state_digest`): their samples join one family with one
        HELP and TYPE, as the exposition format requires (Prometheus' strict parser, `promtool check
        metrics`, rejects a family twice). Their series stay apart by their labels (an agent's `node`).
        """
        merged: dict[str, Metric] = {}
        for metric in super().collect():
            first = merged.get(metric.name)
            if first is None:
                merged[metric.name] = metric
                continue
            if first.type != metric.type:  # (a name given two types is a bug: keep the first, say so)
                log.error("metric_type_conflict", name=metric.name, types=[first.type, metric.type])
                continue
            joined = Metric(first.name, first.documentation, first.type, first.unit)
            joined.samples = [*first.samples, *metric.samples]  # new lists: a collector's own are never changed
            merged[metric.name] = joined
        return list(merged.values())

    def require(self, service: str, check: Callable[[], str]) -> None:
        """Ready only while `check()` is empty (else it says why, naming no service: this adds the name)."""
        self._checks.append((service, check))

    def require_caught_up(self, service: str, follower: Follower[Any]) -> None:
        """Ready only once `follower` folded up to the log's end as of its start (`Follower.target`)."""
        self.require_position(service, lambda: follower.position, lambda: follower.target)

    def require_position(self, service: str, seq: Callable[[], int], target: Callable[[], int | None]) -> None:
        """Ready only once `seq()` reached `target()` (None: not known yet); the gap is a gauge too.

        For a reader that is no Follower (the index); `target` must be taken once, at its start.
        """
        self._readers.append((service, (seq, target)))
        self.require(service, lambda: catching_up(seq(), target()))

    def not_ready(self) -> str:
        """Empty when every service's NATS connection is up and every check passes, else why not (one line
        per service that is not ready; a Kubernetes readiness probe)."""
        for bus in self._buses:
            nc = getattr(bus, "nc", None)
            if nc is not None and not nc.is_connected:
                return "not connected to NATS"
        return "\n".join(f"{service}: {why}" for service, check in self._checks if (why := check()))


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
            async with asyncio.timeout(5.0):  # not wait_for: events/swallowed_cancel.py
                head = await reader.readuntil(b"\r\n\r\n")
            parts = head.split(b"\r\n", 1)[0].split()
            method, path = (parts[0], parts[1]) if len(parts) >= 2 else (b"", b"")
            route = path.split(b"?")[0]
            if method not in (b"GET", b"HEAD") or route not in (b"/metrics", b"/", b"/healthz", b"/readyz"):
                status, ctype, body = "404 Not Found", "text/plain", b"try /metrics, /healthz or /readyz\n"
            elif route == b"/healthz":  # liveness: the service's event loop answers (a wedged loop does not)
                status, ctype, body = "200 OK", "text/plain", b"ok\n"
            elif route == b"/readyz":  # readiness: its NATS connection is up and its readers caught up
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
