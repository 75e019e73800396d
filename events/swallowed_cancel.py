"""Stopping service loops on Python 3.11, where `asyncio.wait_for` can swallow a cancellation.

On 3.11, wait_for returns the awaited result instead of raising CancelledError
when the cancel and the result land in the same event-loop iteration. nats-py
waits that way inside (a request's reply, a KV watch update, a put's ack), so a
loop cancelled at such a moment -- SIGTERM, a TaskGroup sibling's failure, a
test's teardown -- ran on, and whoever awaited it hung (seen in CI: the
scheduler's heartbeat watch, with beats arriving every half second). The task
still counts the request (`Task.cancelling()`), so every service loop checks
it once a turn. Our own waits use `asyncio.timeout`, which does not swallow.

Beside the bus because the bus's own reads need it, and every service package
already stands on events/.
"""

from __future__ import annotations

import asyncio


def stop_if_cancelled() -> None:
    """Raise CancelledError if this task was asked to stop and a wait inside it swallowed the request."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
