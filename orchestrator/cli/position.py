"""Where `--at` points in a log, read on the log's own clock.

`replay`, `explain`, `jobs`, `job`, `nodes` and `queues` take the same
`--at`, resolved here on the log's clock (`log_clock`): a simulated log
counts from 0, so `+3d` and `d3 12:00` name moments in it where an ISO date
cannot. A moment before the first event
is an error: folding nothing would show an empty cluster as if it had been.
"""

from __future__ import annotations

import argparse
from contextlib import aclosing
from typing import NamedTuple

from orchestrator.cli.errors import FAILURE, USAGE, CliError
from orchestrator.cli.state_view import LogSource, envelope_at, log_now, seq_at_time
from orchestrator.cli.timespec import SIMULATED_BEFORE_S, LogClock


class At(NamedTuple):
    """A log position and the moment a view of it is at (ages and fair-share decay count to it)."""

    seq: int
    time: float


def add_at_arg(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--at", metavar="WHEN", help=f"{what} as it was at a log position: a sequence number (123 or "
                   "#123), a duration before the log's end (10m, 1h30m; a cluster's log ends now), one after its "
                   "first event (+3d, +36h, +5400 seconds), an ISO time, or on a simulated log (corral sim: its "
                   "clock starts at 0) a day and time as explain prints them (d3, 'd3 21:57:45'). Before the "
                   "first event is an error (default: the end of the log)")


async def first_time(source: LogSource, not_before: float = 0.0) -> float | None:
    """The time of the log's first event at or after `not_before`; None if there is none."""
    async with aclosing(source.replay(batch=64)) as batches:
        async for batch in batches:
            for env in batch:
                if env.stream_time >= not_before:
                    return env.stream_time
    return None


async def log_clock(source: LogSource) -> LogClock:
    """The clock the log's times are on, and where it starts.

    The stream is on Unix time. A file is on a simulation's clock when its last event is (its first would
    not do: a simulation re-running a cluster's log keeps the cluster's settings event, stamped 0.0, first),
    and a cluster's log then starts at its first event on Unix time.
    """
    from events.bus import Bus
    from events.logfile import LogFile

    simulated = isinstance(source, LogFile) and await source.last_time() < SIMULATED_BEFORE_S
    start = await first_time(source, 0.0 if simulated else SIMULATED_BEFORE_S)
    trimmed = None
    if isinstance(source, Bus) and (why := await source.missing(1)) is not None:
        from orchestrator.cli.archive import ARCHIVE_HINT

        trimmed = f"{why}; {ARCHIVE_HINT}"  # the first event left the stream: `start` is a later one
    return LogClock(start, simulated, trimmed)


async def resolve_at(source: LogSource, text: str | None, clock: LogClock | None = None) -> At:
    """The position `--at` names (the end of the log if None) and its moment; raises CliError (exit 2).

    Without `clock` the log's is read when `text` is a time: a listing at the end need not read the log twice.
    """
    if text is None:
        return At(await source.last_seq(), await log_now(source))
    t = text.strip().lstrip("#")
    if t.isdigit():
        return await _at_seq(source, int(t))
    if clock is None:
        clock = await log_clock(source)
    when = clock.parse(t, await log_now(source))
    if clock.start is None:
        raise CliError(f"--at {text}: the log is empty", USAGE)
    if when < clock.start and clock.trimmed is not None:
        raise CliError(f"--at {text} is before the stream's first event: {clock.trimmed}", FAILURE)
    if when < clock.start:
        raise CliError(f"--at {text} is before the log's first event, at {clock.instant(clock.start)}", USAGE)
    return At(await seq_at_time(source, when), when)


async def _at_seq(source: LogSource, seq: int) -> At:
    end = await source.last_seq()
    if seq > end:
        raise CliError(f"the log ends at #{end}; --at #{seq} is in the future", USAGE)
    env = await envelope_at(source, seq)
    if env is None and seq >= 1:
        from orchestrator.cli.archive import require_from

        await require_from(source, seq, f"--at #{seq}")  # a position the stream dropped: say so, exit 1
    if env is None:
        raise CliError(f"--at #{seq} is before the log's first event" if seq < 1 else
                       f"--at #{seq}: the log holds no event there", USAGE)
    return At(seq, env.stream_time)
