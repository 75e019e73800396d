"""The CLI's state: the log folded here, from the scheduler's snapshot when it is not past the position asked."""

from __future__ import annotations

import asyncio
import json
from typing import Any, TypeVar

import pytest
from nats.js.errors import BucketNotFoundError

from events.bus import Bus
from events.server import NatsServer
from events.snapshots import SNAPSHOT_BUCKET, Loaded, SnapshotStore
from orchestrator.cli import main
from orchestrator.cli.state_view import envelope_at, load_state, seq_at_time
from orchestrator.core.evolve import fold
from orchestrator.core.model.state import snapshot
from tests.cli.test_top import EVENTS
from tests.test_snapshots import fold_to, workload

S = TypeVar("S")


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


def test_jobs_nodes_and_replay_from_a_snapshot_print_what_a_full_fold_prints(
    nats_server: NatsServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`corral jobs`, `nodes`, `queues`, `job`, `replay --at` start from the newest snapshot at or before the
    position they show and print the same as with no snapshot at all."""
    log = workload()

    async def seed(with_snapshots: bool) -> None:
        bus = await Bus.connect(nats_server.url)
        try:
            if not await bus.last_seq():
                await bus.append_many(log)
            if with_snapshots:
                for seq in (len(log) // 3, 2 * len(log) // 3):
                    await SnapshotStore(bus.js).save(fold_to(log, seq))
            else:
                await bus.js.delete_object_store(SNAPSHOT_BUCKET)
        finally:
            await bus.close()

    used: list[int | None] = []
    real_load = SnapshotStore.load_with_header

    async def spy(self: SnapshotStore, state_type: type[S], at_most: int | None = None) -> Loaded[S] | None:
        loaded = await real_load(self, state_type, at_most)
        used.append(None if loaded is None else getattr(loaded.state, "seq", None))
        return loaded

    monkeypatch.setattr(SnapshotStore, "load_with_header", spy)
    mid = len(log) // 2
    commands = [["jobs", "--all"], ["nodes"], ["queues"], ["job", "j000"], ["replay", "--at", f"#{mid}"]]

    def outputs() -> list[Any]:
        out = []
        for args in commands:
            with pytest.raises(SystemExit) as exit_:
                main([*args, "--nats", nats_server.url, "--json"])
            printed = capsys.readouterr()
            assert exit_.value.code == 0, printed.err
            shown = json.loads(printed.out)
            if shown.get("estimate"):
                shown["estimate"].pop("expected_end")  # `job`: never before now, by the clock
            out.append(shown)
        return out

    asyncio.run(seed(with_snapshots=True))
    with_snapshots = outputs()
    # (replay --at reads the one before `mid`; `jobs --all` folds the whole log, whose finished jobs a snapshot's
    # fold no longer keeps all of: #39, no silent partial answers)
    assert used == [2 * len(log) // 3] * 3 + [len(log) // 3], used
    asyncio.run(seed(with_snapshots=False))
    used.clear()
    assert outputs() == with_snapshots
    assert used == [None] * 4
