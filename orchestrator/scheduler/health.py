"""Dead-node detection from heartbeats in a KV bucket.

Age is measured on the monitor's own monotonic clock from when it *received*
each heartbeat, so clock skew between machines cannot fail a healthy node.
A node the monitor has not heard from since it started gets one full timeout
of grace from the monitor's start (a freshly elected scheduler must not fail
every node before their next beat arrives), and so does every node after
`restart_ages` (the scheduler calls it after a stall of its own process: the
beats that came meanwhile wait unread, so the ages it measured say nothing).

The watch itself is an ephemeral JetStream consumer, which a nats-server
restart loses without telling the client: the iterator just goes quiet, and a
quiet monitor fails every node one timeout later. So `run` starts a fresh
watch whenever nothing arrived for a third of the timeout. A fresh watch
replays the newest value of every key; revisions already seen are skipped, so
a dead node's last heartbeat never counts as a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable

import msgspec
import nats.errors
import structlog
from nats.js.kv import KeyValue

from events.swallowed_cancel import stop_if_cancelled
from schemas.heartbeat import Heartbeat

log = structlog.get_logger("corral.health")

_decode = msgspec.json.Decoder(Heartbeat).decode


class HeartbeatMonitor:
    def __init__(self, kv: KeyValue, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._kv = kv
        self.timeout_s = timeout_s
        self._clock = clock
        #: node_id -> (incarnation, receive time)
        self._seen: dict[str, tuple[str, float]] = {}
        #: KV key -> newest revision observed (a re-created watch replays old ones)
        self._revisions: dict[str, int] = {}
        #: (node_id, incarnation) not heard from yet -> when `silence` was first asked about it
        self._waiting: dict[tuple[str, str], float] = {}

    def observe(self, raw: bytes, key: str = "", revision: int | None = None) -> None:
        if revision is not None:
            if revision <= self._revisions.get(key, 0):
                return  # replayed by a fresh watch: not a new beat
            self._revisions[key] = revision
        try:
            hb = _decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            log.warning("heartbeat_malformed", error=str(e))
            return
        self._seen[hb.node_id] = (hb.incarnation, self._clock())

    async def run(self) -> None:
        """Follow the bucket until cancelled, re-creating the watch whenever it goes quiet."""
        quiet_s = max(0.5, self.timeout_s / 3)
        while True:
            stop_if_cancelled()
            try:
                watcher = await self._kv.watchall()
            except (nats.errors.Error, TimeoutError) as e:
                log.info("heartbeat_watch_retry", error=repr(e))
                await asyncio.sleep(quiet_s / 2)
                continue
            try:
                while True:
                    stop_if_cancelled()
                    # Not watcher.updates(timeout): it waits with wait_for (events/swallowed_cancel.py).
                    try:
                        async with asyncio.timeout(quiet_s):
                            entry = await anext(watcher)
                    except (TimeoutError, StopAsyncIteration):
                        break  # quiet: maybe lost with a server restart; a new watch costs one consumer
                    if entry is not None and entry.value:
                        self.observe(entry.value, entry.key, entry.revision)
            finally:
                with contextlib.suppress(Exception):
                    await watcher.stop()

    def restart_ages(self) -> None:
        """Count every node's silence from now, as if each had just beaten: one full timeout of grace.

        For a monitor whose process stalled (SIGSTOP, a VM freeze): its clock ran on while the
        beats sent meanwhile waited unread, so every age it holds is too old. A node that is
        really dead is failed one timeout later than it could have been; none is failed for the stall.
        """
        now = self._clock()
        self._seen = {node_id: (incarnation, now) for node_id, (incarnation, _) in self._seen.items()}
        self._waiting.clear()

    def silence(self, live_nodes: Iterable[tuple[str, str]]) -> dict[str, float]:
        """Seconds each live (node_id, incarnation) has been silent, on the monitor's clock.

        A heartbeat from an older incarnation does not count for a newer one; one
        not heard from yet counts from when it was first asked about. Counting a
        node that re-registered from the monitor's start failed it the moment the
        log showed its new incarnation, before its first heartbeat could arrive
        (seen in test_agent_kill.py).
        """
        now = self._clock()
        out = {}
        for node_id, incarnation in live_nodes:
            seen = self._seen.get(node_id)
            if seen and seen[0] == incarnation:
                self._waiting.pop((node_id, incarnation), None)
                out[node_id] = now - seen[1]
            else:
                out[node_id] = now - self._waiting.setdefault((node_id, incarnation), now)
        return out

    def overdue(self, live_nodes: Iterable[tuple[str, str]]) -> list[tuple[str, str, float]]:
        """(node_id, incarnation, silent_for_s) of live nodes past the timeout."""
        live = list(live_nodes)
        silent = self.silence(live)
        return [(nid, inc, silent[nid]) for nid, inc in live if silent[nid] > self.timeout_s]

