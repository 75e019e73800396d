"""The log as the stream holds it, and the fold every reader of the stream makes of it.

Readers fold each event at the time the stream stored it (#30: `evolve`'s `at`), so a fold of the
events a test appended (their own `occurred_at`) is not what a reader of the stream holds: a test
that compares the two folds what the stream stored instead.
"""

from __future__ import annotations

from collections.abc import Sequence

from events.bus import Bus, Envelope
from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import ClusterState


async def stored(bus: Bus) -> list[Envelope]:
    """Every event of the stream, with its position and stream time."""
    return [env async for batch in bus.replay() for env in batch]


def fold_stored(log: Sequence[Envelope], to_seq: int | None = None) -> ClusterState:
    """What a reader of the stream folds up to `to_seq` (default: all of `log`)."""
    state = ClusterState()
    for env in log:
        if to_seq is not None and env.seq > to_seq:
            break
        evolve(state, env.event, env.seq, env.stream_time)
    return state
