"""The staging child process (issue #39): `python -m nodeagent.datasets.child`, one per staging.

It reads its request (the dataset, the directory, the limits) as JSON on
stdin, stages with fetch.py, and writes JSON lines on stdout: progress
({"started": 1} once it is about to fetch, then {"p": done, "t": total}, a few a
second at most), then its result
({"ok": bytes read} or {"error": reason, "kind": ..., "permanent": ...}).
Its memory is limited (RLIMIT_AS), and it dies with the agent
(PR_SET_PDEATHSIG): whatever the data does, only this process suffers it.
Time, stalls and cancels are its supervisor's (supervise.py), which kills it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

import msgspec

from nodeagent.datasets.limits import Limits
from schemas.datasets import Dataset, source_scheme

PR_SET_PDEATHSIG = 1
#: Most characters of a reason sent back (a member's name may be long).
REASON_CHARS = 2000
#: Least seconds between two progress lines.
PROGRESS_S = 0.2


class Request(msgspec.Struct, frozen=True):
    dataset: Dataset
    dest: str
    limits: dict[str, float]
    s3_endpoint_url: str | None = None
    #: The agent's pid: a child whose parent is already gone exits at once.
    parent: int = 0
    #: Only say what staging will need (stager.expected_bytes: a HEAD, an S3 listing), as {"ok": bytes}.
    size_only: bool = False


def _first_to_go() -> None:
    """Ask the kernel's OOM killer to take this process before any other (the agent above all), should the
    node's memory run out all the same (a cgroup tighter than RLIMIT_AS): raising one's own score is allowed."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass


def _die_with_parent(parent: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # (not Linux: the supervisor's kill is all there is)
    if parent and os.getppid() != parent:
        os._exit(3)


def _say(msg: dict[str, object]) -> None:
    data = msgspec.json.encode(msg) + b"\n"
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]


def main() -> int:
    req = msgspec.json.decode(sys.stdin.buffer.read(), type=Request)
    _die_with_parent(req.parent)
    _first_to_go()
    limits = Limits(**{k: type(getattr(Limits, k))(v) for k, v in req.limits.items()})
    if limits.memory_bytes > 0:
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    from nodeagent.datasets.fetch import DiskFull, StagingError, stage  # (after the limit: its imports count too)

    if req.size_only:
        from nodeagent.datasets.stager import expected_bytes

        _say({"ok": expected_bytes(req.dataset, req.s3_endpoint_url)})
        return 0

    if source_scheme(req.dataset.source) == "s3":
        with contextlib.suppress(ImportError):  # (without the extra, staging says so)
            import boto3  # noqa: F401 - a second or more on a busy node: not the fetch's time
    # The fetch begins: the supervisor's stall clock starts now, not while this interpreter was starting.
    _say({"started": 1})
    last = [0.0]

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] >= PROGRESS_S or (total and done >= total):
            last[0] = now
            _say({"p": done, "t": total})

    try:
        read = stage(req.dataset, Path(req.dest), progress, threading.Event(), s3_endpoint_url=req.s3_endpoint_url,
                     limits=limits)
    except DiskFull as e:
        _say({"error": str(e)[:REASON_CHARS], "kind": "disk_full", "permanent": False})
        return 1
    except StagingError as e:
        _say({"error": str(e)[:REASON_CHARS], "kind": "error", "permanent": e.permanent})
        return 1
    except MemoryError:
        _say({"error": f"staging {req.dataset.source} needed more than its memory limit ({limits.memory_bytes} "
                       "bytes, --dataset-memory-bytes): the archive is hostile, or the limit too small",
              "kind": "error", "permanent": True})
        return 1
    except Exception as e:
        traceback.print_exc()
        _say({"error": f"staging crashed: {type(e).__name__}: {e}"[:REASON_CHARS], "kind": "error",
              "permanent": False})
        return 1
    _say({"ok": read})
    return 0


if __name__ == "__main__":
    sys.exit(main())
