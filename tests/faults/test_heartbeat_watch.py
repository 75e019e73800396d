"""The scheduler's heartbeat watch survives a nats-server restart, and does not resurrect the dead.

Fault: nats-server restarts (same data dir and port) while nodes heartbeat
into the KV bucket. A KV watch is an ephemeral consumer: the restart loses it
and the client is not told, so a monitor that keeps waiting on it hears
nothing more and fails every node one timeout later (seen in
test_nats_restart.py: NodeFailed for all three healthy nodes 10 s after the
restart, and every gang requeued).
Check: after the restart a beating node is never overdue; a node that stops
beating is overdue after the timeout, although each fresh watch replays its
last (old) heartbeat.
Invariant: NodeFailed only for a node that really went silent (the health
monitor's contract, which requeueing and so invariant 5 rest on).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import msgspec

from events.bus import Bus
from events.server import NatsServer
from orchestrator.scheduler.health import HeartbeatMonitor
from schemas.heartbeat import HEARTBEAT_BUCKET, Heartbeat

TIMEOUT_S = 3.0


async def beat(bus: Bus, node_id: str, stop: asyncio.Event) -> None:
    kv = await bus.kv(HEARTBEAT_BUCKET)
    while not stop.is_set():
        with contextlib.suppress(Exception):  # the server is away for a moment
            await kv.put(node_id, msgspec.json.encode(Heartbeat(node_id=node_id, incarnation="i1",
                                                                  sent_at=time.time())))
        await asyncio.sleep(0.3)


async def test_watch_survives_server_restart(nats_server: NatsServer, bus: Bus) -> None:
    monitor = HeartbeatMonitor(await bus.kv(HEARTBEAT_BUCKET), TIMEOUT_S)
    live, dead = asyncio.Event(), asyncio.Event()
    tasks = [asyncio.create_task(monitor.run()), asyncio.create_task(beat(bus, "alive", live)),
             asyncio.create_task(beat(bus, "dies", dead))]
    nodes = [("alive", "i1"), ("dies", "i1")]
    try:
        await asyncio.sleep(1.0)
        await asyncio.to_thread(nats_server.restart)
        dead.set()  # "dies" goes silent right after the restart
        overdue_seen: set[str] = set()
        for _ in range(int(2.5 * TIMEOUT_S / 0.25)):
            await asyncio.sleep(0.25)
            overdue = {node for node, _, _ in monitor.overdue(nodes)}
            assert "alive" not in overdue, "a node beating all along was judged silent after the restart"
            overdue_seen |= overdue
        assert overdue_seen == {"dies"}, "a silent node was kept alive by replayed heartbeats"
    finally:
        live.set()
        dead.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def test_a_rejoined_incarnation_gets_a_full_timeout_for_its_first_heartbeat() -> None:
    """Fault: a node's agent is killed and restarted; the log shows its new incarnation before the
    first heartbeat of it arrives. Check: the new incarnation is not overdue until a whole timeout
    after the monitor first saw it, though the node was silent far longer (seen as a second NodeFailed
    in test_agent_kill.py); the old incarnation's silence still counts."""
    now = [0.0]
    monitor = HeartbeatMonitor(kv=None, timeout_s=TIMEOUT_S, clock=lambda: now[0])  # type: ignore[arg-type]
    monitor.observe(msgspec.json.encode(Heartbeat(node_id="n1", incarnation="old", sent_at=0.0)))
    now[0] = 100.0  # the old agent died long ago
    assert [n for n, _, _ in monitor.overdue([("n1", "old")])] == ["n1"]
    assert monitor.overdue([("n1", "new")]) == []  # just re-registered: first asked now
    now[0] = 100.0 + TIMEOUT_S - 0.1
    assert monitor.overdue([("n1", "new")]) == []
    monitor.observe(msgspec.json.encode(Heartbeat(node_id="n1", incarnation="new", sent_at=now[0])))
    now[0] += TIMEOUT_S - 0.1
    assert monitor.overdue([("n1", "new")]) == []
    now[0] += 0.2
    assert [n for n, _, _ in monitor.overdue([("n1", "new")])] == ["n1"]
