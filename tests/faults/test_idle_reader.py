"""A reader of a quiet log keeps its consumer: silence is not a fault.

Fault: nothing is appended for longer than the reader's watchdog (three idle
heartbeats, 6 s): the normal state of a small cluster at night.
Check: a `Bus.tail()` over an idle stream keeps one and the same consumer for
8 s (the server's idle heartbeats prove it is alive), and still gets the next
event.
Invariant: the bus docstring's "silence for three heartbeats means the
consumer or the connection is gone" must only fire on a real loss; otherwise
every idle service re-creates its consumer every 6 s (churn on the server,
an info log line per service every 6 s), and a real loss is indistinguishable
from quiet.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator

from events.bus import Bus
from events.server import NatsServer
from schemas import NodeCordoned


@contextlib.asynccontextmanager
async def tailing(bus: Bus) -> AsyncIterator[list[int]]:
    """A `tail(from_seq=1)` running in a task over a log of one event; the seqs it got (once it has that one)."""
    await bus.append(NodeCordoned(event_id="first", occurred_at=0.0, node_id="n0"))
    got: list[int] = []

    async def consume() -> None:
        async for env in bus.tail(from_seq=1):
            got.append(env.seq)

    task = asyncio.create_task(consume())
    try:
        while not got:
            await asyncio.sleep(0.05)
        yield got
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def append_second(bus: Bus, got: list[int], timeout: float) -> None:
    """Append the next event and wait until the tail has it."""
    await bus.append(NodeCordoned(event_id="second", occurred_at=0.0, node_id="n0"))
    async with asyncio.timeout(timeout):
        while len(got) < 2:
            await asyncio.sleep(0.05)


async def consumers(bus: Bus) -> list[str]:
    return [info.name for info in await bus.js.consumers_info(bus.stream)]


async def test_idle_tail_keeps_its_consumer(bus: Bus) -> None:
    async with tailing(bus) as got:
        before = await consumers(bus)
        await asyncio.sleep(8.0)
        after = await consumers(bus)
        await append_second(bus, got, 5)
    assert got == [1, 2]
    assert len(before) == 1 and after == before, f"the idle reader's consumer was replaced: {before} -> {after}"


async def test_a_silent_server_is_still_a_loss(nats_server: NatsServer, bus: Bus) -> None:
    """Fault: nats-server is frozen (SIGSTOP) for 16 s: the connection stays open, nothing arrives,
    not even heartbeats. Check: the watchdog fires twice (the first time the reader asks the same consumer
    again, the second it gives it up), the reader makes a new consumer once the server is back, and gets
    the next event (heartbeats count as life only while they come)."""
    assert nats_server.pid is not None
    async with tailing(bus) as got:
        before = set(await consumers(bus))
        os.kill(nats_server.pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(16.0)
        finally:
            os.kill(nats_server.pid, signal.SIGCONT)
        await append_second(bus, got, 15)
        after = set(await consumers(bus))
    assert got == [1, 2]
    assert after - before, f"the reader kept its consumer through 8 s of silence: {before} -> {after}"
