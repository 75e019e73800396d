"""The cluster state as the CLI sees it: the same fold of the same log as every other reader.

`jobs`, `nodes`, `queues`, `replay` and `top` never ask a service what it
thinks; they fold the log themselves with the shared `evolve`. To stay fast on
a long log they start from the scheduler's newest snapshot when it is not past
the position asked for (a snapshot *is* a fold of the log up to its `seq`),
then replay the rest. Any problem with the snapshot (none yet, no permission
to read it, an older format) falls back to a full replay, which is always
correct, only slower.
"""

from __future__ import annotations

from contextlib import aclosing

import structlog
from nats.js.errors import BucketNotFoundError

from events.bus import Bus, Envelope
from orchestrator.core.state import ClusterState
from orchestrator.follow import Follower
from orchestrator.snapshot import SNAPSHOT_BUCKET, SnapshotStore

log = structlog.get_logger("corral.cli")


async def newest_snapshot(bus: Bus, *, at_most: int) -> ClusterState | None:
    """The scheduler's snapshot if it reflects a position <= `at_most`; None otherwise or on any problem."""
    try:
        await bus.js.object_store(SNAPSHOT_BUCKET)  # only look: a reader must not create the bucket
    except BucketNotFoundError:
        return None
    except Exception as e:
        log.debug("snapshot_unavailable", error=repr(e))
        return None
    try:
        state = await SnapshotStore(bus.js, replicas=bus.replicas).load(ClusterState)
    except Exception as e:
        log.debug("snapshot_unreadable", error=repr(e))
        return None
    if state is None or state.seq > at_most:
        return None
    return state


async def load_state(bus: Bus, *, to_seq: int | None = None, use_snapshot: bool = True) -> ClusterState:
    """The state folded up to `to_seq` (default: the end of the log now)."""
    end = await bus.last_seq()
    target = end if to_seq is None else max(0, min(to_seq, end))
    start = await newest_snapshot(bus, at_most=target) if use_snapshot else None
    follower = Follower(bus, start)
    await follower.catch_up(to_seq=target)
    return follower.state


async def seq_at_time(bus: Bus, at: float) -> int:
    """The last sequence the log stored at or before `at` (epoch seconds); 0 if none."""
    async with aclosing(bus.replay(since=at, batch=64)) as batches:
        async for batch in batches:
            for env in batch:
                if env.stream_time > at:
                    return env.seq - 1
    return await bus.last_seq()


async def envelope_at(bus: Bus, seq: int) -> Envelope | None:
    """The event stored at `seq` (None if there is none)."""
    if seq < 1:
        return None
    async with aclosing(bus.replay(from_seq=seq, to_seq=seq, batch=1)) as batches:
        async for batch in batches:
            for env in batch:
                if env.seq == seq:
                    return env
    return None
