"""A gang starts on GPUs as soon as the workers that held them have exited.

An exited worker stays tracked while the agent reports its exit and removes it
(a container's removal takes 50-200 ms), but it holds no GPU any more: the
next gang on those GPUs must not wait for that bookkeeping, nor for the
agent's next tick. Here removal is held until the next gang runs, so the test
cannot pass by waiting: it passes only if the start does not depend on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from events.bus import Bus
from events.follow import Follower
from events.sdk import Client
from nodeagent.runtime.base import Runtime, WorkerHandle
from nodeagent.runtime.simulated import SimulatedRuntime
from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import ClusterState
from schemas import JobSpec
from tests.integration.harness import agents, scheduler, wait_until


class HeldRemoval(SimulatedRuntime):
    """Simulated workers whose removal waits for `release` (a slow container removal, stretched)."""

    def __init__(self, release: asyncio.Event) -> None:
        super().__init__()
        self.release = release
        self.held = 0

    async def remove(self, handle: WorkerHandle) -> None:
        self.held += 1
        await self.release.wait()
        await super().remove(handle)


@pytest.fixture
async def follower(bus: Bus) -> AsyncIterator[Follower[ClusterState]]:
    f = Follower(bus, evolve, ClusterState())
    task = asyncio.create_task(f.follow())
    yield f
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_next_gang_starts_while_the_previous_gangs_workers_are_still_being_removed(
        bus: Bus, follower: Follower[ClusterState], tmp_path: Path) -> None:
    release = asyncio.Event()
    runtimes: list[HeldRemoval] = []

    def runtime(node_id: str, data_dir: Path) -> Runtime:
        runtimes.append(HeldRemoval(release))
        return runtimes[-1]

    try:
        async with scheduler(bus), agents(bus, 2, tmp_path, gpus=8, runtime=runtime):
            client = Client(bus)
            gang = JobSpec(name="g", ranks=2, gpus_per_rank=8, command=("sleep", "0.2"))
            await client.submit(gang, job_id="first")
            await client.submit(gang, job_id="second")
            await wait_until(follower, lambda s: s.jobs["first"].status == "completed", 30, "first to complete")
            await wait_until(follower, lambda s: s.jobs["second"].status in ("running", "completed"), 30,
                             "second to run while first's workers are still being removed")
            assert sum(r.held for r in runtimes) == 2, "both of first's workers are still in removal"
            assert follower.state.jobs["second"].placement == follower.state.jobs["first"].placement
            release.set()
            await wait_until(follower, lambda s: s.jobs["second"].status == "completed", 30, "second to complete")
    finally:
        release.set()
