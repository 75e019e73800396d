"""Many node agents in one process: `corral agent-host` and `corral up` (issue #40).

Each is a real `Agent` with its own filtered consumer of its node's slice
(events/subjects.py: `slice_filters`), so what the server delivers is what a
cluster of separate machines costs it: every event goes to the nodes it
concerns, never to all of them. What the agents of one process share is the
TCP connection, `per_connection` agents to one: a single connection for a
thousand agents would carry every heartbeat and delivery through one socket
buffer, and one slow read there marks the whole process a slow consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager

from events.bus import Bus
from nodeagent.agent import Agent

#: Agents to one NATS connection (corral agent-host --per-connection).
PER_CONNECTION = 64


@contextlib.asynccontextmanager
async def connection(url: str, name: str) -> AsyncIterator[Bus]:
    """A plain connection to an unsecured server (`corral up`'s own), closed on exit."""
    bus = await Bus.connect(url, name=name)
    try:
        yield bus
    finally:
        await bus.close()


async def connect_agents(stack: contextlib.AsyncExitStack, connect: Callable[[int], AbstractAsyncContextManager[Bus]],
                         count: int, make: Callable[[Bus, int], Agent], *,
                         per_connection: int = PER_CONNECTION) -> list[Agent]:
    """`count` agents, `make(bus, i)` for i in 0..count-1, over connection k = i // per_connection
    (`connect(k)`, entered on `stack`: they close with it)."""
    if per_connection < 1:
        raise ValueError(f"per_connection is 1 or more, got {per_connection}")
    agents: list[Agent] = []
    for k, first in enumerate(range(0, count, per_connection)):
        bus = await stack.enter_async_context(connect(k))
        agents += [make(bus, i) for i in range(first, min(count, first + per_connection))]
    return agents


#: Seconds between two agents' starts: a host of a thousand nodes does not send a thousand catch-ups' worth of
#: JetStream API requests (consumers, stream info, its node view) in the same instant.
START_GAP_S = 0.005


async def run_agents(agents: Sequence[Agent], *, start_gap_s: float = START_GAP_S) -> None:
    """Run them all until cancelled, started `start_gap_s` apart; the first that fails stops the others (a host
    is one failure domain)."""
    async with asyncio.TaskGroup() as tg:
        for i, agent in enumerate(agents):
            if i and start_gap_s:
                await asyncio.sleep(start_gap_s)
            tg.create_task(agent.run())
