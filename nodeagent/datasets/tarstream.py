"""A streaming tar reader of corral's own (issue #39): every byte counted, every member checked, nothing buffered.

`inflate` undoes gzip, bzip2 or xz (or nothing) as the bytes arrive, in
bounded steps, counting what comes out against the staging's Limits (total
bytes, and the ratio to what was fetched: a decompression bomb stops within
one step of passing it). `extract` reads ustar, GNU and pax headers from that
stream and writes members through SafeTree (safetree.py: every path component
opened by it, with O_NOFOLLOW). Header extensions (long names, pax records)
are capped at PAX_MAX bytes, sparse files, devices, fifos and multi-volume
members are refused, and every file's bytes are counted before they are
written. Python's tarfile is not used: its stream mode buffers a header's
declared size in memory, and its filters check paths after resolving them.
"""

from __future__ import annotations

import bz2
import lzma
import os
import zlib
from collections.abc import Callable
from typing import Any, Protocol

from nodeagent.datasets.limits import Meter
from nodeagent.datasets.safetree import SafeTree, UnsafeMember, clean

BLOCK = 512
#: Bytes read from the source, and most bytes out of the decompressor, per step.
STEP = 1 << 18
#: Most bytes of one long name or one pax header (GNU tar writes a few hundred).
PAX_MAX = 1 << 20

GZIP, BZIP2, XZ = b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00"


class ArchiveError(Exception):
    """Not a readable archive (truncated, a bad checksum, a refused member): the message says which member."""


class Source(Protocol):
    def read(self, n: int, /) -> bytes: ...


class Inflated:
    """The decompressed bytes of `raw` (gzip, bzip2, xz by their magic; else as they are), `read(n)` at a time."""

    def __init__(self, raw: Source, meter: Meter, head: bytes = b"") -> None:
        self.raw, self.meter = raw, meter
        self.pending = head
        self.kind = ""
        self.d: Any = None
        self.done = False
        self.compressed = False
        first = self._more(6)
        if first.startswith(GZIP):
            self.kind = "gzip"
        elif first.startswith(BZIP2):
            self.kind = "bzip2"
        elif first.startswith(XZ):
            self.kind = "xz"
        self.compressed = bool(self.kind)
        if self.kind:
            self.d = self._new()

    def _more(self, n: int) -> bytes:
        while len(self.pending) < n:
            b = self.raw.read(STEP)
            if not b:
                break
            self.pending += b
        return self.pending

    def _new(self) -> Any:
        if self.kind == "gzip":
            return zlib.decompressobj(31)
        if self.kind == "bzip2":
            return bz2.BZ2Decompressor()
        return lzma.LZMADecompressor()

    def read(self, n: int) -> bytes:
        n = min(n, STEP)
        if self.d is None:  # plain tar
            if not self.pending:
                self.pending = self.raw.read(STEP)
            out, self.pending = self.pending[:n], self.pending[n:]
            self.meter.unpack(len(out))
            return out
        while not self.done:
            out = self._step(n)
            if out:
                self.meter.unpack(len(out))
                return out
        return b""

    def _step(self, n: int) -> bytes:
        d = self.d
        assert d is not None
        if d.eof:
            rest = d.unused_data + self.pending
            self.pending = rest
            rest = self._more(6)
            self.pending = b""
            if rest.startswith({"gzip": GZIP, "bzip2": BZIP2, "xz": XZ}[self.kind]):
                self.d = self._new()  # a concatenated stream (pigz, pbzip2, multi-member gzip)
                self.pending = rest
            else:
                self.done = True  # trailing bytes after the stream: ignored, as gzip -d does
            return b""
        try:
            if self.kind == "gzip":
                data = d.unconsumed_tail or self.pending or self.raw.read(STEP)
                self.pending = b""
                if not data:
                    out: bytes = d.flush()  # (what the last input made and the step had no room for: bounded)
                    if out or d.eof:
                        return out
                    raise ArchiveError(f"the {self.kind} stream ends before its end marker (truncated)")
                return bytes(d.decompress(data, n))
            data = b""
            if d.needs_input:
                data = self.pending or self.raw.read(STEP)
                self.pending = b""
                if not data:
                    raise ArchiveError(f"the {self.kind} stream ends before its end marker (truncated)")
            return bytes(d.decompress(data, n))
        except (zlib.error, OSError, lzma.LZMAError, EOFError) as e:
            raise ArchiveError(f"the {self.kind} stream is corrupt: {e}") from None


class Stream:
    """Exact reads out of an Inflated stream (tar's blocks)."""

    def __init__(self, src: Inflated) -> None:
        self.src = src
        self.buf = b""

    def exact(self, n: int, what: str) -> bytes:
        parts = [self.buf]
        have = len(self.buf)
        while have < n:
            b = self.src.read(n - have)
            if not b:
                raise ArchiveError(f"the archive ends in the middle of {what} (truncated)")
            parts.append(b)
            have += len(b)
        data = b"".join(parts)
        self.buf = data[n:]
        return data[:n]

    def chunks(self, n: int, what: str) -> Callable[[], bytes]:
        """A function giving the next piece of the next `n` bytes (b"" once they are all given)."""
        left = [n]

        def nxt() -> bytes:
            if left[0] <= 0:
                return b""
            if self.buf:
                b, self.buf = self.buf[:left[0]], self.buf[left[0]:]
            else:
                b = self.src.read(min(left[0], STEP))
                if not b:
                    raise ArchiveError(f"the archive ends in the middle of {what} (truncated)")
            left[0] -= len(b)
            return b
        return nxt

    def skip(self, n: int, what: str) -> None:
        nxt = self.chunks(n, what)
        while nxt():
            pass

    def at_end(self) -> bool:
        if self.buf:
            return False
        self.buf = self.src.read(STEP)
        return not self.buf


def _padded(n: int) -> int:
    return -n % BLOCK


def _number(field: bytes, what: str) -> int:
    if field and field[0] & 0x80:  # base-256 (GNU): big sizes
        if field[0] == 0xFF:
            raise ArchiveError(f"a negative {what} in a tar header")
        v = field[0] & 0x7F
        for b in field[1:]:
            v = (v << 8) | b
        return v
    s = field.split(b"\0", 1)[0].strip(b" ")
    try:
        return int(s, 8) if s else 0
    except ValueError:
        raise ArchiveError(f"a tar header's {what} is not a number: {s[:20]!r}") from None


def _text(b: bytes) -> str:
    return b.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _pax(data: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        if data[pos] == 0:
            break
        sp = data.find(b" ", pos)
        try:
            length = int(data[pos:sp])
        except ValueError:
            raise ArchiveError("a pax header's record is malformed") from None
        if sp < 0 or length <= 0 or pos + length > len(data):
            raise ArchiveError("a pax header's record is malformed")
        rec = data[sp + 1:pos + length - 1]
        key, eq, value = rec.partition(b"=")
        if not eq:
            raise ArchiveError("a pax header's record is malformed")
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out


_REFUSED = {b"3": "a character device", b"4": "a block device", b"6": "a fifo", b"S": "a GNU sparse file",
            b"M": "a multi-volume continuation", b"V": "a volume label", b"N": "an old GNU long-name record",
            b"D": "a GNU directory dump"}


def extract(raw: Source, dest: str | os.PathLike[str], meter: Meter, head: bytes = b"") -> None:
    """Unpack the tar archive `raw` streams (maybe compressed; `head`: its first bytes, read already) into the
    directory `dest` safely; ArchiveError, UnsafeMember or LimitExceeded say why not."""
    stream = Stream(Inflated(raw, meter, head))
    with SafeTree(dest) as tree:
        _members(stream, tree, meter)
    # The rest (the end-of-archive blocks, padding) is read by the caller, so the digest covers it.


def _members(stream: Stream, tree: SafeTree, meter: Meter) -> None:
    long_name = long_link = ""
    pax: dict[str, str] = {}
    glob: dict[str, str] = {}
    while True:
        if stream.at_end():
            return  # no end-of-archive blocks: tolerated, as GNU tar does
        hdr = stream.exact(BLOCK, "a header")
        if hdr == b"\0" * BLOCK:
            return  # the end-of-archive marker
        want = _number(hdr[148:156], "checksum")
        got = sum(hdr[:148]) + 8 * 32 + sum(hdr[156:])
        if want != got and want != sum((b - 256 if b > 127 else b) for b in hdr[:148] + b" " * 8 + hdr[156:]):
            raise ArchiveError("a tar header's checksum is wrong: not a tar archive, or a corrupt one")
        typ = hdr[156:157]
        size = _number(hdr[124:136], "size")
        if typ in (b"L", b"K", b"x", b"g"):
            if size > PAX_MAX:
                raise ArchiveError(f"a tar header extension of {size} bytes (at most {PAX_MAX})")
            data = stream.exact(size, "a header extension")
            stream.skip(_padded(size), "padding")
            if typ == b"L":
                long_name = _text(data)
            elif typ == b"K":
                long_link = _text(data)
            elif typ == b"x":
                pax = _pax(data)
            else:
                glob.update(_pax(data))
            continue
        meta = glob | pax
        if any(k.startswith("GNU.sparse") for k in meta):
            raise UnsafeMember("the archive holds a sparse file (refused: its size is not its bytes)")
        name = meta.get("path") or long_name
        if not name:
            name = _text(hdr[0:100])
            if hdr[257:262] == b"ustar" and hdr[345:500].strip(b"\0"):
                name = _text(hdr[345:500]) + "/" + name
        link = meta.get("linkpath") or long_link or _text(hdr[157:257])
        if "size" in meta:
            try:
                size = int(meta["size"])
            except ValueError:
                raise ArchiveError(f"member {name!r}: a pax size that is not a number") from None
        mode = _number(hdr[100:108], "mode")
        long_name = long_link = ""
        pax = {}
        meter.member()
        _member(stream, tree, meter, typ, name, link, size, mode)


def _member(stream: Stream, tree: SafeTree, meter: Meter, typ: bytes, name: str, link: str, size: int,
            mode: int) -> None:
    if typ in _REFUSED:
        raise UnsafeMember(f"member {name!r} is {_REFUSED[typ]} (only files, directories and links are kept)")
    parts = clean(name, root_ok=typ == b"5")
    if typ == b"5":
        if parts:  # (`./`, the directory itself, as `tar -C dir .` writes first: nothing to make)
            tree.mkdir(parts)
        stream.skip(size + _padded(size), f"member {name!r}")
        return
    if typ == b"2":
        tree.symlink(parts, link)
        stream.skip(size + _padded(size), f"member {name!r}")
        return
    if typ == b"1":
        try:
            src = clean(link)
        except UnsafeMember:
            raise UnsafeMember(f"member {name!r} is a hard link to {link!r}, outside the dataset's directory") from None
        tree.hardlink(parts, src)
        stream.skip(size + _padded(size), f"member {name!r}")
        return
    # "0", "\0", "7" and any other type: a regular file (POSIX: unknown types are read as files)
    meter.write(size)
    fd = tree.create(parts, executable=bool(mode & 0o111))
    try:
        nxt = stream.chunks(size, f"member {name!r}")
        while b := nxt():
            view = memoryview(b)
            while view:
                view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    stream.skip(_padded(size), f"member {name!r}")


__all__ = ["ArchiveError", "Inflated", "UnsafeMember", "extract"]
