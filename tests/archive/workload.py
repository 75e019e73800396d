"""The fault and history tests' log: small events appended to a real stream, snapshots, an archived head."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from events.bus import Bus
from events.follow import Follower
from events.snapshots import SnapshotStore
from orchestrator.archiver import Archiver, ArchiverConfig
from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import ClusterState
from schemas import NodeCordoned


def cordon(i: int) -> NodeCordoned:
    return NodeCordoned(event_id=f"c{i}", occurred_at=float(i), node_id=f"n{i % 97}", reason=f"fault test {i}")


async def append(bus: Bus, start: int, n: int) -> None:
    await bus.append_many([cordon(i) for i in range(start, start + n)])


@contextlib.asynccontextmanager
async def appending(bus: Bus, start: int, every: float = 0.05, n: int = 10) -> AsyncIterator[list[int]]:
    """Append `n` events every `every` seconds while inside; yields [the next event number].

    Stopped between two batches, never inside one: a batch cancelled after its events were stored but before
    it was counted left the stream holding more than `nxt` said (seen in CI under load)."""
    nxt = [start]
    stop = asyncio.Event()

    async def run() -> None:
        while not stop.is_set():
            await append(bus, nxt[0], n)
            nxt[0] += n
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(every):
                    await stop.wait()

    task = asyncio.create_task(run())
    try:
        yield nxt
    finally:
        stop.set()
        try:
            async with asyncio.timeout(30):
                await asyncio.shield(task)
        except TimeoutError:  # a batch that cannot finish (the server is away): counted as it stands
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def snapshot_at_end(bus: Bus) -> int:
    """A real scheduler snapshot (the fold of the whole log) at the log's end, the only one kept: retention's
    lower bound (the oldest kept snapshot, orchestrator/archiver.py). Like the scheduler, from the newest
    snapshot: the stream may no longer start at 1."""
    store = SnapshotStore(bus.js, keep=1)
    follower = Follower(bus, evolve, await store.load(ClusterState) or ClusterState())
    await follower.catch_up()
    await store.save(follower.state)
    return follower.state.seq


async def first_seq(bus: Bus) -> int:
    return int((await bus.js.stream_info("CORRAL")).state.first_seq)


async def archived_and_purged(url: str, path: Path) -> None:
    """200 events, a snapshot at their end, archived in segments of 50 and purged from the stream."""
    bus = await Bus.connect(url)
    try:
        await append(bus, 0, 200)
        await snapshot_at_end(bus)
        task = asyncio.create_task(Archiver(bus, ArchiverConfig(path, segment_events=50, segment_seconds=0.2,
                                                                max_bytes=1, purge_every_s=0.1)).run())
        try:
            async with asyncio.timeout(30):
                while await first_seq(bus) <= 200:
                    assert not task.done(), task
                    await asyncio.sleep(0.05)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    finally:
        await bus.close()
