"""What a reader folds the log from (`LogSource`): the NATS stream, the archive and the stream, or a log file.

The fold loop (events/follow.py `Follower`) and the read-only commands take
any of them, so a file (what `corral sim` writes, or an export of `corral tail
--json`) folds with the same code as the stream. Each is a position-ordered
log of Envelopes; they differ in what "live" means: a file does not grow, so
its `tail` ends at its last line.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Protocol

from events.envelope import Envelope


class LogSource(Protocol):
    """A log to fold: its end, its events in order in batches or live, and why a position is missing."""

    async def last_seq(self) -> int:
        """The log's last position now (0: empty)."""
        ...

    def replay(self, from_seq: int = 1, *, since: float | None = None, to_seq: int | None = None,
               subjects: list[str] | None = None, batch: int = 2000) -> AsyncGenerator[list[Envelope], None]:
        """The log from `from_seq` (or from stream time `since`) to `to_seq` or its end now, in batches, in order."""
        ...

    def tail(self, *, subjects: list[str] | None = None, from_seq: int | None = None, since: float | None = None,
             batch: int = 500) -> AsyncGenerator[Envelope, None]:
        """Events as they are appended, from now (default), from `from_seq` or from `since`."""
        ...

    async def missing(self, seq: int) -> str | None:
        """Why the log holds no event at `seq`; None if it holds one (or cannot say now)."""
        ...

    async def deleted_in(self, lo: int, hi: int) -> int | None:
        """The first position in lo..hi deleted from the middle of the log (a slice's reader asks); None if none."""
        ...


if TYPE_CHECKING:
    from events.bus import Bus
    from events.history import History
    from events.logfile import LogFile

    def _every_log_is_a_source(bus: Bus, history: History, file: LogFile) -> tuple[LogSource, ...]:
        """Never called: mypy checks here that each log corral reads satisfies LogSource."""
        return bus, history, file
