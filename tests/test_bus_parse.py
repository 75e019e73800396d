"""The fast frame splitter (events/bus.py `_install_fast_parse`) reads what nats-py's own parser reads.

Real nats-server. Frames split across socket reads (payloads far larger than one read), status
messages, and core messages with and without headers to a plain subscription, all interleaved
with a replay on the same connection: the replay's envelopes equal those of a connection that
parses with nats-py's parser, and the plain subscription gets every message whole.
"""

from __future__ import annotations

import asyncio

import nats

from events.bus import Bus, Envelope
from events.server import NatsServer
from schemas import JobRunning, Unknown

T0 = 1_700_000_000.0


async def replay_all(bus: Bus) -> list[tuple[int, str, float, object]]:
    out: list[Envelope] = []
    async for batch in bus.replay(batch=50):
        out += batch
    return [(e.seq, e.subject, e.stream_time, e.event) for e in out]


async def test_the_fast_splitter_reads_what_nats_py_reads(nats_server: NatsServer, bus: Bus) -> None:
    assert "parse" in vars(bus.nc._ps), "the fast frame splitter is not installed"
    big = b'{"type":"JobTeleported","pad":"' + b"x" * 300_000 + b'"}'  # ~5 socket reads each: split frames
    for i in range(200):
        if i % 40 == 7:
            await bus.js.publish(f"corral.job.j{i}.JobTeleported", big)
        else:
            await bus.append(JobRunning(event_id=f"r:{i}", occurred_at=T0 + i, job_id=f"j{i}", attempt=1))

    got: list[tuple[str, bytes, dict[str, str] | None]] = []
    done = asyncio.Event()

    async def on_msg(msg: nats.aio.msg.Msg) -> None:
        got.append((msg.subject, msg.data, msg.headers))
        if len(got) == 300:
            done.set()

    sub = await bus.nc.subscribe("plain.>", cb=on_msg)
    other = await nats.connect(nats_server.url)
    sent = [(f"plain.{i}", (b"y" * (i * 997 % 70_000)), {"K": str(i)} if i % 2 else None) for i in range(300)]

    async def publish() -> None:
        for subject, data, headers in sent:
            await other.publish(subject, data, headers=headers)
            if subject.endswith("0"):
                await other.flush()

    try:
        await other.flush()
        pub = asyncio.create_task(publish())
        fast = await replay_all(bus)  # status messages (the end's 404, heartbeats) pass through it too
        await pub
        await asyncio.wait_for(done.wait(), 30)
        assert got == sent

        plain = await Bus.connect(nats_server.url)
        try:
            del plain.nc._ps.parse  # nats-py's own parser, with the direct dispatch behind it
            slow = await replay_all(plain)
        finally:
            await plain.close()
        assert fast == slow
        assert len(fast) == 200 and sum(isinstance(e[3], Unknown) for e in fast) == 5
    finally:
        await sub.unsubscribe()
        await other.close()
