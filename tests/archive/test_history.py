"""History (events/history.py): the archive and the stream read as one log, or a LogGap naming what is missing.

A real nats-server whose first 200 events were archived (segments of 50) and purged from the stream, then
50 more appended that only the stream holds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path

import pytest

from events.archive import Archive
from events.bus import Bus, LogGap
from events.follow import Follower
from events.history import History
from events.server import NatsServer
from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import ClusterState
from orchestrator.scheduler.metrics import state_digest
from tests.archive.workload import append, archived_and_purged


async def positions(log: Bus | History, **kw: object) -> list[int]:
    out: list[int] = []
    async with aclosing(log.replay(batch=30, **kw)) as batches:  # type: ignore[arg-type]
        async for batch in batches:
            out += [env.seq for env in batch]
    return out


@pytest.fixture
async def history(nats_server: NatsServer, tmp_path: Path) -> AsyncIterator[History]:
    await archived_and_purged(nats_server.url, tmp_path / "archive")
    bus = await Bus.connect(nats_server.url)
    await append(bus, 200, 50)
    yield History(bus, Archive(tmp_path / "archive"))
    await bus.close()


async def test_the_archive_and_the_stream_read_as_one_log(history: History) -> None:
    assert (await history.bus.js.stream_info("CORRAL")).state.first_seq == 201
    assert await history.last_seq() == 250
    assert await positions(history) == list(range(1, 251))
    assert await positions(history, from_seq=180, to_seq=220) == list(range(180, 221))
    assert await positions(history, subjects=["corral.node.n3.>"]) == [s for s in range(1, 251) if (s - 1) % 97 == 3]
    at = (await anext(aiter(history.replay(from_seq=150, to_seq=150))))[0].stream_time
    assert (await positions(history, since=at))[0] == 150
    # A Follower's fold over both equals a plain fold of what a replay of both hands out.
    f = Follower(history, evolve, ClusterState())
    await f.catch_up()
    g = ClusterState()
    async with aclosing(history.replay(batch=7)) as batches:
        async for batch in batches:
            for env in batch:
                g = evolve(g, env.event, env.seq)
    assert f.state.seq == 250 and state_digest(f.state) == state_digest(g)
    # A tail from an archived position goes on live in the stream.
    seen: list[int] = []
    async with aclosing(history.tail(from_seq=240)) as live:
        async for env in live:
            seen.append(env.seq)
            if env.seq == 250:
                await append(history.bus, 250, 1)
            if env.seq == 251:
                break
    assert seen == list(range(240, 252))


async def test_a_range_in_neither_is_named(history: History) -> None:
    for f in history.archive.path.glob("000000000101-000000000150.*"):
        f.unlink()
    got: list[int] = []
    with pytest.raises(LogGap) as e:
        async with aclosing(history.replay()) as batches:
            async for batch in batches:
                got += [env.seq for env in batch]
    assert got == list(range(1, 101)), "what precedes the gap is read; nothing after it"
    assert (e.value.expected, e.value.found) == (101, 151)
    assert "seq 101..150 are in neither the archive nor the stream" in e.value.why
    assert "seq 120..150 are in neither the archive nor the stream" in (await history.missing(120) or "")
    assert await history.missing(160) is None and await history.missing(230) is None
    # A Follower stops there too, naming it.
    with pytest.raises(LogGap, match=r"seq 101\.\.150 are in neither"):
        await Follower(history, evolve, ClusterState()).catch_up()
