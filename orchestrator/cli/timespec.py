"""Points in time as users type them: `10m` ago, `1h30m` ago, or an ISO timestamp.

`tail --since` and `replay --at` take the same forms, so a moment copied from
one command's output works in the other.
"""

from __future__ import annotations

import datetime as dt
import re

from orchestrator.cli.errors import USAGE, CliError

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_DURATION = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+")


def parse_duration(text: str) -> float:
    """Seconds in `90s`, `10m`, `1h30m`, `2d`, `500ms`; raises CliError (exit 2) otherwise."""
    t = text.strip().lower()
    if not _DURATION.fullmatch(t):
        raise CliError(f"bad duration {text!r}: use a number with a unit, like 90s, 10m, 1h30m or 2d", USAGE)
    return sum(float(n) * _UNITS[u] for n, u in _PART.findall(t))


def parse_instant(text: str, now: float) -> float:
    """Epoch seconds for `10m` (that long before `now`) or an ISO timestamp (local time if no zone)."""
    t = text.strip()
    if _DURATION.fullmatch(t.lower()):
        return now - parse_duration(t)
    try:
        when = dt.datetime.fromisoformat(t.replace("Z", "+00:00") if t.endswith("Z") else t)
    except ValueError:
        raise CliError(
            f"bad time {text!r}: use a duration ago (10m, 1h30m) or an ISO timestamp (2025-01-31T14:05:00)", USAGE
        ) from None
    return when.timestamp()


def format_instant(ts: float) -> str:
    """Local ISO time to the millisecond: what `parse_instant` reads back."""
    if ts <= 0:
        return "-"
    return dt.datetime.fromtimestamp(ts).isoformat(timespec="milliseconds")
