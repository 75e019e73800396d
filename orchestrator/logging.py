"""structlog set-up for the services: one event per line on stderr, JSON unless a person is watching.

A service whose stderr is a terminal (`corral up` in a shell) prints readable
lines; one whose stderr is a file, a pipe or a container log prints JSON for
the log collector. CORRAL_LOG_FORMAT=json or console decides instead.
"""

from __future__ import annotations

import logging
import os
import sys

import structlog


class _Stderr:
    """Whatever `sys.stderr` is when a line is written, not when logging was set up: a CLI run in-process
    (tests, an embedding tool) may swap it for a stream it later closes."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def wants_json(stream: object = None) -> bool:
    """JSON lines unless `stream` (default: stderr) is a terminal; CORRAL_LOG_FORMAT=json|console overrides."""
    forced = os.environ.get("CORRAL_LOG_FORMAT", "").strip().lower()
    if forced in ("json", "console"):
        return forced == "json"
    isatty = getattr(sys.stderr if stream is None else stream, "isatty", None)
    try:
        return not (callable(isatty) and isatty())
    except (ValueError, OSError):  # a closed stream
        return True


def configure_logging(level: str = "info", *, json: bool | None = None) -> None:
    """`json` None: as `wants_json()` says, for stderr now."""
    if json is None:
        json = wants_json()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=_Stderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )
