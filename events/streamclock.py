"""The log's clock as one reader can prove it: the time judgements across machines use this one (#30).

The scheduler's and the agents' folds date every event by the stream (the
server stored it then: `Envelope.stream_time`; `Follower(stream_times=True)`),
so their "now" must be on that clock too, never this machine's wall clock,
which may be minutes off the server's and off every other machine's. A reader cannot ask the server the time, but every event it
reads proves a lower bound: an event stored at server time T and read at
monotonic time m means the server's time was at least T at m, so at any later
monotonic m' it is at least T + (m' - m). `StreamClock` keeps the best such
bound over everything read (the freshest read wins; a catch-up over old
events only proves old times, and a live read of a new one tightens it).

Never ahead of the server, so a judgement of "long enough" is never early: a
time limit is not enforced before it has passed on the server's clock, a
min-runtime protection does not end early, a restart backoff is not cut
short. It is behind by the latency of the best read (milliseconds while
events flow; a scheduler reads its own election back before it decides).
What it assumes: the server's clock does not jump back, and every server a
replicated stream's leadership moves between keeps the same time (NTP).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable


class StreamClock:
    """A lower bound of the stream's clock, carried forward on this process's monotonic clock."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        #: Best (largest) stream time minus monotonic read time seen; -inf: nothing read yet.
        self._offset = -math.inf

    def saw(self, stream_time: float) -> None:
        """An event stored at `stream_time` was just read."""
        offset = stream_time - self._monotonic()
        if offset > self._offset:
            self._offset = offset

    @property
    def known(self) -> bool:
        """Whether anything was read yet (before that, the log's time is unknown)."""
        return self._offset > -math.inf

    def now(self) -> float | None:
        """The stream time now, at least (never later than the server's); None before any event was read."""
        if not self.known:
            return None
        return self._offset + self._monotonic()
