"""The fast frame splitter (events/bus/frames.py `install_fast_parse`) reads what nats-py's own parser reads.

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


class Recorder:
    """What a connection does with parsed frames, recorded in order (the observer of a parser, not a server)."""

    def __init__(self) -> None:
        self.seen: list[tuple[object, ...]] = []
        self.stats = {"in_msgs": 0, "in_bytes": 0}

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        self.seen.append(("msg", sid, subject, reply, data, headers))

    async def _process_ping(self) -> None:
        self.seen.append(("ping",))

    async def _process_pong(self) -> None:
        self.seen.append(("pong",))

    async def _process_info(self, info: dict[str, object]) -> None:
        self.seen.append(("info", info))

    async def _process_err(self, err: str) -> None:
        self.seen.append(("err", err))


class DataSink:
    """A reader's side of direct dispatch: the data messages handed to it, as `msg` records."""

    def __init__(self, seen: list[tuple[object, ...]]) -> None:
        self.seen = seen

    def _on_data(self, subject: bytes, reply: bytes, data: bytes) -> bool:
        self.seen.append(("msg", 7, subject, reply, data, b"H"))  # headers: a reader skips them
        return len(self.seen) % 3 == 0  # ask for more now and then: an await mid-chunk

    def _on_frame(self, subject: bytes, sseq: int, ts: int, pending: bytes, data: bytes) -> bool:
        """A data frame matched whole: recorded as the reply it was parsed from (the wire's v1 form)."""
        return self._on_data(subject, b"$JS.ACK.S.C.1.%d.%d.%d.%s" % (sseq, sseq, ts, pending), data)

    async def _fill(self) -> None:
        await asyncio.sleep(0)


def wire() -> bytes:
    hdr = b"NATS/1.0\r\nNats-Msg-Id: a\r\n\r\n"
    status = b"NATS/1.0 100 Idle Heartbeat\r\n\r\n"
    frames = [b"INFO {\"server_id\":\"x\"}\r\n", b"PING\r\n"]
    for i in range(40):
        data = b'{"n":%d,"pad":"%s"}' % (i, b"z" * (i * 37 % 300))
        sid = 7 if i % 4 else 9
        # A replay's reply (v1, the data frame matched whole), a v2 one and a plain one (the general path).
        reply = (b"$JS.ACK.S.C.1.%d.%d.%d.%d" % (i, i, 1_700_000_000_000_000_000 + i, 40 - i) if i % 3 == 0
                 else b"$JS.ACK.D.H.S.C.1.%d.%d.%d.%d.t" % (i, i, i, 40 - i) if i % 3 == 1 else b"r.%d" % i)
        frames.append(b"HMSG s.%d %d %s %d %d\r\n" % (i, sid, reply, len(hdr), len(hdr) + len(data)) + hdr + data
                      + b"\r\n")
        if i % 9 == 0:
            frames.append(b"HMSG inbox 7 %d %d\r\n" % (len(status), len(status)) + status + b"\r\n")
        if i % 7 == 0:
            frames.append(b"MSG plain.%d 9 %d\r\n%s\r\n" % (i, len(data), data))
        if i % 13 == 0:
            frames += [b"+OK\r\n", b"PONG\r\n", b"MSG q 9 reply.to 0\r\n\r\n"]
    return b"".join(frames)


async def test_the_splitter_frames_any_cut_of_the_wire_as_nats_py_does() -> None:
    from nats.protocol.parser import Parser

    from events.bus.frames import install_fast_parse

    stream = wire()
    ref = Recorder()
    await Parser(ref).parse(stream)
    expected = [(r[0], 7, r[2], r[3], r[4], b"H") if r[0] == "msg" and r[1] == 7 and r[4] else r for r in ref.seen]
    for size in (1, 2, 3, 5, 17, 64, 333, 4096, len(stream)):
        conn = Recorder()
        ps = Parser(conn)
        conn._ps = ps  # type: ignore[attr-defined]
        sink = DataSink(conn.seen)

        async def deliver(sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None,
                          conn: Recorder = conn, sink: DataSink = sink) -> None:
            """What the direct dispatch's `process_msg` does with a frame nats-py's parser began."""
            if sid == 7 and data:
                if sink._on_data(subject, reply, data):
                    await sink._fill()
            else:
                await Recorder._process_msg(conn, sid, subject, reply, data, headers)

        conn._process_msg = deliver  # type: ignore[method-assign]  # as install_direct_dispatch does
        install_fast_parse(conn, {7: sink}, deliver)  # type: ignore[arg-type,dict-item]
        for at in range(0, len(stream), size):
            await ps.parse(stream[at:at + size])
        assert conn.seen == expected, f"cut every {size} bytes"
        assert not ps.buf
