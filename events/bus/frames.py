"""Replay and tail data messages straight from nats-py's protocol parser to their reader (the hot path).

A replay's cost per event was mostly nats-py's per-message work, not the
decode (bench/RESULTS.md, #28): this module hooks the parser's entry points
of one connection so that a reader's data messages skip it (1.5x the plain
nats-py read). Everything else (status messages, other subscriptions, any
line it does not know) keeps nats-py's own path.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable
from typing import Protocol

from nats.aio.client import Client as NATS


class FrameReader(Protocol):
    """What a reader offers the parser (events/bus/reader.py `Reader`): its data messages, and more requests."""

    def _on_data(self, subject: bytes | bytearray, reply: bytes | bytearray, data: bytes) -> bool: ...

    def _on_frame(self, subject: bytes | bytearray, sseq: int, ts: int, pending: bytes | bytearray,
                  data: bytes | bytearray) -> bool: ...

    async def _fill(self) -> None: ...


_AWAITING_CONTROL_LINE = 1

#: A replay's data frame in one match: subject, sid, then from the v1 ack reply
#: ($JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>) the stream
#: sequence, time and pending count, then header and total sizes. Splitting the
#: line and the reply in Python cost more per event than decoding it (#28);
#: any other frame (v2 replies included) takes the general path.
_DATA_FRAME = re.compile(
    rb"HMSG ([^ \r\n]+) ([0-9]+) \$JS\.ACK\.[^. \r\n]+\.[^. \r\n]+\.[0-9]+\.([0-9]+)\.[0-9]+\.([0-9]+)\.([0-9]+)"
    rb" ([0-9]+) ([0-9]+)\r\n")


def install_direct_dispatch(nc: NATS, readers: dict[int, FrameReader]) -> bool:
    """Hand replay/tail data messages from nats-py's protocol parser straight to their reader.

    For every message nats-py parses a headers dict (the Nats-Msg-Id every
    corral event carries), builds a Msg, queues it and switches to the
    subscription's task: ~40% of a replay's CPU (bench/RESULTS.md). A reader
    needs none of it for a data message: sequence and time are in the reply
    subject. Status messages (heartbeats, expiries: no data) and every other
    subscription keep nats-py's path. Hooked on the parser's one entry point
    (nats-py is pinned); if this nats-py has no such entry point, nothing is
    changed and readers use their callbacks (tests/test_bus.py checks which).
    """
    original = getattr(nc, "_process_msg", None)
    if original is None:
        return False
    try:
        params = list(inspect.signature(original).parameters)
    except (TypeError, ValueError):
        return False
    if params != ["sid", "subject", "reply", "data", "headers"] or not isinstance(getattr(nc, "stats", None), dict):
        return False
    stats = nc.stats

    async def process_msg(sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        reader = readers.get(sid)
        if reader is None or not data:
            await original(sid, subject, reply, data, headers)
            return
        stats["in_msgs"] += 1
        stats["in_bytes"] += len(data)
        if reader._on_data(subject, reply, data):
            await reader._fill()

    nc._process_msg = process_msg  # type: ignore[method-assign]
    install_fast_parse(nc, readers, process_msg)
    return True


def install_fast_parse(nc: NATS, readers: dict[int, FrameReader], deliver: Callable[..., Awaitable[None]]) -> None:
    """Split MSG/HMSG frames off nats-py's read buffer without its per-message regexes, copies and awaits.

    nats-py's parser tries two regular expressions per message (MSG, then
    HMSG: every corral event has a header), deletes each frame from the
    front of its buffer, copies header and payload, and awaits a coroutine
    per message: most of what a replay from NATS costs beyond a fold of the
    same events from a file (bench/coldread.py, #28). This walks a chunk's
    whole frames with `find`, hands a reader's data messages to it directly
    (one await per batch, when it asks for more) and everything else (status
    messages, other subscriptions) to nats-py's own `_process_msg`, exactly
    as its parser would. Any other line (PING, INFO, -ERR, a malformed
    frame) is left to nats-py's parser, which then finishes the chunk; a
    frame it began is finished here.
    """
    ps = getattr(nc, "_ps", None)
    slow = getattr(ps, "parse", None)
    if ps is None or slow is None or not isinstance(getattr(ps, "buf", None), bytearray) \
            or getattr(ps, "state", None) != _AWAITING_CONTROL_LINE:
        return
    stats = nc.stats
    data_frame = _DATA_FRAME.match

    async def parse(data: bytes = b"") -> None:
        buf: bytearray = ps.buf  # reset() replaces it on reconnect: look it up each time
        buf.extend(data)
        if ps.state != _AWAITING_CONTROL_LINE:  # nats-py's parser read a frame's line, not yet its payload
            total, hlen = ps.needed, ps.header_needed
            if len(buf) < total + 2:
                return
            arg = ps.msg_arg
            hdr, payload = (bytes(buf[:hlen]) if hlen else None), bytes(buf[hlen:total])
            del buf[:total + 2]
            ps.header_needed, ps.state = 0, _AWAITING_CONTROL_LINE
            await deliver(arg["sid"], arg["subject"], arg["reply"], payload, hdr)
            buf = ps.buf
        pos, size = 0, len(buf)
        partial = False  # a frame's start is here, its end is not: wait for the next read
        while pos < size:
            m = data_frame(buf, pos)
            if m is not None and (reader := readers.get(int(m[2]))) is not None:
                start = m.end()
                end = start + int(m[7])
                if end + 2 > size:
                    partial = True
                    break
                hlen = int(m[6])
                if end > start + hlen:  # data, not a status
                    pos = end + 2
                    stats["in_msgs"] += 1
                    stats["in_bytes"] += end - start - hlen
                    # One copy of the payload (a bytearray slice), decoded as it is.
                    if not reader._on_frame(m[1], int(m[3]), int(m[4]), m[5], buf[start + hlen:end]):
                        continue
                    del buf[:pos]  # the buffer is consistent before any await
                    pos, size = 0, len(buf)
                    await reader._fill()
                    buf = ps.buf
                    size = len(buf)
                    continue
            if buf.startswith(b"HMSG ", pos):
                headers = True
            elif buf.startswith(b"MSG ", pos):
                headers = False
            else:
                break
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                partial = True
                break
            args = buf[pos + (5 if headers else 4):eol].split()
            if len(args) not in ((4, 5) if headers else (3, 4)):
                break  # nats-py's parser raises its ProtocolError about it
            try:
                total = int(args[-1])
                hlen = int(args[-2]) if headers else 0
                sid = int(args[1])
            except ValueError:
                break  # the same
            start = eol + 2
            end = start + total
            if end + 2 > size:
                partial = True  # the payload is not all here yet
                break
            has_reply = len(args) == (5 if headers else 4)
            payload = bytes(buf[start + hlen:end])
            pos = end + 2
            reader = readers.get(sid)
            if reader is not None and payload:
                stats["in_msgs"] += 1
                stats["in_bytes"] += end - start - hlen
                # The split's own bytearrays: _on_data only splits, compares and decodes them.
                if not reader._on_data(args[0], args[2] if has_reply else b"", payload):
                    continue
                del buf[:pos]  # the buffer is consistent before any await
                pos, size = 0, len(buf)
                await reader._fill()
            else:
                hdr = bytes(buf[start:start + hlen]) if hlen else None
                del buf[:pos]
                pos, size = 0, len(buf)
                await deliver(sid, bytes(args[0]), bytes(args[2]) if has_reply else b"", payload, hdr)
            buf = ps.buf
            size = len(buf)
        if pos:
            del buf[:pos]
        if buf and not partial:
            await slow(b"")

    ps.parse = parse

