"""The archive: the log's older positions in compressed segment files, so the stream can be bounded.

Retention (#28) may drop from the stream only what the archive holds. The
archiver (orchestrator/archiver.py) writes the stream's events here, in order
and exactly once, in segments; readers that need a position the stream no
longer holds read it here (events/history.py).

Layout: a directory (local disk or shared storage) holding, per segment,

* `<first>-<last>.seg` (first and last seq, 12 digits each): the magic
  `b"CRLSEG"`, the format as a big-endian u16, then one zlib stream of the
  records, each `>QQHI` (seq, stream time in ns, subject length, data length)
  followed by the subject (UTF-8) and the data: the payload bytes the stream
  held, exactly (not re-encoded, so a read gives back what the stream stored;
  the only header corral stores, Nats-Msg-Id, is the event's own event_id);
* `<first>-<last>.json`: its manifest (`Manifest`: format, writer version,
  first/last seq, first/last stream time in ns, count, byte size and sha256
  of the .seg file).

Atomic, so a crash anywhere leaves a whole segment or none: each file is
written to a temp name, fsynced, renamed, and the directory fsynced; the
manifest goes last. A segment counts only once its manifest exists; a .seg
without one (a crash between the two renames) and temp files are leftovers
that the next writer removes. A writer resumes after the last whole segment,
and refuses records at or below it: no gap, no duplicate.

A reader verifies every segment it reads: the manifest's sha256 and size, then
that the records are the manifest's (count, first, last, in order). A segment
that fails is refused, naming the file (SegmentRefused), never folded. A
segment or manifest of a newer format is refused with "written by a newer
corral".
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import struct
import zlib
from collections.abc import AsyncGenerator, Iterator, Sequence
from contextlib import aclosing
from pathlib import Path

import msgspec

from events.bus import Bus
from events.bus.read import EphemeralConsumers
from events.bus.reader import Reader

#: The segment format this corral writes and the newest it reads.
FORMAT = 1
MAGIC = b"CRLSEG"
_HEAD = struct.Struct(">6sH")
_RECORD = struct.Struct(">QQHI")
_SEG = ".seg"
_MANIFEST = ".json"
_TMP = ".tmp"


def _writer_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"corral {version('corral')}"
    except PackageNotFoundError:
        return "corral (not installed)"


class Record(msgspec.Struct, frozen=True, gc=False):
    """One stored message: its position, subject, stream time (ns) and payload bytes as the stream held them."""

    seq: int
    subject: str
    time_ns: int
    data: bytes


class Manifest(msgspec.Struct, frozen=True):
    """What a segment holds, and how to check it."""

    format: int
    writer: str
    segment: str
    first_seq: int
    last_seq: int
    first_time_ns: int
    last_time_ns: int
    count: int
    bytes: int
    sha256: str


_manifest_encoder = msgspec.json.Encoder()
_manifest_decoder = msgspec.json.Decoder(Manifest)


class ArchiveError(RuntimeError):
    """The archive cannot be used as asked (a refused segment, a newer format, records out of order)."""


class SegmentRefused(ArchiveError):
    """A segment (or its manifest) failed its check: it is not read, and its positions are not folded."""

    def __init__(self, path: Path, why: str, first_seq: int = 0, last_seq: int = 0) -> None:
        super().__init__(f"segment {path}: {why}")
        self.path = path
        self.first_seq = first_seq
        self.last_seq = last_seq


def encode_segment(records: Sequence[Record], level: int = 6) -> bytes:
    """The bytes of a .seg file holding `records` (see the module docstring for the layout)."""
    parts: list[bytes] = []
    for r in records:
        subject = r.subject.encode()
        parts += [_RECORD.pack(r.seq, r.time_ns, len(subject), len(r.data)), subject, r.data]
    return _HEAD.pack(MAGIC, FORMAT) + zlib.compress(b"".join(parts), level)


def decode_segment(path: Path, blob: bytes) -> list[Record]:
    """The records of a .seg file's bytes; SegmentRefused (naming `path`) if they are not a segment."""
    if len(blob) < _HEAD.size:
        raise SegmentRefused(path, "truncated (no header)")
    magic, fmt = _HEAD.unpack_from(blob)
    if magic != MAGIC:
        raise SegmentRefused(path, "not a corral archive segment (bad magic)")
    if fmt > FORMAT:
        raise SegmentRefused(path, f"written by a newer corral (segment format {fmt}; this corral reads up to "
                                   f"{FORMAT}): upgrade corral to read it")
    try:
        raw = zlib.decompress(blob[_HEAD.size:])
    except zlib.error as e:
        raise SegmentRefused(path, f"cannot decompress ({e})") from None
    out: list[Record] = []
    at, end = 0, len(raw)
    while at < end:
        if at + _RECORD.size > end:
            raise SegmentRefused(path, f"truncated record at byte {at}")
        seq, ts, slen, dlen = _RECORD.unpack_from(raw, at)
        at += _RECORD.size
        if at + slen + dlen > end:
            raise SegmentRefused(path, f"truncated record at seq {seq}")
        try:
            subject = raw[at:at + slen].decode()
        except UnicodeDecodeError:
            raise SegmentRefused(path, f"unreadable subject at seq {seq}") from None
        out.append(Record(seq, subject, ts, raw[at + slen:at + slen + dlen]))
        at += slen + dlen
    return out


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, data: bytes) -> None:
    """`data` at `path`, whole or not at all: temp file, fsync, rename, fsync the directory."""
    tmp = path.with_name(path.name + _TMP)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)


def _stem(first: int, last: int) -> str:
    return f"{first:012d}-{last:012d}"


class Archive:
    """The segments under `path`. Readers: `segments`, `read`, `records`. The one writer: `append`."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def _manifest(self, file: Path) -> Manifest:
        try:
            m = _manifest_decoder.decode(file.read_bytes())
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise SegmentRefused(file, f"unreadable manifest ({e})") from None
        if m.format > FORMAT:
            raise SegmentRefused(file, f"written by a newer corral ({m.writer}, segment format {m.format}; this "
                                       f"corral reads up to {FORMAT}): upgrade corral to read it",
                                 m.first_seq, m.last_seq)
        if m.segment != file.with_suffix(_SEG).name or m.first_seq > m.last_seq or m.count < 1:
            raise SegmentRefused(file, "manifest does not describe its segment", m.first_seq, m.last_seq)
        return m

    def segments(self) -> list[Manifest]:
        """The whole segments, in log order. A manifest that cannot be read is refused (SegmentRefused)."""
        if not self.path.is_dir():
            return []
        found = sorted(p for p in self.path.iterdir() if p.name.endswith(_MANIFEST))
        out = [self._manifest(p) for p in found]
        out.sort(key=lambda m: m.first_seq)
        for a, b in itertools.pairwise(out):
            if b.first_seq <= a.last_seq:
                raise SegmentRefused(self.path / b.segment, f"overlaps segment {a.segment}", b.first_seq, b.last_seq)
        return out

    def last_seq(self) -> int:
        """The last position archived (0: none)."""
        segs = self.segments()
        return segs[-1].last_seq if segs else 0

    def read(self, m: Manifest) -> list[Record]:
        """A segment's records, checked against its manifest; SegmentRefused names the file if they do not match."""
        path = self.path / m.segment
        try:
            blob = path.read_bytes()
        except OSError as e:
            raise SegmentRefused(path, f"cannot read it ({e.strerror or e})", m.first_seq, m.last_seq) from None
        if len(blob) != m.bytes or hashlib.sha256(blob).hexdigest() != m.sha256:
            raise SegmentRefused(path, "checksum mismatch (its sha256 or size is not its manifest's); refused, "
                                       "not read", m.first_seq, m.last_seq)
        try:
            records = decode_segment(path, blob)
        except SegmentRefused as e:
            raise SegmentRefused(path, str(e).split(": ", 1)[1], m.first_seq, m.last_seq) from None
        seqs = [r.seq for r in records]
        if (len(records) != m.count or seqs[0] != m.first_seq or seqs[-1] != m.last_seq
                or any(b <= a for a, b in itertools.pairwise(seqs))):
            raise SegmentRefused(path, "its records are not what its manifest says", m.first_seq, m.last_seq)
        return records

    def records(self, from_seq: int = 1, to_seq: int | None = None) -> Iterator[Record]:
        """The archived records from `from_seq` to `to_seq`, in order (segments read one at a time)."""
        for m in self.segments():
            if m.last_seq < from_seq:
                continue
            if to_seq is not None and m.first_seq > to_seq:
                return
            for r in self.read(m):
                if r.seq >= from_seq and (to_seq is None or r.seq <= to_seq):
                    yield r

    # -- writing (one writer: the archiver) ------------------------------------------------

    def clean(self) -> list[Path]:
        """Remove what a crashed writer left (temp files, a .seg without manifest); the paths removed."""
        if not self.path.is_dir():
            return []
        removed = []
        for p in self.path.iterdir():
            orphan = p.name.endswith(_SEG) and not p.with_suffix(_MANIFEST).exists()
            if p.name.endswith(_TMP) or orphan:
                p.unlink(missing_ok=True)
                removed.append(p)
        return removed

    def append(self, records: Sequence[Record], *, after: int | None = None) -> Manifest:
        """Write `records` (ascending, all after the archive's last position) as one segment; its manifest.

        `after`: the caller's idea of the last archived position (saves listing the directory).
        Raises OSError (a full disk, say) with nothing half-written left behind as a segment.
        """
        if not records:
            raise ArchiveError("an empty segment")
        last = self.last_seq() if after is None else after
        seqs = [r.seq for r in records]
        if seqs[0] <= last or any(b <= a for a, b in itertools.pairwise(seqs)):
            raise ArchiveError(f"records {seqs[0]}..{seqs[-1]} are not in order after the archive's last "
                               f"position {last}")
        self.path.mkdir(parents=True, exist_ok=True)
        stem = _stem(seqs[0], seqs[-1])
        blob = encode_segment(records)
        manifest = Manifest(format=FORMAT, writer=_writer_version(), segment=stem + _SEG, first_seq=seqs[0],
                            last_seq=seqs[-1], first_time_ns=records[0].time_ns, last_time_ns=records[-1].time_ns,
                            count=len(records), bytes=len(blob), sha256=hashlib.sha256(blob).hexdigest())
        seg = self.path / (stem + _SEG)
        try:
            _write_atomic(seg, blob)
            _write_atomic(self.path / (stem + _MANIFEST), _manifest_encoder.encode(manifest))
        except BaseException:
            if not (self.path / (stem + _MANIFEST)).exists():
                with contextlib.suppress(OSError):
                    seg.unlink()
            raise
        return manifest


# -- reading the stream as stored (the archiver's input) ----------------------------------------


class _RawReader(Reader):
    """The bus's reader (same pull requests, recovery and exactly-once resume), handing out Records:
    the payload bytes as stored, not decoded events. `Reader._on_frame`, without the decode."""

    def _on_frame(self, subject: bytes | bytearray, sseq: int, ts: int, pending: bytes | bytearray,
                  data: bytes | bytearray) -> bool:
        if self._end_seen or self._reset_reason is not None:
            return False
        try:
            self._want -= 1
            self._buf.append(Record(sseq, subject.decode(), ts, bytes(data)))
            if self._waiting:
                self._waiting = False
                self._wake.set()
            return self._want <= self.batch and len(self._buf) < self._high
        except Exception as e:  # surfaced by batches()
            self._error = e
            self._wake.set()
            return False


async def stored_records(bus: Bus, from_seq: int, *, batch: int = 1000) -> AsyncGenerator[list[Record], None]:
    """The stream's messages from `from_seq` on, as stored, in batches; follows the stream forever.

    Each message is handed out once and in order across the reader's own resets (events/bus/reader.py);
    a message deleted from the stream is not (the caller sees the jump in positions).
    """
    consumers = EphemeralConsumers(bus.link, None, from_seq=max(1, from_seq), since=None)
    reader = _RawReader(bus.readers, consumers, batch=batch, end=None, stall_timeout=None)
    async with aclosing(reader.batches()) as batches:
        async for items in batches:
            yield items
