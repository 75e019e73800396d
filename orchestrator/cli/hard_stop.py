"""A stop that always ends: a service still running STOP_GRACE_S after SIGTERM/SIGINT says what it was
stuck on and exits.

A clean stop cancels the service's task and unwinds (final snapshot, lease release,
NATS drain). CI twice saw an agent that logged its start, got SIGTERM and was still
running 60 s later, and no run outside a loaded suite reproduced it. Rather than wait
for a supervisor's SIGKILL, which says nothing, the process logs every thread's stack
and every asyncio task's frames (`stop_stuck`) and exits. The next time it happens the
log shows where the stop was stuck.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import traceback

import structlog

log = structlog.get_logger("corral.cli")

#: Seconds from the first stop signal to the forced exit (a clean stop takes well under one here).
STOP_GRACE_S = 20.0


def arm(loop: asyncio.AbstractEventLoop, grace_s: float | None = None) -> threading.Timer:
    """Start the countdown (once per signal; a daemon thread, so a process that ends on time ends)."""
    if grace_s is None:
        grace_s = STOP_GRACE_S  # read now: a test shortens it
    timer = threading.Timer(grace_s, _stuck, args=(loop, grace_s))
    timer.daemon = True
    timer.start()
    return timer


def _stuck(loop: asyncio.AbstractEventLoop, grace_s: float) -> None:
    names = {t.ident: t.name for t in threading.enumerate()}
    threads = {names.get(ident, str(ident)): "".join(traceback.format_stack(frame, limit=12))
               for ident, frame in sys._current_frames().items()}
    tasks: list[str] = []
    try:
        for task in list(asyncio.all_tasks(loop)):  # read from this thread: best effort, it is for a log line
            frames = [f"{f.f_code.co_filename}:{f.f_lineno} {f.f_code.co_name}" for f in task.get_stack(limit=8)]
            tasks.append(f"{task.get_name()}: {' <- '.join(frames) or '(no frames)'}")
    except RuntimeError as e:  # the loop's task set changed under us
        tasks.append(f"(tasks unavailable: {e})")
    log.error("stop_stuck", grace_s=grace_s, tasks=tasks, threads=threads,
              msg=f"still running {grace_s:g}s after the stop signal: exiting anyway")
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)
