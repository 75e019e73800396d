"""A node agent's liveness record: one KV key per node, never in the main log."""

from __future__ import annotations

import msgspec

HEARTBEAT_BUCKET = "corral-heartbeats"


class Heartbeat(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    incarnation: str
    #: Agent wall clock; the monitor judges age by its own receive time, not this.
    sent_at: float
    workers: int = 0
