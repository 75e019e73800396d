"""Snapshots (events/snapshots.py): one versioned format, several kept by position, and a bad one never used.

Every poison case is written where the newest snapshot would be; a reader must
skip it for the older one with exactly one log line naming it and why, and the
state it then folds to the end must equal a full fold of the log.
"""

from __future__ import annotations

import asyncio
import base64
import struct
from collections.abc import Callable

import msgspec
import pytest
import structlog
from nats.js.errors import BucketNotFoundError
from structlog.testing import LogCapture

import events.snapshots
from events.bus import Bus
from events.follow import Follower
from events.snapshots import (
    FORMAT,
    MAGIC,
    SNAPSHOT_BUCKET,
    SNAPSHOT_STREAM,
    SnapshotStore,
    Unusable,
    decode,
    encode,
    object_name,
    pack,
)
from orchestrator.cli.state_view import load_state
from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import ClusterState, snapshot
from schemas import AnyEvent
from tests.core.harness import Sim
from tests.stored import fold_stored, stored


def workload(jobs: int = 30) -> list[AnyEvent]:
    """A log with placements, crashes, a gang restart, a node failure and completions."""
    s = Sim(min_runtime_s=0.0)
    for n in range(4):
        s.node(f"n{n}", 4)
    for i in range(jobs):
        s.submit(f"j{i:03d}", ranks=1 + i % 2, gpus_per_rank=2, restart_policy="gang", max_restarts=1)
    s.run()
    s.exit("j000", rank=0, code=1, reason="crashed")
    s.run()
    s.fail_node("n3")
    s.run()
    for jid in list(s.state.active)[:5]:
        if s.job(jid).started == s.job(jid).spec.ranks:
            s.finish(jid)
    s.run()
    return s.log


def fold_to(log: list[AnyEvent], seq: int) -> ClusterState:
    state = ClusterState()
    for i, e in enumerate(log[:seq], 1):
        evolve(state, e, i)
    return state


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> LogCapture:
    """The snapshot module's own log lines (a test's earlier configure_logging would hide capture_logs')."""
    capture = LogCapture()
    monkeypatch.setattr(events.snapshots, "log", structlog.wrap_logger(
        None, processors=[capture], wrapper_class=structlog.BoundLogger, cache_logger_on_first_use=False))
    return capture


def test_the_format_round_trips_and_compresses_when_it_pays() -> None:
    log = workload()
    state = fold_to(log, len(log))
    data = encode(state)
    assert data.startswith(MAGIC) and struct.unpack_from(">I", data, 8)[0] == FORMAT
    header, back = decode(data, ClusterState)
    assert snapshot(back) == snapshot(state) and header.seq == state.seq == len(log)
    assert header.codec == "msgpack+zlib" and header.length < header.raw_length == len(snapshot(state))
    tiny = ClusterState(seq=3)
    header, back = decode(encode(tiny), ClusterState)
    assert header.codec == "msgpack" and snapshot(back) == snapshot(tiny)


def _flip(data: bytes) -> bytes:
    i = len(data) - len(data) // 3  # in the body
    return data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1:]


def _newer(data: bytes) -> bytes:
    header_len = struct.unpack_from(">I", data, 12)[0]
    header = msgspec.json.decode(data[16:16 + header_len])
    header.update(format=FORMAT + 1, corral="9.9.9")
    raw = msgspec.json.encode(header)
    return MAGIC + struct.pack(">II", FORMAT + 1, len(raw)) + raw + data[16 + header_len:]


#: name -> (how the newest snapshot is spoiled from a good one at that seq, what the log line says)
POISON: dict[str, tuple[Callable[[bytes, int], bytes], str]] = {
    "flipped byte": (lambda d, s: _flip(d), "checksum mismatch"),
    "truncated": (lambda d, s: d[:len(d) // 2], "truncated"),
    "newer format": (lambda d, s: _newer(d), f"written by a newer corral (corral 9.9.9, format {FORMAT + 1}; "
                                               f"this corral reads <= {FORMAT})"),
    "garbage": (lambda d, s: b"\x00garbage, not a snapshot" * 100, "not a corral snapshot"),
    "wrong type": (lambda d, s: pack(msgspec.msgpack.encode({"seq": s, "jobs": "not a dict"}), s),
                   "body is not a ClusterState"),
    "wrong seq": (lambda d, s: encode(ClusterState(seq=s - 1)), "its header says seq"),
}


@pytest.mark.parametrize("case", list(POISON))
async def test_an_unusable_snapshot_is_skipped_for_an_older_one(bus: Bus, captured: LogCapture, case: str) -> None:
    log = workload()
    await bus.append_many(log)
    older, newest = len(log) // 3, 2 * len(log) // 3
    store = SnapshotStore(bus.js)
    await store.save(fold_to(log, older))
    spoil, says = POISON[case]
    bad = spoil(encode(fold_to(log, newest)), newest)
    await (await bus.js.object_store(SNAPSHOT_BUCKET)).put(object_name("scheduler", newest), bad)
    assert await store.seqs() == [newest, older]

    loaded = await store.load(ClusterState)
    assert loaded is not None and loaded.seq == older
    assert snapshot(loaded) == snapshot(fold_to(log, older))
    skipped = [e for e in captured.entries if e["event"] == "snapshot_skipped"]
    assert len(skipped) == 1 and skipped[0]["seq"] == newest and says in skipped[0]["reason"], skipped
    assert len(captured.entries) == 1, captured.entries

    # A reader (the CLI's) folds on from it to the same state as a full fold.
    follower = Follower(bus, evolve, loaded)
    await follower.catch_up()
    assert snapshot(follower.state) == snapshot(fold_to(log, len(log)))
    assert snapshot(await load_state(bus)) == snapshot(fold_to(log, len(log)))


async def test_with_every_snapshot_unusable_the_reader_folds_the_whole_log(bus: Bus, captured: LogCapture) -> None:
    log = workload()
    await bus.append_many(log)
    objects = await bus.js.create_object_store(SNAPSHOT_BUCKET)
    await objects.put(object_name("scheduler", 10), _flip(encode(fold_to(log, 10))))
    await objects.put("scheduler.v2", msgspec.msgpack.encode(fold_to(log, 20)))  # the single object before #28
    assert await SnapshotStore(bus.js).load(ClusterState) is None
    assert [(e["event"], e["name"]) for e in captured.entries] == [
        ("snapshot_skipped", object_name("scheduler", 10)), ("snapshot_skipped", "scheduler.v2")]
    assert snapshot(await load_state(bus)) == snapshot(fold_to(log, len(log)))


async def test_the_newest_at_or_before_a_position(bus: Bus) -> None:
    log = workload()
    await bus.append_many(log)
    store = SnapshotStore(bus.js)
    for seq in (10, 20, 30):
        await store.save(fold_to(log, seq))
    assert [(await store.load(ClusterState, at_most=at)) for at in (9,)] == [None]
    for at, want in ((10, 10), (25, 20), (30, 30), (None, 30)):
        got = await store.load(ClusterState, at_most=at)
        assert got is not None and got.seq == want
        assert snapshot(got) == snapshot(fold_to(log, want))
    assert snapshot(await load_state(bus, to_seq=25)) == snapshot(fold_to(log, 25))


async def test_keeps_the_newest_few_and_drops_the_rest_without_a_trace(bus: Bus) -> None:
    log = workload()
    await bus.append_many(log)
    objects = await bus.js.create_object_store(SNAPSHOT_BUCKET)
    await objects.put("scheduler.v2", b"an old single snapshot")
    other = SnapshotStore(bus.js, name="bench")
    await other.save(fold_to(log, 5))
    store = SnapshotStore(bus.js, keep=3)
    for seq in range(10, 70, 10):
        await store.save(fold_to(log, seq))
    assert await store.seqs() == [60, 50, 40]
    assert await store.newest_seq() == 60
    assert await other.seqs() == [5], "another projection's snapshots are its own"
    # No tombstones left behind: the listing stays as small as what is kept.
    info = await bus.js.stream_info(SNAPSHOT_STREAM, subjects_filter=f"$O.{SNAPSHOT_BUCKET}.M.>")
    names = sorted(base64.urlsafe_b64decode(s.split(".")[-1]).decode() for s in info.state.subjects or {})
    assert names == sorted([object_name("bench", 5), *(object_name("scheduler", s) for s in (40, 50, 60))])


async def test_readers_never_create_the_bucket(bus: Bus) -> None:
    store = SnapshotStore(bus.js)
    assert await store.load(ClusterState) is None
    assert await store.newest_seq() == 0 and await store.seqs() == []
    with pytest.raises(BucketNotFoundError):
        await bus.js.object_store(SNAPSHOT_BUCKET)


def test_unusable_says_why_without_a_store() -> None:
    data = encode(ClusterState(seq=7))
    for spoil, says in POISON.values():
        spoiled = spoil(data, 7)
        try:
            header, state = decode(spoiled, ClusterState)
        except Unusable as e:
            assert str(e)
            continue
        assert says.startswith("its header says seq")  # only the store knows the name's seq
        assert state.seq == header.seq



async def test_the_scheduler_snapshots_on_a_time_bound_and_restarts_from_its_newest(
    bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Far fewer events than `snapshot_every`, yet a snapshot follows within `snapshot_interval_s`; a
    restarted scheduler starts from it (`caught_up` says so) and holds what a full fold holds."""
    import orchestrator.scheduler.service
    from tests.integration.harness import scheduler

    capture = LogCapture()
    monkeypatch.setattr(orchestrator.scheduler.service, "log", structlog.wrap_logger(
        None, processors=[capture], wrapper_class=structlog.BoundLogger, cache_logger_on_first_use=False))
    await bus.append_many(workload(10))
    store = SnapshotStore(bus.js)
    async with scheduler(bus, snapshot_every=10**9, snapshot_interval_s=0.5) as first:
        async with asyncio.timeout(30):
            while not (await store.seqs() and await store.newest_seq() >= len(workload(10))):
                await asyncio.sleep(0.2)
        assert first.state.seq >= await store.newest_seq()
    newest = await store.newest_seq()  # (its clean stop may have added one)
    async with scheduler(bus, snapshot_every=10**9, snapshot_interval_s=3600) as second:
        await second.follower.wait_for_seq(newest)
        seq, held = second.state.seq, snapshot(second.state)
    full = Follower(bus, evolve, ClusterState(), stream_times=True)  # as the scheduler folds (#30)
    await full.catch_up(to_seq=seq)
    assert held == snapshot(full.state)
    caught_up = [e for e in capture.entries if e["event"] == "caught_up"]
    assert [e["from_snapshot"] for e in caught_up] == [0, newest], caught_up
    assert all(e["seq"] >= e["from_snapshot"] and e["seconds"] >= 0 for e in caught_up)
async def test_a_scheduler_stopped_as_soon_as_it_caught_up_leaves_a_snapshot(bus: Bus) -> None:
    """A stop at any point after start -- here the moment its catch-up ends, before its lease and heartbeat
    buckets exist -- leaves a snapshot of what it folded. (SIGTERM right after `/readyz` turned 200 left none:
    the save sat in a `finally` entered only once the services ran, and every later reader folded from 1.)"""
    from orchestrator.scheduler.service import Scheduler, SchedulerConfig

    log = workload(10)
    await bus.append_many(log)
    sched = Scheduler(bus, SchedulerConfig(snapshot_every=10**9, snapshot_interval_s=3600))
    caught_up = asyncio.Event()

    def cut(state: ClusterState, event: AnyEvent, seq: int, at: float | None) -> ClusterState:
        state = evolve(state, event, seq, at)
        if seq == len(log):
            caught_up.set()
        return state

    sched.follower.fold = cut  # type: ignore[assignment]
    task = asyncio.create_task(sched.run())
    await caught_up.wait()
    task.cancel()  # lands before run() reaches its services
    await asyncio.gather(task, return_exceptions=True)
    store = SnapshotStore(bus.js)
    assert await store.seqs() == [len(log)]
    # (The scheduler dates events by the stream's clock, #30: a fold of the log as stored.)
    assert snapshot(await store.load(ClusterState) or ClusterState()) == snapshot(fold_stored(await stored(bus)))
