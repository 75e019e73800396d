"""Dead-node detection from heartbeats in a KV bucket.

Age is measured on the monitor's own monotonic clock from when it *received*
each heartbeat, so clock skew between machines cannot fail a healthy node.
A node the monitor has not heard from since it started gets one full timeout
of grace from the monitor's start (a freshly elected scheduler must not fail
every node before their next beat arrives).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import msgspec
import structlog
from nats.js.kv import KeyValue

from schemas.heartbeat import Heartbeat

log = structlog.get_logger("corral.health")

_decode = msgspec.json.Decoder(Heartbeat).decode


class HeartbeatMonitor:
    def __init__(self, kv: KeyValue, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._kv = kv
        self.timeout_s = timeout_s
        self._clock = clock
        self._started = clock()
        #: node_id -> (incarnation, receive time)
        self._seen: dict[str, tuple[str, float]] = {}

    def observe(self, raw: bytes) -> None:
        try:
            hb = _decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            log.warning("heartbeat_malformed", error=str(e))
            return
        self._seen[hb.node_id] = (hb.incarnation, self._clock())

    async def run(self) -> None:
        """Follow the bucket until cancelled."""
        watcher = await self._kv.watchall()
        try:
            async for entry in watcher:
                if entry is not None and entry.value:
                    self.observe(entry.value)
        finally:
            await watcher.stop()

    def overdue(self, live_nodes: Iterable[tuple[str, str]]) -> list[tuple[str, str, float]]:
        """(node_id, incarnation, silent_for_s) of live nodes past the timeout.

        A heartbeat from an older incarnation does not count for a newer one.
        """
        now = self._clock()
        out = []
        for node_id, incarnation in live_nodes:
            seen = self._seen.get(node_id)
            last = seen[1] if seen and seen[0] == incarnation else self._started
            silent = now - last
            if silent > self.timeout_s:
                out.append((node_id, incarnation, silent))
        return out

