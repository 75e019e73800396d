"""Folds check positions: each event exactly once, in order, or a loud stop naming the position (#19).

A follower reads the whole stream, so it must see seq N+1 right after N. A
redelivery (at or below its position) is skipped silently; a gap makes it
read again from its last folded position; a position the log no longer
holds (deleted, or the stream's head moved past it) raises LogGap, and the
services and `corral tail` exit non-zero naming it. All against a real
nats-server; where a read must lose events, the test drops them from a real
replay (a fault, injected where a reset used to lose them).
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncGenerator
from pathlib import Path

import pytest

from events.bus import Bus, Envelope, LogGap
from events.follow import REREADS, Follower, fold_batch
from events.server import NatsServer
from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import ClusterState
from schemas import NodeCordoned
from tests.faults.services import agent_proc, scheduler_proc
from tests.integration.harness import CORRAL


def cordoned(i: int) -> NodeCordoned:
    return NodeCordoned(event_id=f"c{i}", occurred_at=0.0, node_id=f"n{i}")


def env(seq: int) -> Envelope:
    return Envelope(seq, f"corral.node.n{seq}.NodeCordoned", 0.0, cordoned(seq))


async def append(bus: Bus, n: int) -> None:
    for i in range(n):
        await bus.append(cordoned(i))


def test_apply_folds_the_next_position_skips_redeliveries_and_refuses_a_gap() -> None:
    f = Follower(None, evolve, ClusterState())  # type: ignore[arg-type]  # apply does no IO
    assert f.apply(env(1)) and f.apply(env(2))
    assert not f.apply(env(2)) and not f.apply(env(1)), "a redelivery is skipped silently"
    with pytest.raises(LogGap) as e:
        f.apply(env(4))
    assert (e.value.expected, e.value.found) == (3, 4)
    assert f.state.seq == 2, "nothing beyond the gap was folded"


def test_batches_fold_up_to_the_gap() -> None:
    f = Follower(None, evolve, ClusterState())  # type: ignore[arg-type]
    with pytest.raises(LogGap) as e:
        f.apply_batch([env(1), env(2), env(2), env(5), env(6)])
    assert (e.value.expected, e.value.found) == (3, 5)
    assert f.state.seq == 2
    with pytest.raises(LogGap):
        fold_batch(ClusterState(), [env(2)], evolve)  # a fold from scratch starts at seq 1
    # A log file folds what it holds (an export may be filtered).
    assert fold_batch(ClusterState(), [env(2), env(5)], evolve, contiguous=False).seq == 5


async def test_a_read_that_lost_events_is_read_again(bus: Bus) -> None:
    await append(bus, 8)
    f = Follower(bus, evolve, ClusterState())
    seen: list[int] = []
    f.on_event(lambda e: seen.append(e.seq))
    calls: list[int] = []

    async def lossy(start: int) -> AsyncGenerator[list[Envelope], None]:
        """The real replay, minus seqs 3 and 4 on the first read (what a reset used to lose)."""
        calls.append(start)
        async for batch in bus.replay(from_seq=start):
            yield [e for e in batch if len(calls) > 1 or e.seq not in (3, 4)]

    await f._fold_from(lossy, f.apply_batch)
    assert calls == [1, 3], "read again from the first missing position"
    assert seen == list(range(1, 9))


async def test_a_position_the_log_holds_but_reads_keep_missing_stops_the_fold(bus: Bus) -> None:
    await append(bus, 5)
    f = Follower(bus, evolve, ClusterState())

    async def always_without_3(start: int) -> AsyncGenerator[list[Envelope], None]:
        async for batch in bus.replay(from_seq=start):
            yield [e for e in batch if e.seq != 3]

    with pytest.raises(LogGap) as e:
        await f._fold_from(always_without_3, f.apply_batch)
    assert (e.value.expected, e.value.found) == (3, 4)
    assert f"{REREADS} reads in a row" in str(e.value)
    assert f.state.seq == 2


async def test_a_deleted_event_stops_catch_up_and_follow_naming_it(bus: Bus) -> None:
    await append(bus, 6)
    await bus.js.delete_msg(bus.stream, 4)
    f = Follower(bus, evolve, ClusterState())
    with pytest.raises(LogGap) as e:
        await f.catch_up()
    assert (e.value.expected, e.value.found) == (4, 5)
    assert "seq 4 was deleted" in str(e.value) and "needs seq 4" in str(e.value)
    assert f.state.seq == 3, "everything before the hole is folded, nothing after it"

    live = Follower(bus, evolve, ClusterState())
    with pytest.raises(LogGap) as e:
        async with asyncio.timeout(30):
            await live.follow()
    assert (e.value.expected, e.value.found) == (4, 5)
    assert live.state.seq == 3


async def test_a_log_whose_head_moved_past_the_fold_stops_it(bus: Bus) -> None:
    await append(bus, 6)
    await bus.js.purge_stream(bus.stream, seq=4)  # removes 1..3
    with pytest.raises(LogGap) as e:
        await Follower(bus, evolve, ClusterState()).catch_up()
    assert (e.value.expected, e.value.found) == (1, 4)
    assert "starts at seq 4" in str(e.value)
    # A fold that already holds 1..3 (a snapshot) goes on.
    f = Follower(bus, evolve, ClusterState(seq=3))
    await f.catch_up()
    assert f.state.seq == 6


def _corral_tail(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CORRAL, "--nats", url, "tail", "--no-follow", "--json", *args],
                          capture_output=True, text=True, timeout=60)


async def test_tail_stops_at_a_deleted_event_unless_filtered(nats_server: NatsServer, bus: Bus) -> None:
    await append(bus, 5)
    await bus.js.delete_msg(bus.stream, 3)
    whole = await asyncio.to_thread(_corral_tail, nats_server.url)
    assert whole.returncode == 1, whole
    assert "needs seq 3" in whole.stderr and "seq 3 was deleted" in whole.stderr, whole.stderr
    assert [line.split(",")[0] for line in whole.stdout.splitlines()] == ['{"seq":1', '{"seq":2']
    # A type filter: positions are not contiguous, so none is missing.
    typed = await asyncio.to_thread(_corral_tail, nats_server.url, "--type", "NodeCordoned")
    assert typed.returncode == 0, typed
    assert len(typed.stdout.splitlines()) == 4


@pytest.mark.parametrize("service", ["scheduler", "agent"])
async def test_a_service_exits_naming_the_missing_position(nats_server: NatsServer, bus: Bus, tmp_path: Path,
                                                          service: str) -> None:
    await append(bus, 5)
    await bus.js.delete_msg(bus.stream, 3)
    if service == "scheduler":
        proc = scheduler_proc(nats_server.url, "s1", tmp_path)
        log = tmp_path / "s1.log"
    else:
        proc = agent_proc(nats_server.url, "n0", tmp_path)
        log = tmp_path / "agent-n0.log"
    try:
        rc = await asyncio.to_thread(proc.wait, 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text(errors="replace")
    assert rc == 1, text[-2000:]
    assert '"log_gap"' in text and '"expected": 3' in text, text[-2000:]
    assert "corral: error: log gap: the fold needs seq 3 next, the log gave seq 4: seq 3 was deleted" in text, \
        text[-2000:]


async def test_an_agent_exits_naming_the_start_of_its_slice_the_stream_lost(nats_server: NatsServer, bus: Bus,
                                                                            tmp_path: Path) -> None:
    """With no node view stored an agent reads its slice from position 1, which the stream no longer holds:
    it stops naming the positions and the flag that reads them (README: Recovery)."""
    await append(bus, 5)
    await bus.js.purge_stream(bus.stream, seq=4)  # removes 1..3
    proc = agent_proc(nats_server.url, "n0", tmp_path)
    try:
        rc = await asyncio.to_thread(proc.wait, 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = (tmp_path / "agent-n0.log").read_text(errors="replace")
    assert rc == 1, text[-2000:]
    assert '"log_gap"' in text and '"expected": 1' in text, text[-2000:]
    assert "seq 1..3 are not in the stream: it now starts at seq 4" in text and "--archive PATH" in text, \
        text[-2000:]
