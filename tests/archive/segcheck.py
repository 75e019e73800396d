"""An independent reader of the archive format, for the fault tests: it does NOT import events/archive.py.

It reads the layout events/archive.py documents in its docstring, from scratch: per segment a
`<first>-<last>.json` manifest (sha256 and size of the .seg file) and the `.seg` file, `b"CRLSEG"`,
a big-endian u16 format, then one zlib stream of records `>QQHI` (seq, stream time ns, subject
length, data length) + subject + data. A .seg without its manifest is not a segment (a writer's
leftover). Whatever does not check out raises AssertionError naming the file.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import struct
import zlib
from pathlib import Path

Rec = tuple[int, str, int, bytes]  # seq, subject, stream time ns, data


def read_archive(path: Path) -> list[Rec]:
    """Every record of every whole segment under `path`, in file-name order, each checked."""
    out: list[Rec] = []
    if not path.is_dir():
        return out
    for manifest in sorted(path.glob("*.json")):
        m = json.loads(manifest.read_text())
        seg = manifest.with_suffix(".seg")
        assert m["segment"] == seg.name, f"{manifest}: names {m['segment']}"
        blob = seg.read_bytes()
        assert len(blob) == m["bytes"] and hashlib.sha256(blob).hexdigest() == m["sha256"], f"{seg}: checksum"
        assert blob[:6] == b"CRLSEG" and struct.unpack(">H", blob[6:8])[0] == m["format"] == 1, f"{seg}: header"
        raw = zlib.decompress(blob[8:])
        recs: list[Rec] = []
        at = 0
        while at < len(raw):
            seq, ts, slen, dlen = struct.unpack_from(">QQHI", raw, at)
            at += 22
            recs.append((seq, raw[at:at + slen].decode(), ts, raw[at + slen:at + slen + dlen]))
            at += slen + dlen
        assert at == len(raw), f"{seg}: trailing bytes"
        assert len(recs) == m["count"] and recs[0][0] == m["first_seq"] and recs[-1][0] == m["last_seq"], seg
        assert (recs[0][2], recs[-1][2]) == (m["first_time_ns"], m["last_time_ns"]), seg
        assert seg.name == f"{m['first_seq']:012d}-{m['last_seq']:012d}.seg", seg
        out += recs
    return out


def check_prefix(archived: list[Rec], stream: dict[int, Rec]) -> None:
    """The archive is the stream's prefix: positions 1..N, each once, in order, byte-equal to the stream's."""
    seqs = [r[0] for r in archived]
    assert seqs == list(range(1, len(seqs) + 1)), (
        f"archive positions are not 1..{len(seqs)} once each: "
        f"{[(a, b) for a, b in itertools.pairwise(seqs) if b != a + 1][:5]}")
    for r in archived:
        assert stream.get(r[0]) == r, f"seq {r[0]}: archive {r!r} != stream {stream.get(r[0])!r}"


async def read_stream(url: str, stream: str = "CORRAL") -> dict[int, Rec]:
    """Every message the stream holds, by position, with nats-py alone (an ephemeral pull consumer): the
    stream time comes from the reply subject, in ns (`$JS.ACK.<stream>.<consumer>.<n>.<sseq>.<dseq>.<ns>.<left>`)."""
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(stream)
        out: dict[int, Rec] = {}
        if info.state.messages == 0:
            return out
        sub = await js.pull_subscribe("corral.>", durable=None, stream=stream,
                                      config=ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL))
        try:
            while len(out) < info.state.messages:
                for msg in await sub.fetch(500, timeout=5):
                    t = msg.reply.split(".")
                    o = 0 if len(t) == 9 else 2
                    seq = int(t[5 + o])
                    out[seq] = (seq, msg.subject, int(t[7 + o]), msg.data)
        finally:
            await sub.unsubscribe()
        return out
    finally:
        await nc.close()
