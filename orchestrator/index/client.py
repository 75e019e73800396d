"""Asking the index service (`corral index`) over NATS request/reply; None when no index answers.

A reader that gets None falls back to reading the log itself: the index is
an accelerator, never the only way to an answer.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec
import nats.errors
from nats.aio.client import Client as NATS

from orchestrator.index import api

R = TypeVar("R", bound=api.Reply)

#: Seconds to wait for an answer before reading the log instead.
TIMEOUT_S = 5.0


class IndexRefused(RuntimeError):
    """The index answered `ok: false` (a bad request, a job it does not know, a story it cannot read)."""

    def __init__(self, reply: api.Reply) -> None:
        super().__init__(reply.message or reply.error)
        self.error = reply.error
        self.reply = reply


class NoIndex(RuntimeError):
    """No index service answered (none running, or too slow): read the log instead."""


async def ask(nc: NATS, subject: str, request: msgspec.Struct, reply_type: type[R], *,
              timeout: float = TIMEOUT_S) -> R:
    """The index's answer; raises NoIndex when none answers, IndexRefused when it says no."""
    try:
        msg = await nc.request(subject, api.encode(request), timeout=timeout)
    except nats.errors.NoRespondersError:
        raise NoIndex(f"no index service answers {subject}") from None
    except (TimeoutError, nats.errors.TimeoutError):
        raise NoIndex(f"the index service did not answer {subject} within {timeout:g}s") from None
    try:
        reply = msgspec.json.decode(msg.data, type=reply_type)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise NoIndex(f"unreadable answer on {subject}: {e}") from None
    if not reply.ok:
        raise IndexRefused(reply)
    return reply
