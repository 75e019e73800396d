"""The bus against a real nats-server: append/dedupe, replay, tail, restart, KV."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import aclosing

import nats.js.errors
import pytest

from events.bus import Bus, Envelope
from events.server import NatsServer
from events.subjects import filters, job_filter
from schemas import (
    JobCompleted,
    JobRunning,
    NodeCordoned,
    QueueDefined,
    SchedulerElected,
    Unknown,
    WorkerStarted,
)

T0 = 1_750_000_000.0


def running(job: str, n: int = 1) -> JobRunning:
    return JobRunning(event_id=f"running:{job}:{n}", occurred_at=T0, job_id=job, attempt=n)


def started(job: str, rank: int) -> WorkerStarted:
    return WorkerStarted(event_id=f"started:{job}:{rank}", occurred_at=T0, job_id=job, attempt=1, rank=rank,
                         node_id="node-1")


async def replay_all(bus: Bus, *args: int, **kw: object) -> list[Envelope]:
    out: list[Envelope] = []
    async for batch in bus.replay(*args, **kw):  # type: ignore[arg-type]
        assert batch, "replay yielded an empty batch"
        out += batch
    return out


async def first(it: AsyncIterator[Envelope], n: int, timeout: float = 10.0) -> list[Envelope]:
    out: list[Envelope] = []
    async with asyncio.timeout(timeout):
        async for env in it:
            out.append(env)
            if len(out) == n:
                break
    return out


# --- append ---------------------------------------------------------------------


async def test_append_returns_sequences_and_subjects(bus: Bus) -> None:
    assert await bus.last_seq() == 0
    assert await bus.append(running("j1")) == 1
    assert await bus.append(SchedulerElected(event_id="e1", occurred_at=T0, epoch=1, scheduler_id="s")) == 2
    assert await bus.append(NodeCordoned(event_id="c1", occurred_at=T0, node_id="node-7")) == 3
    assert await bus.append(QueueDefined(event_id="q1", occurred_at=T0, queue="research")) == 4
    envs = await replay_all(bus)
    assert [e.subject for e in envs] == [
        "corral.job.j1.JobRunning", "corral.sched.SchedulerElected", "corral.node.node-7.NodeCordoned",
        "corral.queue.research.QueueDefined",
    ]
    assert envs[0].event == running("j1")
    assert abs(envs[0].stream_time - time.time()) < 60


async def test_same_event_id_is_stored_once(bus: Bus) -> None:
    ev = running("j1")
    seq = await bus.append(ev)
    await bus.append(running("j2"))
    assert await bus.append(ev) == seq  # a retried append gets the original's sequence
    # What makes it so: the server flags the retry as a duplicate and stores nothing.
    from events.subjects import subject_for
    from schemas import encode

    ack = await bus.js.publish(subject_for(ev), encode(ev), headers={"Nats-Msg-Id": ev.event_id})
    assert ack.duplicate is True and ack.seq == seq
    info = await bus.js.stream_info(bus.stream)
    assert info.state.messages == 2


async def test_append_many_keeps_order_and_dedupes(bus: Bus) -> None:
    events = [started("j1", r) for r in range(500)]
    seqs = await bus.append_many(events)
    assert seqs == list(range(1, 501))
    again = await bus.append_many([*events[100:110], started("j2", 0)])
    assert again == [*range(101, 111), 501]
    envs = await replay_all(bus)
    assert [e.event for e in envs] == [*events, started("j2", 0)]


async def test_append_rejects_ids_that_would_break_subjects(bus: Bus) -> None:
    with pytest.raises(ValueError, match="job id"):
        await bus.append(running("a.b"))
    with pytest.raises(ValueError, match="event_id"):
        await bus.append(JobRunning(event_id="", occurred_at=T0, job_id="j1", attempt=1))
    assert await bus.last_seq() == 0


async def test_stream_create_is_idempotent(nats_server: NatsServer, bus: Bus) -> None:
    await bus.append(running("j1"))
    # An operator's limit survives a service connecting with its own settings.
    info = await bus.js.stream_info("CORRAL")
    await bus.js.update_stream(info.config.evolve(max_msgs=1_000_000))
    other = await Bus.connect(nats_server.url, duplicate_window=120.0)  # create-or-update, keeps the data
    try:
        info = await other.js.stream_info("CORRAL")
        assert info.config.duplicate_window == 120.0
        assert info.config.max_msgs == 1_000_000
        assert info.state.messages == 1
    finally:
        await other.close()
    await bus.close()
    await bus.close()  # idempotent


# --- replay -----------------------------------------------------------------------


async def test_replay_everything_in_order_across_batches(bus: Bus) -> None:
    await bus.append_many([started(f"j{i % 3}", i) for i in range(250)])
    envs: list[Envelope] = []
    async for batch in bus.replay(batch=7):
        envs += batch
    assert [e.seq for e in envs] == list(range(1, 251))
    assert [e.event.rank for e in envs] == list(range(250))  # type: ignore[union-attr]


async def test_replay_from_and_to_sequence(bus: Bus) -> None:
    await bus.append_many([started("j1", i) for i in range(100)])
    assert [e.seq for e in await replay_all(bus, 40)] == list(range(40, 101))
    assert [e.seq for e in await replay_all(bus, 40, to_seq=55)] == list(range(40, 56))
    assert [e.seq for e in await replay_all(bus, to_seq=1)] == [1]
    assert await replay_all(bus, 101) == []
    assert await replay_all(bus, 50, to_seq=10) == []


async def test_replay_ends_at_the_last_sequence_present_when_called(bus: Bus) -> None:
    await bus.append_many([started("j1", i) for i in range(20)])
    seen: list[int] = []
    async with aclosing(bus.replay(batch=5)) as batches:
        async for batch in batches:
            seen += [e.seq for e in batch]
            if len(seen) == 5:
                await bus.append_many([started("j2", i) for i in range(20)])  # after the call: not included
    assert seen == list(range(1, 21))


async def test_replay_on_an_empty_stream(bus: Bus) -> None:
    assert await replay_all(bus) == []


async def test_replay_since_a_time(bus: Bus) -> None:
    await bus.append_many([started("j1", i) for i in range(10)])
    envs = await replay_all(bus)
    # `since` has microsecond resolution: cut where the log has a gap wider than that.
    i = next(i for i in range(3, 10) if envs[i].stream_time - envs[i - 1].stream_time > 2e-6)
    since = await replay_all(bus, since=envs[i].stream_time)
    assert [e.seq for e in since] == list(range(i + 1, 11))
    assert await replay_all(bus, since=time.time() + 3600) == []
    with pytest.raises(ValueError):
        await replay_all(bus, 3, since=envs[i].stream_time)


async def test_replay_with_subject_filters(bus: Bus) -> None:
    events = [started(f"j{i % 4}", i) for i in range(40)] + [running("j1"), running("j2")]
    await bus.append_many(events)
    j1 = await replay_all(bus, subjects=[job_filter("j1")])
    assert [e.event for e in j1] == [e for e in events if e.job_id == "j1"]
    both = await replay_all(bus, subjects=filters(jobs=["j1", "j2"], types=["JobRunning"]))
    assert [e.event for e in both] == [running("j1"), running("j2")]
    # A filter whose last match is far before the end still ends (no waiting for more).
    early = await replay_all(bus, subjects=[job_filter("j0")], to_seq=20)
    assert [e.seq for e in early] == [1, 5, 9, 13, 17]


async def test_replay_passes_undecodable_messages_through_as_unknown(bus: Bus) -> None:
    await bus.append(running("j1"))
    await bus.js.publish("corral.job.j1.JobTeleported", b'{"type":"JobTeleported","event_id":"x","occurred_at":1}')
    await bus.js.publish("corral.job.j1.JobRunning", b"\x00not json")
    await bus.append(running("j1", 2))
    envs = await replay_all(bus)
    assert [type(e.event) for e in envs] == [JobRunning, Unknown, Unknown, JobRunning]
    assert envs[1].event.type == "JobTeleported"  # type: ignore[union-attr]


async def test_replay_takes_the_direct_dispatch_and_its_fallback_reads_the_same(nats_server: NatsServer,
                                                                                   bus: Bus) -> None:
    """Replays skip nats-py's per-message work (events/bus/frames.py `install_direct_dispatch`); a
    connection without the hook (another nats-py) reads the same envelopes through callbacks."""
    assert bus.readers.direct_ok, "nats-py's parser entry point changed: replays fell back to the slower callbacks"
    await bus.append_many([started(f"j{i % 3}", i) for i in range(120)])
    await bus.js.publish("corral.job.j1.JobRunning", b"\x00not json")
    direct = await replay_all(bus)
    other = await Bus.connect(nats_server.url)
    try:
        other.readers.direct_ok = False
        fallback = await replay_all(other)
        assert [(e.seq, e.subject, e.stream_time, e.event) for e in fallback] == [
            (e.seq, e.subject, e.stream_time, e.event) for e in direct]
        assert len(direct) == 121 and isinstance(direct[-1].event, Unknown)
        assert not bus.readers.direct and not other.readers.direct  # every reader unregistered itself
    finally:
        await other.close()


# --- tail ---------------------------------------------------------------------------


async def test_tail_from_now_with_a_subject_filter(bus: Bus) -> None:
    await bus.append(running("a"))  # before the tail: not delivered
    got: asyncio.Queue[Envelope] = asyncio.Queue()

    async def follow() -> None:
        async with aclosing(bus.tail(subjects=[job_filter("a")])) as events:
            async for env in events:
                await got.put(env)

    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(follow())
        await wait_for_consumers(bus, 1)
        await bus.append_many([started("b", 0), started("a", 0), running("b"), started("a", 1), running("a", 2)])
        received = [await asyncio.wait_for(got.get(), 10) for _ in range(3)]
        task.cancel()
    assert [e.event for e in received] == [started("a", 0), started("a", 1), running("a", 2)]
    assert got.empty()


async def test_tail_from_a_sequence_then_live(bus: Bus) -> None:
    await bus.append_many([started("j1", i) for i in range(5)])
    async with aclosing(bus.tail(from_seq=3)) as events:
        assert [e.seq for e in await first(events, 3)] == [3, 4, 5]
        await bus.append(running("j1"))
        (live,) = await first(events, 1)
    assert live.seq == 6 and live.event == running("j1")


async def test_tail_since_a_time(bus: Bus) -> None:
    await bus.append_many([started("j1", i) for i in range(4)])
    cut = (await replay_all(bus))[2].stream_time
    async with aclosing(bus.tail(since=cut)) as events:
        assert [e.seq for e in await first(events, 2)] == [3, 4]


async def wait_for_consumers(bus: Bus, n: int, timeout: float = 10.0) -> None:
    """A tail 'from now' starts when its consumer exists; wait for that, bounded."""
    deadline = time.monotonic() + timeout
    while (await bus.js.stream_info(bus.stream)).state.consumer_count < n:
        assert time.monotonic() < deadline, "tail consumer never appeared"
        await asyncio.sleep(0.01)


# --- restarts -----------------------------------------------------------------------


async def test_stream_survives_a_server_restart_with_its_data_dir(nats_server: NatsServer) -> None:
    bus = await Bus.connect(nats_server.url)
    await bus.append_many([started("j1", i) for i in range(50)])
    await bus.close()
    nats_server.stop()
    nats_server.start()
    bus = await Bus.connect(nats_server.url)
    try:
        envs = await replay_all(bus)
        assert [e.seq for e in envs] == list(range(1, 51))
        assert await bus.append(started("j1", 10)) == 11  # dedupe window survived too
        assert await bus.append(running("j1")) == 51
    finally:
        await bus.close()


async def test_stream_survives_sigkill_of_the_server(nats_server: NatsServer) -> None:
    """Acked means written: the server's default sync survives a crash of its process."""
    bus = await Bus.connect(nats_server.url)
    await bus.append_many([started("j1", i) for i in range(200)])
    await bus.close()
    nats_server.kill()
    nats_server.start()
    bus = await Bus.connect(nats_server.url)
    try:
        assert [e.seq for e in await replay_all(bus)] == list(range(1, 201))
    finally:
        await bus.close()


async def test_tail_carries_on_across_a_server_restart(nats_server: NatsServer, bus: Bus) -> None:
    await bus.append_many([started("j1", i) for i in range(3)])
    async with aclosing(bus.tail(from_seq=1)) as events:
        assert [e.seq for e in await first(events, 3)] == [1, 2, 3]
        await asyncio.to_thread(nats_server.restart)
        await bus.append(running("j1"))  # retried by append until the connection is back
        (after,) = await first(events, 1, timeout=20)
    assert after.seq == 4 and after.event == running("j1")


# --- kv ---------------------------------------------------------------------------


async def test_kv_bucket_create_or_get(bus: Bus) -> None:
    kv = await bus.kv("heartbeats", ttl=30.0)
    await kv.put("node-1", b"1750000000.5")
    again = await bus.kv("heartbeats", ttl=30.0)
    assert (await again.get("node-1")).value == b"1750000000.5"
    other = await bus.kv("heartbeats", ttl=60.0)  # different settings: the existing bucket, as is
    assert (await other.status()).ttl == 30.0
    with pytest.raises(nats.js.errors.KeyNotFoundError):
        await kv.get("node-2")


async def test_replay_removes_its_consumer(bus: Bus) -> None:
    await bus.append_many([started("j1", i) for i in range(30)])
    await replay_all(bus, batch=4)
    async with aclosing(bus.replay(batch=4)) as batches:
        async for _ in batches:
            break
    assert (await bus.js.stream_info(bus.stream)).state.consumer_count == 0


async def test_completed_event_roundtrip(bus: Bus) -> None:
    ev = JobCompleted(event_id="done:j1", occurred_at=T0, job_id="j1", attempt=3)
    seq = await bus.append(ev)
    (env,) = await replay_all(bus, seq)
    assert env == Envelope(seq, "corral.job.j1.JobCompleted", env.stream_time, ev)


async def test_connect_to_nothing_fails_fast() -> None:
    import nats.errors

    t = time.monotonic()
    with pytest.raises((nats.errors.NoServersError, OSError)):
        await Bus.connect("nats://127.0.0.1:9", connect_attempts=2, reconnect_time_wait=0.05)
    assert time.monotonic() - t < 5


async def test_undecodable_events_are_logged_once_per_reason(bus: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
    """Per reason (a closed set), not per claimed type: made-up types must not each cost a log line."""
    import structlog
    from structlog.testing import LogCapture

    import events.bus.reader

    # The bus's own logger, not structlog.testing.capture_logs: an earlier test's configure_logging
    # (cached loggers, a level filter) would hide what capture_logs installs.
    capture = LogCapture()
    monkeypatch.setattr(events.bus.reader, "log", structlog.wrap_logger(None, processors=[capture],
                                                                        wrapper_class=structlog.BoundLogger,
                                                                        cache_logger_on_first_use=False))
    for i in range(3):
        await bus.js.publish("corral.job.j1.JobTeleported", b'{"type":"JobTeleported%d","n":%d}' % (i, i))
        await bus.js.publish("corral.job.j1.Garbage", b"\xff%d" % i)
    envs = await replay_all(bus)
    assert len(envs) == 6 and all(isinstance(e.event, Unknown) for e in envs)
    logged = [x for x in capture.entries if "undecodable" in x["event"]]
    assert sorted(str(x["reason"]) for x in logged) == ["malformed", "unknown_type"]
