"""A node's graceful shutdown: its workers checkpoint, their stop is recorded, nothing restarts.

`corral up` on its first Ctrl-C (or SIGTERM) and `corral agent` on SIGTERM call
`Agent.shut_down`. Every worker it runs then gets what a preemption gives
(DESIGN.md, invariant 5): a preemptible job's worker its checkpoint signal and
up to its grace period (capped by the shutdown's `--shutdown-grace`) to save a
checkpoint and exit; a job that is not preemptible, which takes no checkpoint
signal, SIGTERM and the same grace (Slurm's node shutdown of a `--requeue`
job). Past the grace, or on a second Ctrl-C, SIGKILL.

Each exit is reported as `WorkerExited(reason="shutdown")`, after the
checkpoint it saved (`Checkpointed`). The scheduler folds that as no failure:
the gang is requeued from its newest checkpoint (JobRequeued, "shutdown: node
N stopped its workers"), its `max_restarts` unspent, the same as a node
failure (core/react.py, rule 1). A job that never checkpointed starts again
from step 0, its restarts unspent too. Nothing starts or restarts on the node
once the shutdown began.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any

from nodeagent.runtime.base import ExitInfo, Runtime, WorkerHandle, stop_with_grace

#: The default `--shutdown-grace`: the most a worker gets to checkpoint and exit (its job's grace may be less).
SHUTDOWN_GRACE_S = 30.0
#: After the grace (and the kills), how long the exits may take to reach the log.
REPORT_S = 10.0
#: After a second Ctrl-C: the workers are killed at once, and their exits get this long to reach the log.
FORCED_REPORT_S = 2.0


async def end_within(runtime: Runtime, handle: WorkerHandle, limit_s: float, now: asyncio.Event) -> ExitInfo:
    """The worker's exit, once it ends by itself within `limit_s`; else (or once `now` is set) TERM, then KILL."""
    ended = asyncio.ensure_future(runtime.wait(handle))
    forced = asyncio.ensure_future(now.wait())
    try:
        await asyncio.wait({ended, forced}, timeout=max(limit_s, 0.0), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (forced, ended):
            if not t.done():
                t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t
    if not ended.cancelled() and ended.exception() is None:
        return ended.result()
    return await stop_with_grace(runtime, handle, 0.0)


async def until_done(tasks: Iterable[asyncio.Future[Any]], timeout_s: float, now: asyncio.Event) -> bool:
    """Wait until every task is done, at most `timeout_s`, or FORCED_REPORT_S once `now` is set; whether all were.

    The tasks go on either way (the caller cancels what it must).
    """
    pending: set[asyncio.Future[Any]] = {t for t in tasks if not t.done()}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    forced: asyncio.Future[Any] = asyncio.ensure_future(now.wait())
    try:
        while pending:
            if forced.done():
                deadline = min(deadline, loop.time() + FORCED_REPORT_S)
                forced = asyncio.ensure_future(asyncio.Event().wait())  # counted once
            left = deadline - loop.time()
            if left <= 0:
                break
            _, pending = await asyncio.wait({*pending, forced}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            pending.discard(forced)
    finally:
        forced.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await forced
    return not pending
