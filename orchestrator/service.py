"""The scheduler service: the thin async shell around the pure core.

Loop, in words: load the newest snapshot, replay the log's tail into it, then
follow the live log. Every event is folded with the shared `evolve`; when the
state changed (or on a tick, for time-based rules) the leader runs `decide`
and appends what it returns. Its own decisions are *not* applied locally:
they take effect when they come back from the log, like everyone else's, and
the leader waits for them before deciding again, so it never decides twice
on a stale view. A standby follows the log too, so a takeover starts hot.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import nats.errors
import structlog

from events.bus import Bus, BusError, append_reclaiming
from events.cancel import stop_if_cancelled
from orchestrator import metrics
from orchestrator.core.decide import decide
from orchestrator.core.state import ClusterState, Config
from orchestrator.follow import Follower
from orchestrator.health import HeartbeatMonitor
from orchestrator.leader import LEASE_BUCKET, Lease
from orchestrator.snapshot import SnapshotStore
from schemas import ClusterConfigured, Event, NodeFailed, SchedulerElected
from schemas.heartbeat import HEARTBEAT_BUCKET

log = structlog.get_logger("corral.scheduler")


def default_scheduler_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class SchedulerConfig:
    scheduler_id: str = field(default_factory=default_scheduler_id)
    tick_s: float = 1.0
    snapshot_every: int = 10_000
    lease_ttl_s: float = 5.0
    heartbeat_timeout_s: float = 10.0
    #: Appended once when the log has no cluster settings yet, so every replay decides alike.
    cluster: ClusterConfigured | None = None


class Scheduler:
    def __init__(self, bus: Bus, config: SchedulerConfig | None = None) -> None:
        self.bus = bus
        self.config = config or SchedulerConfig()
        self.follower = Follower(bus)
        self.epoch = 0  # the epoch we campaign with; leading also needs the log to agree
        self._awaiting = 0  # our newest append's seq: decide only once the fold has reached it
        self._snapshot_seq = 0  # the log position of the newest snapshot saved or loaded
        self._snapshots = SnapshotStore(bus.js, replicas=bus.replicas)
        self._monitor: HeartbeatMonitor | None = None
        self._lease: Lease | None = None
        self.appended = 0
        self.decide_seconds: list[float] = []

    @property
    def state(self) -> ClusterState:
        return self.follower.state

    @property
    def monitor(self) -> HeartbeatMonitor | None:
        """The heartbeat monitor, once `run` started it."""
        return self._monitor

    @property
    def leading(self) -> bool:
        """We lead when the *log* says so: our SchedulerElected is the newest one folded."""
        s = self.state
        return self.epoch > 0 and s.epoch == self.epoch and s.scheduler_id == self.config.scheduler_id

    async def _append(self, events: Sequence[Event]) -> None:
        if events:
            seqs = await append_reclaiming(self.bus, events)
            self.appended += len(events)
            metrics.EVENTS_APPENDED.labels("scheduler").inc(len(events))
            self._awaiting = max(self._awaiting, *seqs)

    async def _restore(self) -> None:
        snap = await self._snapshots.load(ClusterState)
        if snap is not None:
            self.follower.state = snap
            self._snapshot_seq = snap.seq
            log.info("snapshot_loaded", seq=snap.seq)
        await self.follower.catch_up()
        log.info("caught_up", seq=self.state.seq, jobs=len(self.state.jobs), nodes=len(self.state.nodes))

    async def _snapshot_loop(self) -> None:
        while True:
            stop_if_cancelled()
            await asyncio.sleep(1.0)
            seq = self.state.seq
            if seq - self._snapshot_seq >= self.config.snapshot_every:
                try:
                    size = await self._snapshots.save(self.state)
                except (BusError, nats.errors.Error, OSError, TimeoutError) as e:
                    # The server is away (restart, partition): a snapshot only shortens the next
                    # start's replay, so try again next round rather than stop scheduling.
                    log.warning("snapshot_failed", seq=seq, error=repr(e))
                    continue
                self._snapshot_seq = seq
                log.info("snapshot_saved", seq=seq, bytes=size)

    async def _campaign(self) -> None:
        assert self._lease is not None
        while True:
            stop_if_cancelled()
            if self._lease.held:
                if not await self._lease.renew(self.epoch):
                    log.warning("standing_by", reason="lease lost")
                    self.epoch = 0
                elif self.state.epoch > self.epoch:
                    log.warning("standing_by", reason="newer epoch in the log", epoch=self.state.epoch)
                    self.epoch = 0
                    await self._lease.release()
            elif await self._lease.try_acquire(self.state.epoch + 1):
                await self._elect()
            await asyncio.sleep(self.config.lease_ttl_s / 3)

    async def _elect(self) -> None:
        self.epoch = self.state.epoch + 1
        sid = self.config.scheduler_id
        # Settings first, in the same append: the first decision must already see them.
        cfg = self.config.cluster
        first = [cfg] if cfg is not None and self.state.config == Config() else []
        try:
            await self._append([*first, SchedulerElected(event_id=f"elect:{self.epoch}:{sid}",
                                                         occurred_at=time.time(), epoch=self.epoch, scheduler_id=sid)])
        except BusError as e:
            # Not elected until the log says so: give the lease back and campaign again later.
            log.error("append_failed", what="election", error=str(e))
            self.epoch = 0
            assert self._lease is not None
            await self._lease.release()
            return
        await self.follower.wait_for_seq(self._awaiting)
        if self.leading:
            log.info("leading", epoch=self.epoch)
        self.follower.changed.set()

    async def _decide_loop(self) -> None:
        while True:
            stop_if_cancelled()
            await self.follower.wait_changed(self.config.tick_s)
            self.follower.changed.clear()
            if not self.leading or self.state.seq < self._awaiting:
                continue
            t0 = time.perf_counter()
            events = decide(self.state, time.time(), epoch=self.epoch)
            elapsed = time.perf_counter() - t0
            self.decide_seconds.append(elapsed)
            metrics.DECIDE_SECONDS.observe(elapsed)
            if len(self.decide_seconds) > 10_000:
                del self.decide_seconds[:5_000]
            try:
                await self._append(events)
            except BusError as e:
                # The log refused them (full stream, out of reach): nothing was decided. The next
                # cycle decides the same again, with the same event ids, so nothing is doubled.
                log.error("append_failed", what="decisions", events=len(events), error=str(e))

    async def _health_loop(self) -> None:
        monitor = self._monitor
        assert monitor is not None
        while True:
            stop_if_cancelled()
            await asyncio.sleep(min(1.0, monitor.timeout_s / 4))
            if not self.leading:
                continue
            live = [(n.node_id, n.incarnation) for n in self.state.nodes.values() if not n.failed]
            now = time.time()
            # The id names the node records' revision judged on: the same silence judged again (a
            # retry, a round before the first is folded) dedupes, while a node that recovered and
            # went silent again gets a new NodeFailed (one id per incarnation deduped it away).
            rev = self.state.nodes_rev
            failed = [
                NodeFailed(event_id=f"nodefailed:{node_id}:{inc}:{rev}", occurred_at=now, node_id=node_id,
                           incarnation=inc, reason=f"no heartbeat for {silent:.0f}s")
                for node_id, inc, silent in monitor.overdue(live)
            ]
            if failed:
                log.warning("nodes_failed", nodes=[e.node_id for e in failed])
                try:
                    await self._append(failed)
                except BusError as e:
                    log.error("append_failed", what="NodeFailed", error=str(e))  # still overdue next round

    async def run(self) -> None:
        """Run until cancelled; the first fatal error propagates."""
        await self._restore()
        lease_kv = await self.bus.kv(LEASE_BUCKET, ttl=self.config.lease_ttl_s)
        hb_kv = await self.bus.kv(HEARTBEAT_BUCKET)
        self._lease = Lease(lease_kv, self.config.scheduler_id)
        self._monitor = HeartbeatMonitor(hb_kv, self.config.heartbeat_timeout_s)
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self.follower.follow())
                tg.create_task(self._monitor.run())
                tg.create_task(self._campaign())
                tg.create_task(self._decide_loop())
                tg.create_task(self._health_loop())
                tg.create_task(self._snapshot_loop())
        finally:
            # A clean stop leaves a fresh snapshot (the next start replays less) and frees the lease
            # at once instead of after its TTL.
            with contextlib.suppress(Exception):
                await asyncio.shield(self._snapshots.save(self.state))
            with contextlib.suppress(Exception):
                await asyncio.shield(self._lease.release())
