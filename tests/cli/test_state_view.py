"""The CLI's state: the log folded here, from the scheduler's snapshot when it is not past the position asked."""

from __future__ import annotations

import asyncio

import pytest
from nats.js.errors import BucketNotFoundError

from events.bus import Bus
from events.snapshots import SNAPSHOT_BUCKET, SnapshotStore
from orchestrator.cli.state_view import envelope_at, load_state, seq_at_time
from orchestrator.core.evolve import fold
from orchestrator.core.state import snapshot
from tests.cli.test_top import EVENTS


async def test_fold_without_snapshot_and_no_bucket_created(bus: Bus) -> None:
    assert snapshot(await load_state(bus)) == snapshot(fold([]))
    await bus.append_many(EVENTS)
    assert snapshot(await load_state(bus)) == snapshot(fold(EVENTS))
    assert snapshot(await load_state(bus, to_seq=5)) == snapshot(fold(EVENTS[:5]))
    with pytest.raises(BucketNotFoundError):
        await bus.js.object_store(SNAPSHOT_BUCKET)  # a reader never creates it


async def test_snapshot_used_only_when_not_past_the_position(bus: Bus) -> None:
    await bus.append_many(EVENTS)
    k = 10
    marked = fold(EVENTS[:k])
    marked.voids = 999  # a mark only the snapshot carries: shows whether it was used
    await SnapshotStore(bus.js).save(marked)

    end = await load_state(bus)
    assert end.voids == 999 and end.seq == len(EVENTS)
    end.voids = 0
    assert snapshot(end) == snapshot(fold(EVENTS))
    assert (await load_state(bus, to_seq=k)).voids == 999
    before = await load_state(bus, to_seq=k - 1)
    assert before.voids == 0 and snapshot(before) == snapshot(fold(EVENTS[:k - 1]))
    assert (await load_state(bus, use_snapshot=False)).voids == 0


async def test_seq_at_time(bus: Bus) -> None:
    first = await bus.append_many(EVENTS[:3])
    await asyncio.sleep(0.05)
    rest = await bus.append_many(EVENTS[3:6])
    t1 = (await envelope_at(bus, first[-1])).stream_time  # type: ignore[union-attr]
    t2 = (await envelope_at(bus, rest[0])).stream_time  # type: ignore[union-attr]
    assert await seq_at_time(bus, t1) == first[-1]
    assert await seq_at_time(bus, (t1 + t2) / 2) == first[-1]
    assert await seq_at_time(bus, t2) == rest[0]
    assert await seq_at_time(bus, t1 - 3600) == 0
    assert await seq_at_time(bus, t2 + 3600) == rest[-1]
    assert await envelope_at(bus, 999) is None
