"""Two stops for a service that runs workers: SIGINT/SIGTERM once is graceful, twice is now.

`corral up` (Ctrl-C) and `corral agent` (SIGTERM from a supervisor) first let
their workers checkpoint (nodeagent/shutdown.py): the first signal sets
`requested`, and the service runs its graceful stop, bounded by its grace. A
second signal sets `now` (what still runs is killed at once, its exit still
told if the log takes it within nodeagent.shutdown.FORCED_REPORT_S), and
cancels the service's task shortly after, whatever it is doing. Either way the
hard stop (cli/hard_stop.py) is armed, so even a stop that hangs ends.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

from orchestrator.cli import hard_stop

#: After a second signal, how long the forced stop may take before the service's task is cancelled.
FORCED_STOP_S = 3.0

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """SIGTERM/SIGINT handlers for `task`: the first sets `requested`, the second `now` and cancels `task`.

    `grace_s`: how long the graceful stop may take (the hard stop is armed past it). `say(first)` tells the
    user what a signal did (a line on stdout for `corral up`, a log line for a service).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, task: asyncio.Future[object], grace_s: float,
                 say: Callable[[bool], None]) -> None:
        self.loop, self.task, self.grace_s, self.say = loop, task, grace_s, say
        self.requested = asyncio.Event()
        self.now = asyncio.Event()
        self.count = 0

    def install(self) -> StopSignals:
        for sig in SIGNALS:
            self.loop.add_signal_handler(sig, self.signalled)
        return self

    def remove(self) -> None:
        for sig in SIGNALS:
            self.loop.remove_signal_handler(sig)

    def signalled(self) -> None:
        self.count += 1
        if self.count == 1:
            self.say(True)
            self.requested.set()
            hard_stop.arm(self.loop, self.grace_s + hard_stop.STOP_GRACE_S)
        elif self.count == 2:
            self.say(False)
            self.now.set()
            self.loop.call_later(FORCED_STOP_S, self.task.cancel)
            hard_stop.arm(self.loop)
        # a third and later: the stop is on its way, bounded by the hard stop
