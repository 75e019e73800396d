"""The scheduler service: the thin async shell around the pure core.

Loop, in words: load the newest snapshot, replay the log's tail into it, then
follow the live log. Every event is folded with the shared `evolve`; when the
state changed (or on a tick, for time-based rules) the leader runs `decide`
and appends what it returns. Its own decisions are *not* applied locally:
they take effect when they come back from the log, like everyone else's, and
the leader waits for them before deciding again, so it never decides twice
on a stale view. A standby follows the log too, so a takeover starts hot.

Fencing (DESIGN.md, "Safety by construction"). Everything the scheduler
appends carries its epoch, so a deposed leader's late appends are void in
every fold. An election is the next epoch or nothing (leader.py: `Elections`,
beside the lease). Heartbeat ages and grace periods are judgements of
time, and a process that was paused (SIGSTOP, a VM freeze, a long GC) cannot
trust them: it judges only while its lease is provably current by its own
monotonic clock (`Lease.current`), and after a stall it catches up with the
log, checks that it still leads and holds the lease, and gives every node a
full heartbeat timeout from then before it judges again.

One clock (#30). The fold's times are the stream's (when the server stored
each event), and decide's "now" is the stream time this scheduler can prove
(`Follower.clock`, events/streamclock.py), never its own wall clock: a leader
whose clock is minutes off, or that took over from one that was, neither
kills a job before its time limit nor preempts one inside its minimum runtime,
and a gang restart's backoff lasts what it says on every node.
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

from events import telemetry
from events.bus import Bus, BusError, append_reclaiming
from events.follow import Follower
from events.logsource import LogSource
from events.nodeviews import NodeViewStore
from events.restore import restore
from events.snapshots import SnapshotStore
from events.swallowed_cancel import stop_if_cancelled
from orchestrator.core.decide import decide
from orchestrator.core.evolve import evolve
from orchestrator.core.model.memo import Memo
from orchestrator.core.model.state import ClusterState
from orchestrator.core.node_view import node_view_of, view_facts
from orchestrator.core.orders import node_orders
from orchestrator.policies import Policies
from orchestrator.policies.named import policies_for
from orchestrator.scheduler import metrics
from orchestrator.scheduler.health import HeartbeatMonitor
from orchestrator.scheduler.leader import LEASE_BUCKET, Elections, Lease
from schemas import AnyEvent, ClusterConfigured, Event, NodeFailed, SchedulerElected, Unknown
from schemas.heartbeat import HEARTBEAT_BUCKET

log = structlog.get_logger("corral.scheduler")


def default_scheduler_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class SchedulerConfig:
    scheduler_id: str = field(default_factory=default_scheduler_id)
    tick_s: float = 1.0
    #: A snapshot after this many events, or after `snapshot_interval_s` when anything was folded since
    #: the last one: a restart (and every reader's start) costs a snapshot plus the tail after it.
    snapshot_every: int = 10_000
    snapshot_interval_s: float = 60.0
    lease_ttl_s: float = 5.0
    heartbeat_timeout_s: float = 40.0  # four agent beats (README, "Liveness")
    #: Appended once when the log has no cluster settings yet, so every replay decides alike.
    cluster: ClusterConfigured | None = None
    #: The named policy `decide` runs with (orchestrator/policies/named.py: the simulator's records, by the
    #: same names); each election this scheduler stores names it.
    policy: str = "corral"


#: Node views written per part of a flush (`_save_views`).
VIEWS_PER_PART = 256


class Scheduler:
    def __init__(self, bus: Bus, config: SchedulerConfig | None = None, *, history: LogSource | None = None) -> None:
        self.bus = bus
        self.config = config or SchedulerConfig()
        #: What it folds: the stream, or with `--archive` the archive and the stream as one (events/history.py),
        #: so a start with no usable snapshot reads what retention moved to the archive (events/restore.py).
        self.history: LogSource = history if history is not None else bus
        self.follower = Follower(self.history, self._fold, ClusterState(), stream_times=True)  # one clock (#30)
        cfg = self.config
        #: What `decide` runs with: the very record `corral sim --policy NAME` simulates (ValueError: unknown name).
        self.policies: Policies = policies_for(cfg.policy)
        self.elections = Elections(bus, self.follower, cfg.scheduler_id, cfg.lease_ttl_s, cfg.cluster, self._appended,
                                   cfg.policy)
        self._awaiting = 0  # our newest append's seq: decide only once the fold has reached it
        self._snapshot_seq = 0  # the log position of the newest snapshot saved or loaded
        self._snapshot_at = time.monotonic()  # when it was saved or loaded
        self._snapshots = SnapshotStore(bus.js, replicas=bus.replicas)
        #: Where agents start (events/nodeviews.py), written before each snapshot: the nodes whose view changed
        #: since this process last wrote it (`_views_written`: every node after a start).
        self._views = NodeViewStore(bus.js, replicas=bus.replicas)
        self._views_written: dict[str, tuple[object, ...]] = {}
        self._monitor: HeartbeatMonitor | None = None
        #: A stall was seen (or, leading, the lease could not be shown current) and no recovery
        #: followed yet: no judgement of time until `_recover` (module docstring).
        self._stalled = False
        #: A loop that wakes this much later than it asked counts as a stall of the process: the
        #: heartbeat ages it measured across it are too old by as much. (A stall long enough to matter
        #: to the lease shows in `Lease.current` whatever this says.)
        self._stall_s = max(0.5, self.config.heartbeat_timeout_s / 4)
        self.appended = 0
        self.decide_seconds: list[float] = []
        #: What decide keeps between cycles, for this scheduler's life (a new state object, say
        #: from a snapshot, only misses it once: see core/model/memo.py).
        self.memo = Memo()

    def _fold(self, state: ClusterState, event: AnyEvent | Unknown, seq: int, at: float | None = None) -> ClusterState:
        """`evolve`, naming every election the fold refuses (`Elections.fold`); folds exactly as `evolve` does."""
        if type(event) is not SchedulerElected:
            return evolve(state, event, seq, at)
        return self.elections.fold(state, event, seq, at)

    def cannot_lead(self) -> str:
        """Why this scheduler cannot lead ("" if it can): its own election failed in a way waiting for a
        lease does not cure. A readiness check (/readyz); cleared when the fold next accepts an election."""
        return self.elections.cannot_lead

    @property
    def epoch(self) -> int:
        """The epoch we campaign with (0: standing by); leading also needs the log to agree."""
        return self.elections.epoch

    @property
    def state(self) -> ClusterState:
        return self.follower.state

    @property
    def monitor(self) -> HeartbeatMonitor | None:
        """The heartbeat monitor, once `run` started it."""
        return self._monitor

    def heartbeat_ages(self) -> dict[str, float] | None:
        """Per live node, seconds since the monitor received its heartbeat (None before it runs)."""
        monitor = self._monitor
        if monitor is None:
            return None
        return monitor.silence((n.node_id, n.incarnation) for n in self.state.nodes.values() if not n.failed)

    @property
    def leading(self) -> bool:
        """We lead when the *log* says so: our SchedulerElected is the newest one folded."""
        return self.elections.leading

    def _appended(self, seqs: Sequence[int]) -> int:
        """Count what we stored; the seq decide waits for (our newest append) is returned."""
        self.appended += len(seqs)
        self._awaiting = max(self._awaiting, *seqs)
        return self._awaiting

    async def _append(self, events: Sequence[Event]) -> None:
        if events:
            seqs = await append_reclaiming(self.bus, events)
            self._appended(seqs)
            telemetry.EVENTS_APPENDED.labels("scheduler").inc(len(events))

    async def _restore(self) -> None:
        """The newest usable snapshot, then the log after it: `caught_up` says where and how long it took."""
        t0 = time.monotonic()
        loaded = await restore(self._snapshots, ClusterState, self.history, archive=self.history is not self.bus)
        start = 0  # (the fold goes on in the loaded state itself: its position now, not after the catch-up)
        if loaded is not None:
            self.follower.state = snap = loaded.state
            # What its fold skipped stays recorded in ours (None, not recorded, stays so: events/snapshots.py).
            skipped = loaded.header.skipped
            self.follower.skipped = None if skipped is None else set(skipped)
            self._snapshot_seq = start = snap.seq
            self._snapshot_at = time.monotonic()
            log.info("snapshot_loaded", seq=snap.seq)
        await self.follower.catch_up()
        log.info("caught_up", seq=self.state.seq, from_snapshot=start,
                 seconds=round(time.monotonic() - t0, 3), jobs=len(self.state.jobs), nodes=len(self.state.nodes))

    def _snapshot_due(self) -> bool:
        """N events since the last snapshot, or any after `snapshot_interval_s`: the tail a restart reads stays short."""
        behind = self.state.seq - self._snapshot_seq
        return behind >= self.config.snapshot_every or (
            behind > 0 and time.monotonic() - self._snapshot_at >= self.config.snapshot_interval_s)

    async def _snapshot_loop(self) -> None:
        failures = 0
        while True:
            stop_if_cancelled()
            await asyncio.sleep(1.0)
            seq = self.state.seq
            if self._snapshot_due():
                try:
                    await self._save_views()
                    size = await self._snapshots.save(self.state, self.follower.skipped)
                except (BusError, nats.errors.Error, OSError, TimeoutError) as e:
                    # The server is away or busy (restart, partition, load): a snapshot only shortens the next
                    # start's replay, so try again later rather than stop scheduling -- backing off, so a busy
                    # server is not handed the same writes every second.
                    failures += 1
                    log.warning("snapshot_failed", seq=seq, error=repr(e), retry_in_s=min(2 ** failures, 60))
                    await asyncio.sleep(min(2 ** failures, 60))
                    continue
                failures = 0
                self._snapshot_seq, self._snapshot_at = seq, time.monotonic()
                log.info("snapshot_saved", seq=seq, bytes=size)

    async def _save_views(self) -> None:
        """Store the view of every node whose view changed since we last stored it, then the base record
        (events/nodeviews.py): all at one position, before the snapshot that lets retention cut behind it."""
        state = self.state
        seq = state.seq
        changed = []
        for node_id in dict.fromkeys([*state.nodes, *state.slices]):
            facts = view_facts(state, node_id)
            if self._views_written.get(node_id) != facts:
                changed.append((node_id, node_view_of(state, node_id), facts))
        # In parts, each remembered once written: a flush of thousands of views that times out part way (a busy
        # server) goes on from there next round instead of writing them all again, and again. `_base` last.
        written = 0
        for k in range(0, len(changed), VIEWS_PER_PART):
            part = changed[k:k + VIEWS_PER_PART]
            written += await self._views.save(((n, v) for n, v, _ in part), seq, None)
            for node_id, _, facts in part:
                self._views_written[node_id] = facts
        await self._views.save((), seq, node_view_of(state, ""))
        if written:
            log.info("node_views_saved", seq=seq, views=written)

    def _may_judge(self) -> bool:
        """Whether we may decide now: we lead in the log, our lease is provably current, no stall is pending."""
        lease = self.elections.lease
        assert lease is not None
        return self.leading and lease.current() and not self._stalled

    async def _decide_loop(self) -> None:
        while True:
            stop_if_cancelled()
            await self.follower.wait_changed(self.config.tick_s)
            self.follower.changed.clear()
            now = self.follower.clock.now()
            if not self._may_judge() or self.state.seq < self._awaiting or now is None:
                continue
            t0 = time.perf_counter()
            events = decide(self.state, now, epoch=self.epoch, policies=self.policies, memo=self.memo)
            # What the decisions already folded mean for each node (core/orders.py): its part of a gang, a
            # stop, a release. Never this cycle's own decisions: those are not in the fold yet.
            events += node_orders(self.state, now=now, epoch=self.epoch)
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
        """Fail nodes whose heartbeats stopped, judging only what a stall cannot have distorted.

        Ages are measured on our monotonic clock, which runs on while the process is paused,
        while the beats sent meanwhile wait unread: a resumed leader sees every node silent. So
        a round that woke far later than it slept, or finds the lease not provably current,
        stops judging until `_recover` has run.
        """
        monitor = self._monitor
        lease = self.elections.lease
        assert monitor is not None and lease is not None
        period = min(1.0, monitor.timeout_s / 4)
        while True:
            stop_if_cancelled()
            slept_at = time.monotonic()
            await asyncio.sleep(period)
            late = time.monotonic() - slept_at - period
            if late > self._stall_s:
                self._stalled = True
                log.warning("stalled", late_s=round(late, 2), leading=self.leading)
            if not self.leading:
                continue
            if not lease.current():
                if not self._stalled:
                    log.warning("stalled", reason="lease not provably current")
                self._stalled = True
                continue
            if self._stalled:
                await self._recover()
                continue
            live = [(n.node_id, n.incarnation) for n in self.state.nodes.values() if not n.failed]
            now = time.time()
            # The id names the node records' revision judged on: the same silence judged again (a
            # retry, a round before the first is folded) dedupes, while a node that recovered and
            # went silent again gets a new NodeFailed (one id per incarnation deduped it away).
            # The epoch too: a deposed leader's void NodeFailed must not dedupe a later leader's away.
            rev = self.state.nodes_rev
            failed = [
                NodeFailed(event_id=f"nodefailed:{node_id}:{inc}:{rev}:{self.epoch}", occurred_at=now,
                           node_id=node_id, incarnation=inc, reason=f"no heartbeat for {silent:.0f}s", epoch=self.epoch)
                for node_id, inc, silent in monitor.overdue(live)
            ]
            if failed:
                log.warning("nodes_failed", nodes=[e.node_id for e in failed])
                try:
                    await self._append(failed)
                except BusError as e:
                    log.error("append_failed", what="NodeFailed", error=str(e))  # still overdue next round

    async def _recover(self) -> None:
        """After a stall: catch up with the log, check we still lead and hold the lease, restart the ages.

        Until all three hold we stay stalled (the next round tries again): a leader deposed while it
        was paused learns it from the log, and a node that beat all along is not failed for our pause.
        """
        lease = self.elections.lease
        assert self._monitor is not None and lease is not None
        try:
            await self.follower.catch_up()
        except (BusError, nats.errors.Error, TimeoutError) as e:
            log.warning("catch_up_failed", error=str(e) or repr(e))
            return
        if self.leading and lease.current():
            self._monitor.restart_ages()
            self._stalled = False
            log.info("judging_again", epoch=self.epoch, seq=self.state.seq)
            self.follower.changed.set()  # decide may have skipped rounds meanwhile

    async def run(self) -> None:
        """Run until cancelled; the first fatal error propagates."""
        log.info("starting", scheduler_id=self.config.scheduler_id, policy=self.config.policy)
        try:
            await self.bus.setup.ensure_consumer_room()  # a consumer per agent (#40): a stream made before it had 1,000
            await self._restore()
            lease_kv = await self.bus.kv(LEASE_BUCKET, ttl=self.config.lease_ttl_s)
            hb_kv = await self.bus.kv(HEARTBEAT_BUCKET)
            self.elections.lease = Lease(lease_kv, self.config.scheduler_id, self.config.lease_ttl_s)
            self._monitor = HeartbeatMonitor(hb_kv, self.config.heartbeat_timeout_s)
            stop_if_cancelled()  # a SIGTERM one of the start-up's nats waits swallowed: the loops below never saw it
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self.follower.follow())
                tg.create_task(self._monitor.run())
                tg.create_task(self.elections.campaign())
                tg.create_task(self._decide_loop())
                tg.create_task(self._health_loop())
                tg.create_task(self._snapshot_loop())
        finally:
            await asyncio.shield(self._leave())

    async def _leave(self) -> None:
        """A stop at any point -- a long catch-up included -- leaves a snapshot of what was folded (the next
        start replays less) and frees the lease at once instead of after its TTL."""
        if self.state.seq > self._snapshot_seq:
            try:
                await self._save_views()
                size = await self._snapshots.save(self.state, self.follower.skipped)
            except Exception as e:  # only the next start's replay is longer
                log.warning("snapshot_failed", seq=self.state.seq, error=repr(e))
            else:
                log.info("snapshot_saved", seq=self.state.seq, bytes=size)
        if self.elections.lease is not None:
            with contextlib.suppress(Exception):
                await self.elections.lease.release()
