"""Bring one dataset's bytes into a temporary directory: copy a directory, or download and unpack an archive.

Blocking (the stager runs it in a thread); s3:// sources are s3.py's (the optional extra corral[s3]). One pass over the bytes where the
format allows: a tar archive (plain, gz, bz2, xz) is hashed and unpacked as it
streams in, as `curl | tar x` would; a zip needs its central directory, so it
is downloaded first. The digest is checked before the caller may rename the
directory into the cache; any failure raises StagingError with a reason a
user can act on, and leaves only the temporary directory (the caller deletes it).
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import io
import os
import shutil
import stat
import threading
import urllib.error
import urllib.request
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from nodeagent.datasets.limits import LimitExceeded, Limits, Meter
from nodeagent.datasets.safetree import SafeTree, UnsafeMember, clean
from nodeagent.datasets.tarstream import ArchiveError, extract
from nodeagent.datasets.verify import CHUNK, manifest_digest
from schemas.datasets import Dataset, source_scheme

#: (bytes done, bytes total or 0): called from the staging thread, often; the stager samples it.
Progress = Callable[[int, int], None]

#: Seconds a connection or a read may stall before the download fails.
HTTP_TIMEOUT_S = 30.0
ZIP_MAGIC = b"PK\x03\x04"


class StagingError(Exception):
    """Why a dataset could not be staged (shown in the job's failure): the source, the digest, the disk."""

    #: The same source would fail the same way on any node (a hostile archive, a limit passed):
    #: the job fails at once, never restarted elsewhere (DatasetFailed.permanent).
    permanent = False


class Refused(StagingError):
    """The source's content is refused: an unsafe archive, a limit passed (permanent). A digest mismatch is not:
    a directory source differs per node, and a download may have been damaged on the way (#33 retries it)."""

    permanent = True


class DiskFull(StagingError):
    """The disk holding the cache filled up while staging (the stager evicts what it may and tries once more)."""


class Stopped(StagingError):
    """The agent is stopping: staging gave up, nothing was kept."""


def stage(ds: Dataset, dest: Path, progress: Progress, stop: threading.Event, *,
          s3_endpoint_url: str | None = None, limits: Limits | None = None) -> int:
    """Put `ds`'s content into the empty directory `dest`, verified; returns the bytes read from the source.
    `s3_endpoint_url`: where s3:// sources are (None: the AWS chain's own, e.g. AWS_ENDPOINT_URL); `limits`:
    what it may take (limits.py; time and memory are the supervisor's, supervise.py)."""
    scheme = source_scheme(ds.source)
    lim = limits or Limits()
    try:
        if scheme == "file":
            return _copy_dir(Path(ds.source.removeprefix("file://")), dest, ds.sha256, progress, stop)
        if scheme in ("http", "https"):
            return _download(ds.source, dest, ds.sha256, progress, stop, lim)
        if scheme == "s3":
            from nodeagent.datasets.s3 import stage_s3  # (it imports this module; boto3 only when it is used)

            return stage_s3(ds.source, dest, ds.sha256, progress, stop, s3_endpoint_url, lim)
        raise StagingError(f"unsupported source {ds.source!r}")
    except LimitExceeded as e:
        raise Refused(f"{ds.source}: {e}") from None
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFull(f"no space left in the dataset cache ({dest.parents[2]}) while staging "
                               f"{ds.source}: {e.strerror}") from None
        raise StagingError(f"staging {ds.source} failed: {e}") from None


def _check(stop: threading.Event) -> None:
    if stop.is_set():
        raise Stopped("the agent is stopping")


def _copy_dir(src: Path, dest: Path, sha256: str, progress: Progress, stop: threading.Event) -> int:
    if not src.is_dir():
        raise StagingError(f"source {src} is not a directory on this node" if src.exists()
                           else f"source {src} does not exist on this node")
    total = sum(f.stat().st_size for f in src.rglob("*") if f.is_file())
    done = 0
    progress(0, total)
    for d, dirs, files in os.walk(src):
        dirs.sort()
        rel = Path(d).relative_to(src)
        (dest / rel).mkdir(parents=True, exist_ok=True)
        for name in sorted(files):
            _check(stop)
            s = Path(d) / name
            if not s.is_file():
                continue  # a socket, a fifo, a dangling link: not data
            _copy_file(s, dest / rel / name, lambda n, base=done: progress(base + n, total))
            done += s.stat().st_size
            progress(done, total)
    check_manifest(dest, sha256, src, "the directory")
    return done


def check_manifest(dest: Path, sha256: str, source: object, what: str) -> None:
    """Raise unless the staged directory `dest` has the spec's manifest digest (none given: nothing to check)."""
    if not sha256:
        return
    got = manifest_digest(dest)
    if got != sha256:
        raise StagingError(f"digest mismatch: the manifest of {source} hashes to sha256:{got}, the spec says "
                           f"sha256:{sha256} ({what} changed, or the digest is wrong)")


#: Most bytes one copy_file_range moves: a progress report each (shared storage may be slow; a big file must
#: not look like a stalled fetch to the supervisor).
COPY_STEP = 64 << 20


def _copy_file(src: Path, dst: Path, copied: Callable[[int], None]) -> None:
    """Copy in the kernel with copy_file_range, as `cp` does (read and write where it cannot); `copied(n)`: the
    bytes of this file copied so far."""
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        left = os.fstat(fi.fileno()).st_size
        got = 0
        try:
            while left > 0:
                n = os.copy_file_range(fi.fileno(), fo.fileno(), min(left, COPY_STEP))
                if n == 0:
                    break
                left -= n
                got += n
                copied(got)
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            fi.seek(0)
            fo.seek(0)
            fo.truncate()
            got = 0
            while b := fi.read(CHUNK):
                fo.write(b)
                got += len(b)
                copied(got)


class _Hashing(io.RawIOBase):
    """A readable stream that hashes and counts what passes through it (the archive's bytes)."""

    def __init__(self, inner: BinaryIO | io.RawIOBase, progress: Progress, total: int, stop: threading.Event, *,
                 hashing: bool, meter: Meter) -> None:
        self.inner, self.progress, self.total, self.stop, self.meter = inner, progress, total, stop, meter
        #: Only with a digest to check: hashing is a third of staging's CPU.
        self.sha = hashlib.sha256() if hashing else None
        self.done = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: memoryview) -> int:  # type: ignore[override]
        _check(self.stop)
        read1 = getattr(self.inner, "read1", None)
        if read1 is not None:
            # What has come, not a full chunk: an HTTP body's readinto waits until `b` is full, so a slow but
            # steady download would tell no progress for a chunk's time and look stalled to the supervisor.
            data = read1(len(b))
            n = len(data)
            b[:n] = data
        else:
            n = self.inner.readinto(b)  # type: ignore[attr-defined]
        if n:
            if self.sha is not None:
                self.sha.update(b[:n])
            self.done += n
            self.meter.fetch(n)
            self.progress(self.done, self.total)
        return n or 0

    def drain(self) -> None:
        """Read to the end (what follows a tar's end marker is still the archive's, and hashed)."""
        while self.read(CHUNK):
            pass


def _download(url: str, dest: Path, sha256: str, progress: Progress, stop: threading.Event, limits: Limits) -> int:
    try:
        # (a stall, a trickle too, is the supervisor's, which sees the progress and kills the staging first)
        resp = urllib.request.urlopen(url, timeout=max(HTTP_TIMEOUT_S, 2 * limits.stall_s))
    except urllib.error.HTTPError as e:
        raise StagingError(f"cannot fetch {url}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        why = e.reason if isinstance(e, urllib.error.URLError) else e
        raise StagingError(f"cannot fetch {url}: {why}") from None
    except http.client.HTTPException as e:
        raise StagingError(f"cannot fetch {url}: the server did not answer in HTTP ({type(e).__name__}: "
                           f"{str(e)[:200]!r})") from None
    with resp:
        total = int(resp.headers.get("Content-Length") or 0) if (resp.headers.get("Content-Length") or "").isdigit() \
            else 0
        if total > limits.fetch_limit():
            raise Refused(f"{url} is {total} bytes (Content-Length), more than the {limits.fetch_limit()} a staging "
                          "may fetch here (--dataset-cache-bytes, --dataset-max-bytes)")
        return unpack_archive(url, resp, total, dest, sha256, progress, stop, limits)


def unpack_archive(url: str, raw: BinaryIO | io.RawIOBase, total: int, dest: Path, sha256: str, progress: Progress,
                   stop: threading.Event, limits: Limits | None = None) -> int:
    """Unpack the archive `raw` streams (`total` bytes, 0: not told) into `dest`, hashing it on the way; the
    bytes read. Limits (limits.py) are enforced as the bytes stream; members are written safely (tarstream.py,
    safetree.py). A broken stream raises StagingError."""
    progress(0, total)
    meter = Meter(limits or Limits())
    body = _Hashing(raw, progress, total, stop, hashing=bool(sha256), meter=meter)
    stream = io.BufferedReader(body, CHUNK)
    try:
        if stream.peek(4)[:4] == ZIP_MAGIC:
            _unzip(stream, body, dest, meter)
        else:
            extract(stream, dest, meter)
            body.drain()
    except (ArchiveError, zipfile.BadZipFile, EOFError, zlib.error) as e:
        raise Refused(f"{url} is not a readable tar or zip archive: {e}") from None
    except UnsafeMember as e:
        raise Refused(f"{url}: refused: {e}") from None
    except LimitExceeded as e:
        raise Refused(f"{url}: {e}") from None
    except (TimeoutError, ConnectionError, http.client.HTTPException) as e:
        raise StagingError(f"download of {url} broke off after {body.done} bytes: {type(e).__name__}: {e}") from None
    if total and body.done != total:
        raise StagingError(f"download of {url} ended after {body.done} of {total} bytes")
    got = body.sha.hexdigest() if body.sha is not None else ""
    if sha256 and got != sha256:
        raise StagingError(f"digest mismatch: {url} hashes to sha256:{got}, the spec says sha256:{sha256}")
    return body.done


def _unzip(stream: io.BufferedIOBase, body: _Hashing, dest: Path, meter: Meter) -> None:
    """A zip needs its central directory (at its end): downloaded (within the fetch limit) beside `dest`,
    then its members written as a tar's are (safetree.py), counted as they inflate."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = dest.parent / ".archive.zip"
    with open(archive, "wb") as f:
        shutil.copyfileobj(stream, f, CHUNK)
    body.drain()
    body.progress(body.done, body.done)  # (fetched: what follows is no stall)
    try:
        with zipfile.ZipFile(archive) as z, SafeTree(dest) as tree:
            declared = sum(info.file_size for info in z.infolist())
            if declared > meter.limits.max_bytes:  # (refused before a byte is inflated; inflating counts anyway)
                raise LimitExceeded(f"the zip's members declare {declared} bytes, more than the {meter.limits.max_bytes}"
                                    " a dataset may take here (--dataset-max-bytes, --dataset-cache-bytes)")
            for info in z.infolist():
                meter.member()
                parts = clean(info.filename, root_ok=info.is_dir())
                kind = stat.S_IFMT(info.external_attr >> 16)
                if info.is_dir():
                    tree.mkdir(parts)
                elif kind == stat.S_IFLNK:
                    if info.file_size > 4096:
                        raise UnsafeMember(f"member {info.filename!r} is a link of {info.file_size} bytes")
                    tree.symlink(parts, z.read(info).decode("utf-8", "surrogateescape"))
                elif kind not in (0, stat.S_IFREG):
                    raise UnsafeMember(f"member {info.filename!r} is not a file, directory or link")
                else:
                    _unzip_file(z, info, tree, parts, meter)
    finally:
        archive.unlink(missing_ok=True)


def _unzip_file(z: zipfile.ZipFile, info: zipfile.ZipInfo, tree: SafeTree, parts: tuple[str, ...],
                meter: Meter) -> None:
    fd = tree.create(parts, executable=bool((info.external_attr >> 16) & 0o111))
    try:
        with z.open(info) as src:
            while b := src.read(CHUNK):
                meter.unpack(len(b))
                meter.write(len(b))
                view = memoryview(b)
                while view:
                    view = view[os.write(fd, view):]
    finally:
        os.close(fd)
