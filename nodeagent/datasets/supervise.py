"""Run one staging in its own process and hold it to its limits (issue #39).

The agent never touches a dataset's bytes itself: child.py fetches and
unpacks under an address-space limit, and dies with the agent. This side
reads its progress and kills it (SIGKILL to its process group) when the
staging takes longer than `timeout_s`, when its fetch stalls (fewer than
`stall_bytes` in `stall_s` while bytes are still due: a dead server, or one
trickling a byte every few seconds), when the agent stops, or when the
staging is cancelled (no job here wants it any more). Whatever it left in its
directory is the caller's to delete; the agent stays up whatever happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import structlog

from nodeagent.datasets.fetch import DiskFull, Refused, StagingError, Stopped
from nodeagent.datasets.limits import Limits
from schemas.datasets import Dataset

log = structlog.get_logger("corral.datasets")

#: Seconds between two looks at the clock while the child is quiet.
POLL_S = 0.25
#: Most bytes of the child's stderr kept (for a crash's reason).
STDERR_TAIL = 4096


async def size_in_child(ds: Dataset, stop: threading.Event, *, limits: Limits,
                        s3_endpoint_url: str | None = None) -> int:
    """What staging `ds` will need as far as its source says (a HEAD, an S3 listing: stager.expected_bytes),
    asked by a child within `stall_s`; 0: not known (the staging itself says what is wrong)."""
    quick = dataclasses.replace(limits, timeout_s=min(limits.timeout_s, limits.stall_s), stall_bytes=0)
    try:
        return await stage_in_child(ds, Path("/nonexistent"), lambda _d, _t: None, stop, limits=quick,
                                    s3_endpoint_url=s3_endpoint_url, size_only=True)
    except Stopped:
        raise
    except StagingError:
        return 0


async def stage_in_child(ds: Dataset, dest: Path, progress: Callable[[int, int], None], stop: threading.Event, *,
                         limits: Limits, s3_endpoint_url: str | None = None, size_only: bool = False) -> int:
    """Stage `ds` into `dest` in a child process (child.py); the bytes read, or StagingError (Refused for a
    limit passed, DiskFull, Stopped) saying why."""
    req = msgspec.json.encode({"dataset": ds, "dest": str(dest), "limits": dataclasses.asdict(limits),
                               "s3_endpoint_url": s3_endpoint_url, "parent": os.getpid(), "size_only": size_only})
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "nodeagent.datasets.child", stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    tail = bytearray()
    errs = asyncio.ensure_future(_tail(proc.stderr, tail))
    try:
        proc.stdin.write(req)
        with contextlib.suppress(ConnectionError):
            await proc.stdin.drain()
        proc.stdin.close()
        result = await _watch(ds, proc.stdout, progress, stop, limits)
        if result is None:
            await proc.wait()
            rc = proc.returncode or 0
            why = f"signal {-rc}" if rc < 0 else f"exit {rc}"
            last = bytes(tail).decode(errors="replace").strip().splitlines()[-1:] or [""]
            # Killed by a signal not ours (the OOM killer, a crash in a decompressor): what the data did to it,
            # as it would anywhere; an exit without a result is the child's own trouble (a restart may mend it).
            raise (Refused if rc < 0 else StagingError)(
                f"staging {ds.source} ended without a result ({why}) {last[0][:300]}".rstrip())
        if "ok" in result:
            return int(result["ok"])
        reason = str(result.get("error", "no reason given"))
        if result.get("kind") == "disk_full":
            raise DiskFull(reason)
        raise (Refused if result.get("permanent") else StagingError)(reason)
    finally:
        _kill(proc)
        with contextlib.suppress(Exception):
            await asyncio.shield(proc.wait())
        errs.cancel()


async def _watch(ds: Dataset, out: asyncio.StreamReader, progress: Callable[[int, int], None],
                 stop: threading.Event, limits: Limits) -> dict[str, Any] | None:
    """Follow the child's lines until its result (None: it ended without one); raise at a limit."""
    t0 = mark_t = time.monotonic()
    mark_b = done = total = 0
    #: The child told it is about to fetch (before that: its interpreter starting, which only the timeout bounds).
    started = False
    while True:
        try:
            line = await asyncio.wait_for(out.readline(), POLL_S)
        except TimeoutError:
            line = None
        except ValueError:  # a line past the reader's limit: not ours to trust
            return None
        if line == b"":
            return None
        now = time.monotonic()
        if line:
            try:
                msg = msgspec.json.decode(line)
            except msgspec.DecodeError:
                msg = None
            if isinstance(msg, dict):
                if "p" in msg:
                    done, total = int(msg["p"]), int(msg.get("t") or 0)
                    progress(done, total)
                    if done - mark_b >= limits.stall_bytes:
                        mark_t, mark_b = now, done
                elif "started" in msg:
                    started, mark_t = True, now  # (a busy node's interpreter start is not a stalled fetch)
                elif "ok" in msg or "error" in msg:
                    return msg
        if stop.is_set():
            raise Stopped("the agent is stopping")
        if now - t0 > limits.timeout_s:
            raise Refused(f"staging {ds.source} took longer than {limits.timeout_s:g}s (--dataset-timeout), "
                          f"{done} bytes fetched")
        fetching = started and (total == 0 or done < total)
        if fetching and now - mark_t > limits.stall_s:
            raise Refused(f"the fetch of {ds.source} stalled: fewer than {limits.stall_bytes} bytes in "
                          f"{limits.stall_s:g}s (--dataset-stall-timeout), {done} bytes fetched"
                          + (f" of {total}" if total else ""))


async def _tail(stream: asyncio.StreamReader, tail: bytearray) -> None:
    while chunk := await stream.read(1 << 14):
        tail.extend(chunk)
        del tail[:-STDERR_TAIL]


def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
