"""A service told to stop while its log reader is busy stops.

Fault: SIGTERM (a cancelled task, for an asyncio service) arriving while
events stream in, i.e. while the reader's wake-up fires all the time. This is
what `corral scheduler`/`corral agent` see on every stop under load; found by
test_nats_restart.py, whose scheduler then hung until SIGKILL.
Check: a task consuming `Bus.tail()` under a steady append load ends within
PROMPT_S of being cancelled, 30 times in a row (a swallowed cancel never ends;
the bound leaves a loaded CI machine room for the consumer's delete request).
Invariant: Temporal's worker lifecycle rule in STYLE.md: shutdown is prompt
and never depends on luck. (Python 3.11's asyncio.wait_for swallows a cancel
that lands in the same loop iteration as the wake-up it waits for; the reader
used it until this test caught it.)
"""

from __future__ import annotations

import asyncio
import contextlib
import random

from events.bus import Bus
from events.server import NatsServer
from schemas import NodeCordoned

TRIALS = 30
PROMPT_S = 5.0


async def test_tail_consumer_stops_promptly_under_load(nats_server: NatsServer, bus: Bus) -> None:
    publisher = await Bus.connect(nats_server.url)
    stop = asyncio.Event()

    async def publish() -> None:
        i = 0
        while not stop.is_set():
            await publisher.append_many(
                [NodeCordoned(event_id=f"c{i}-{k}", occurred_at=0.0, node_id="n0") for k in range(5)])
            i += 1

    async def consume() -> None:
        async for _ in bus.tail():
            pass

    load = asyncio.create_task(publish())
    rng = random.Random(3)
    hung = 0
    try:
        for _ in range(TRIALS):
            task = asyncio.create_task(consume())
            await asyncio.sleep(rng.uniform(0.01, 0.08))
            task.cancel()
            done, _ = await asyncio.wait([task], timeout=PROMPT_S)
            if not done:
                hung += 1
                for _ in range(50):  # each further cancel may be swallowed the same way
                    task.cancel()
                    done, _ = await asyncio.wait([task], timeout=0.1)
                    if done:
                        break
                break
    finally:
        stop.set()
        await load
        await publisher.close()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(0)
    assert hung == 0, "a cancelled tail consumer kept running"
