"""The agent side of liveness: one KV key per node, refreshed every interval."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import msgspec
import structlog
from nats.js.kv import KeyValue

from events.swallowed_cancel import stop_if_cancelled
from schemas.heartbeat import Heartbeat

log = structlog.get_logger("corral.agent")
_encoder = msgspec.json.Encoder()


async def publish_heartbeats(
    kv: KeyValue, node_id: str, incarnation: str, interval_s: float, workers: Callable[[], int] = lambda: 0
) -> None:
    """Put a heartbeat every `interval_s` until cancelled; a failed put is simply retried next beat."""
    while True:
        stop_if_cancelled()
        await put_heartbeat(kv, node_id, incarnation, workers())
        await asyncio.sleep(interval_s)


async def put_heartbeat(kv: KeyValue, node_id: str, incarnation: str, workers: int = 0) -> bool:
    """One heartbeat now; False (and a warning) if the put failed."""
    hb = Heartbeat(node_id=node_id, incarnation=incarnation, sent_at=time.time(), workers=workers)
    try:
        await kv.put(node_id, _encoder.encode(hb))
    except Exception as e:
        log.warning("heartbeat_put_failed", node_id=node_id, error=str(e))
        return False
    return True
