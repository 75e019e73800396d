"""The web UI's query parameters: each read strictly, a bad one a 400 with a one-line message that says
what to send instead (never a traceback, never a guess)."""

from __future__ import annotations

from aiohttp import web

from events.subjects import InvalidId, check_id
from orchestrator.cli.timespec import parse_duration
from orchestrator.cli.views import STATUSES

#: The longest history window a page may ask for.
MAX_WINDOW_S = 400 * 86400.0


class BadRequest(Exception):
    """A query the UI cannot answer as asked: 400 with this message."""


def params(request: web.Request, known: tuple[str, ...]) -> dict[str, str]:
    """The query as a dict; an unknown or repeated parameter is a 400 naming the known ones."""
    out: dict[str, str] = {}
    for key, value in request.query.items():
        if key == "token":
            continue
        if key not in known:
            raise BadRequest(f"unknown query parameter {key!r}; known: {', '.join(known) or 'none'}")
        if key in out:
            raise BadRequest(f"query parameter {key!r} given twice")
        out[key] = value
    return out


def int_param(params: dict[str, str], name: str, default: int, lo: int, hi: int) -> int:
    text = params.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise BadRequest(f"{name}={text!r} is not a whole number") from None
    if not lo <= value <= hi:
        raise BadRequest(f"{name}={value} is out of range: {lo} to {hi}")
    return value


def duration_param(params: dict[str, str], name: str, default: float) -> float:
    text = params.get(name)
    if text is None:
        return default
    try:
        value = parse_duration(text)
    except ValueError:
        raise BadRequest(f"{name}={text!r} is not a duration (like 30m, 24h, 7d)") from None
    if not 0 < value <= MAX_WINDOW_S:
        raise BadRequest(f"{name}={text!r} is out of range: more than 0, at most 400d")
    return value


def job_id_param(request: web.Request) -> str:
    try:
        return check_id(request.match_info["job_id"], "job id")
    except InvalidId as e:
        raise BadRequest(str(e)) from None


def states_param(params: dict[str, str]) -> frozenset[str]:
    out = frozenset(p.strip() for p in params.get("state", "").split(",") if p.strip())
    unknown = sorted(out - set(STATUSES))
    if unknown:
        raise BadRequest(f"unknown job state {unknown[0]!r}; known: {', '.join(STATUSES)}")
    return out
