"""Points in time as users type them and as the CLI prints them, on a log's own clock.

`tail --since` and `replay --at` take the same forms, so a moment copied from
one command's output works in the other. A cluster's log is on Unix time:
local ISO timestamps. A simulated log (`corral sim`) is on the simulation's
clock, seconds since its start at 0: an ISO date there would be in 1970, so
its moments read as a day index and a time of day, `d3 21:57:45.831`, and its
spans as durations, `+5d19h`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
from dataclasses import dataclass

from orchestrator.cli.errors import FAILURE, USAGE, CliError
from orchestrator.cli.output import human_duration

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_DURATION = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+")
_SECONDS = re.compile(r"\d+(?:\.\d+)?")
_MOMENT_IN_TEXT = re.compile(r"\bt=(\d+(?:\.\d+)?)")
_SIM_MOMENT = re.compile(r"d(\d+)(?:[ T](\d{1,2}):(\d{2})(?::(\d{2}(?:\.\d+)?))?)?")
_DAY = 86400.0

#: A log file that ends earlier than this (ten years after 1970) is on a simulation's clock: no cluster's
#: log is in the 1970s, and `corral sim` starts its clock at 0.
SIMULATED_BEFORE_S = 10 * 365 * _DAY


def parse_duration(text: str) -> float:
    """Seconds in `90s`, `10m`, `1h30m`, `2d`, `500ms`; raises CliError (exit 2) otherwise."""
    t = text.strip().lower()
    if not _DURATION.fullmatch(t):
        raise CliError(f"bad duration {text!r}: use a number with a unit, like 90s, 10m, 1h30m or 2d", USAGE)
    return sum(float(n) * _UNITS[u] for n, u in _PART.findall(t))


#: Slurm's time forms (`sbatch --time`): MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
_CLOCK = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")


def slurm_forms(bare: str) -> str:
    """The forms a span takes, for help and errors; `bare` is what a plain number counts (minutes, seconds)."""
    return (f"a number of {bare} (60), MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (Slurm's forms), or a number with a unit "
            "(90s, 10m, 2h, 1d, 1h30m)")


def parse_span(text: str, *, bare_s: float) -> float:
    """Seconds in a span as Slurm's `--time` takes it, or with units; raises ValueError saying every form.

    A plain number counts `bare_s` seconds each: 60 for a job's time limit (`-t 60` is an hour's minutes,
    as in Slurm), 1 for flags whose value has always been seconds (`--timeout`, `--tick`). With a colon or a
    dash it is Slurm's: `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM`, `D-HH:MM:SS` (fields after the first below 60,
    hours after a day below 24); with a unit suffix, `90s`, `10m`, `2h`, `1d`, `1h30m`, `500ms`.
    """
    t = text.strip().lower()
    bare = "minutes" if bare_s == 60 else "seconds"
    if _SECONDS.fullmatch(t):
        return float(t) * bare_s
    if _DURATION.fullmatch(t):
        return sum(float(n) * _UNITS[u] for n, u in _PART.findall(t))
    m = _CLOCK.fullmatch(t)
    if m is not None and (":" in t or "-" in t):
        days, first, second, third = m.groups()
        if days is not None:  # D-HH[:MM[:SS]]
            h, mi, s = int(first), int(second or 0), int(third or 0)
            if h < 24 and mi < 60 and s < 60:
                return int(days) * 86400.0 + h * 3600 + mi * 60 + s
        elif third is not None:  # HH:MM:SS
            if int(second) < 60 and int(third) < 60:
                return int(first) * 3600.0 + int(second) * 60 + int(third)
        elif int(second) < 60:  # MM:SS
            return int(first) * 60.0 + int(second)
    raise ValueError(f"bad duration {text!r}: use {slurm_forms(bare)}")


def minutes_arg(text: str) -> float:
    """argparse type of a job's time limit: Slurm's `--time` (a plain number is minutes); seconds out."""
    try:
        return parse_span(text, bare_s=60)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def seconds_arg(text: str) -> float:
    """argparse type of every other span flag: the same forms, a plain number in seconds; seconds out."""
    try:
        return parse_span(text, bare_s=1)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


@dataclass(frozen=True)
class LogClock:
    """How one log's times print and parse: Unix time (the default), or a simulation's clock.

    `start` is the log's first event (None: an empty log), what `+3d` counts from.
    """

    start: float | None = None
    simulated: bool = False
    #: Why `start` is not the log's first event (its head left the stream, #30): what counts from the
    #: start, or lies before it, is refused (exit 1) saying so instead of counting from a later event.
    trimmed: str | None = None

    def instant(self, ts: float) -> str:
        """A moment as `parse` reads it back: `d3 21:57:45.831` on a simulated clock, else local ISO."""
        if self.simulated:
            return _sim_instant(ts)
        return dt.datetime.fromtimestamp(ts).isoformat(timespec="milliseconds")

    def time_of_day(self, ts: float) -> str:
        """A moment in a column: the simulated day and time, or a cluster's time of day (its date is today's)."""
        return self.instant(ts) if self.simulated else self.instant(ts)[11:]

    def moments(self, text: str) -> str:
        """`text` with each `t=SECONDS` the scheduler wrote (a reservation's expected start) as `instant` prints it."""
        return _MOMENT_IN_TEXT.sub(lambda m: self.instant(float(m.group(1))), text)

    def offset(self, seconds: float) -> str:
        """A span after an earlier moment: `+5d19h` on a simulated clock (days apart), `+  12.345s` for a cluster."""
        return f"+{human_duration(seconds)}" if self.simulated else f"+{seconds:8.3f}s"

    def parse(self, text: str, now: float) -> float:
        """The moment `text` names: a duration before `now`, `+DURATION` or `+SECONDS` after the log's start,
        `dN [HH:MM[:SS]]` on a simulated clock, an ISO time on a cluster's; raises CliError (exit 2)."""
        t = text.strip()
        if _DURATION.fullmatch(t.lower()):
            return now - parse_duration(t)
        if t.startswith("+"):
            return self._after_start(t[1:], text)
        sim = _SIM_MOMENT.fullmatch(t)
        if self.simulated:
            if sim is None:
                raise CliError(f"bad time {text!r} for a simulated log (its clock starts at 0): use {SIM_FORMS}",
                               USAGE)
            return _sim_moment(sim)
        if sim is not None:
            raise CliError(f"bad time {text!r}: a day and time (dN HH:MM:SS) is for a simulated log; this one is "
                           f"on Unix time: use {REAL_FORMS}", USAGE)
        return _iso(t, text)

    def _after_start(self, span: str, text: str) -> float:
        if self.trimmed is not None:
            raise CliError(f"{text} counts from the log's first event: {self.trimmed}", FAILURE)
        if self.start is None:
            raise CliError(f"bad time {text!r}: no log start to count from here", USAGE)
        if _SECONDS.fullmatch(span):
            return self.start + float(span)
        if _DURATION.fullmatch(span.lower()):
            return self.start + parse_duration(span)
        raise CliError(f"bad time {text!r}: after the log's start is +DURATION or +SECONDS, like +3d, +36h or "
                       "+5400", USAGE)


#: What `--at` takes on each kind of clock, for help and errors.
SIM_FORMS = ("a duration before the log's end (10m, 1h30m), one after its start (+3d, +36h, +5400 seconds), "
             "or a day and time (d3, 'd3 21:57:45')")
REAL_FORMS = ("a duration ago (10m, 1h30m), one after the log's start (+3d, +36h), or an ISO timestamp "
              "(2025-01-31T14:05:00)")


def _sim_instant(ts: float) -> str:
    """`d3 21:57:45.831`: cut to the millisecond like an ISO time (via microseconds: 1.001 s is not 1.000)."""
    ms = round(ts * 1e6) // 1000
    day, ms = divmod(ms, 86_400_000)
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"d{day} {h:02d}:{m:02d}:{s:02d}.{ms:03d}"


def _sim_moment(m: re.Match[str]) -> float:
    day, hh, mm, ss = m.groups()
    return int(day) * _DAY + int(hh or 0) * 3600 + int(mm or 0) * 60 + float(ss or 0)


def _iso(t: str, text: str) -> float:
    try:
        when = dt.datetime.fromisoformat(t.replace("Z", "+00:00") if t.endswith("Z") else t)
    except ValueError:
        raise CliError(f"bad time {text!r}: use {REAL_FORMS}", USAGE) from None
    return when.timestamp()


def parse_instant(text: str, now: float) -> float:
    """Epoch seconds for `10m` (that long before `now`) or an ISO timestamp (local time if no zone)."""
    return LogClock().parse(text, now)
