"""The scheduler's orders stage, for agent tests that move the log by hand (no scheduler runs).

An agent reads only its node's slice (#40): a JobFailed or a GangRestarted a test appends reaches it as the
order the scheduler would send (WorkChanged release, WorkAssigned of the next attempt). `relay(bus)` folds
the whole log as the scheduler does and appends what orders its nodes lack, after every change; its
`state` is the cluster as the scheduler sees it, for the tests' questions about jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from events.bus import Bus
from events.follow import Follower
from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import ClusterState
from orchestrator.core.orders import node_orders


class Relay:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.follower = Follower(bus, evolve, ClusterState(), stream_times=True)

    @property
    def state(self) -> ClusterState:
        return self.follower.state

    async def run(self) -> None:
        await self.follower.catch_up()
        follow = asyncio.create_task(self.follower.follow())
        try:
            while True:
                orders = node_orders(self.state, now=time.time(), epoch=self.state.epoch)
                if orders:
                    seqs = await self.bus.append_many(orders)
                    await self.follower.wait_for_seq(max(seqs))
                    continue
                await self.follower.wait_changed(0.2)
                self.follower.changed.clear()
        finally:
            follow.cancel()
            await asyncio.gather(follow, return_exceptions=True)


@contextlib.asynccontextmanager
async def relay(bus: Bus) -> AsyncIterator[Relay]:
    r = Relay(bus)
    task = asyncio.create_task(r.run())
    try:
        yield r
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
