"""Rollback, then roll forward: a snapshot whose fold skipped an event type the reader decodes is never used (#30).

An older release folds an event type it does not know (here QueueDeleted) as
"no change" and saves a snapshot in which the deleted queue is still defined.
The current scheduler must not start from it: it folds the log instead (one
`snapshot_skipped` line saying why), so the deletion holds and a job naming
the deleted queue is rejected. The outcome is read back from the stream's raw
JSON (nats-py only), not through corral's decoder or fold.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from pathlib import Path

import pytest
import structlog
from structlog.testing import LogCapture

import events.snapshots
from events.bus import Bus, Envelope
from events.follow import Follower
from events.sdk import Client
from events.snapshots import UNRECORDED_DECODED, Header, SnapshotStore, decoded_tags, suspect
from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import ClusterState
from schemas import JobSpec, JobSubmitted, Unknown, tag_of
from tests.integration.harness import agents, scheduler


class OlderReader:
    """The stream as a release that does not know `unknown` reads it: those events decode to Unknown."""

    def __init__(self, bus: Bus, unknown: str) -> None:
        self.bus, self.unknown = bus, unknown

    def _older(self, env: Envelope) -> Envelope:
        if tag_of(env.event) != self.unknown:
            return env
        return Envelope(env.seq, env.subject, env.stream_time, Unknown(
            raw=b"{}", error=f"unknown event type {self.unknown!r}", type=self.unknown, reason="unknown_type"))

    async def replay(self, from_seq: int = 1, *, to_seq: int | None = None) -> AsyncGenerator[list[Envelope], None]:
        async with aclosing(self.bus.replay(from_seq=from_seq, to_seq=to_seq)) as batches:
            async for batch in batches:
                yield [self._older(env) for env in batch]

    async def last_seq(self) -> int:
        return await self.bus.last_seq()

    async def missing(self, seq: int) -> str | None:
        return await self.bus.missing(seq)


async def raw_log(bus: Bus) -> list[dict[str, object]]:
    """Every stored event as the JSON the stream holds (the independent check: no corral decoding)."""
    info = await bus.js.stream_info(bus.stream)
    out = []
    for seq in range(int(info.state.first_seq), int(info.state.last_seq) + 1):
        msg = await bus.js.get_msg(bus.stream, seq)
        out.append(json.loads(msg.data or b"{}"))
    return out


async def first_decision(bus: Bus, job_id: str, timeout: float = 30.0) -> str:
    """JobRejected or GangReserved, whichever the log holds first for `job_id`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for ev in await raw_log(bus):
            if ev.get("job_id") == job_id and ev.get("type") in ("JobRejected", "GangReserved"):
                return str(ev["type"])
        await asyncio.sleep(0.2)
    raise AssertionError(f"no decision about {job_id} within {timeout}s")


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> LogCapture:
    capture = LogCapture()
    monkeypatch.setattr(events.snapshots, "log", structlog.wrap_logger(
        None, processors=[capture], wrapper_class=structlog.BoundLogger, cache_logger_on_first_use=False))
    return capture


async def test_a_snapshot_that_skipped_a_queue_deletion_is_not_used(bus: Bus, tmp_path: Path,
                                                                    captured: LogCapture) -> None:
    client = Client(bus, user="admin")
    await client.define_queue("keep")
    await client.define_queue("gone")
    await client.delete_queue("gone")

    # The older release: folds the log with QueueDeleted unknown, and saves its snapshot (recording it).
    older = Follower(OlderReader(bus, "QueueDeleted"), evolve, ClusterState())  # type: ignore[arg-type]
    await older.catch_up()
    assert older.skipped == {"QueueDeleted"}
    assert "gone" in older.state.queues, "the older fold keeps the deleted queue (what the snapshot then says)"
    store = SnapshotStore(bus.js)
    await store.save(older.state, older.skipped)
    assert await store.seqs() == [older.state.seq]

    # Rolled forward: the current scheduler starts; a job naming the deleted queue must be rejected.
    job_id = "j-rolledfwd"
    spec = JobSpec(name="after-rollback", queue="gone", command=("true",))
    await bus.append(JobSubmitted(event_id=f"submit:{job_id}", occurred_at=time.time(), job_id=job_id, spec=spec))
    async with agents(bus, 1, tmp_path, gpus=2), scheduler(bus) as sched:
        assert await first_decision(bus, job_id) == "JobRejected"
        assert "gone" not in sched.state.queues and "keep" in sched.state.queues
    # One line per reader that looked at it (the scheduler, the agent), each naming why.
    skipped = [e for e in captured.entries if e["event"] == "snapshot_skipped"]
    assert skipped and all(e["seq"] == older.state.seq and "skipped events of type QueueDeleted" in e["reason"]
                           and "could not decode" in e["reason"] for e in skipped), captured.entries
    rejected = [e for e in await raw_log(bus) if e.get("type") == "JobRejected" and e.get("job_id") == job_id]
    assert any("gone" in r for r in rejected[0]["reasons"]), rejected  # type: ignore[attr-defined]
    # Its own snapshot (saved on stop) records what it skipped: nothing.
    loaded = await store.load_with_header(ClusterState)
    assert loaded is not None and loaded.header.skipped == [] and "gone" not in loaded.state.queues


async def test_a_skipped_type_this_corral_does_not_know_either_is_carried_forward(bus: Bus) -> None:
    """A snapshot that skipped a type nobody here decodes is used, and the scheduler's next snapshot still says
    it skipped it (so a release that does decode it will not use that one either)."""
    client = Client(bus, user="admin")
    await client.define_queue("keep")
    follower = Follower(bus, evolve, ClusterState())
    await follower.catch_up()
    store = SnapshotStore(bus.js)
    await store.save(follower.state, {"FromTheFuture"})
    await client.define_queue("more")
    async with scheduler(bus) as sched:
        await sched.follower.wait_for_seq(await bus.last_seq())
        assert sched.follower.skipped == {"FromTheFuture"}
    loaded = await store.load_with_header(ClusterState)
    assert loaded is not None and loaded.state.seq > follower.state.seq
    assert loaded.header.skipped == ["FromTheFuture"]


def _header(skipped: list[str] | None) -> Header:
    return Header(format=3, corral="0.1.0", seq=10, codec="msgpack", length=0, sha256="", raw_length=0,
                  skipped=skipped)


def test_a_snapshot_without_the_record_is_suspect_only_to_a_reader_that_decodes_more() -> None:
    """Every format-3 writer before the record decoded UNRECORDED_DECODED: a reader that decodes nothing more
    uses its snapshots; one that decodes a newer type does not (its writer may have skipped it). This corral
    decodes newer types (JobHeld, GpuUnhealthy, ...): it folds such a snapshot's positions from the log."""
    assert suspect(_header(None), frozenset(UNRECORDED_DECODED)) is None
    assert decoded_tags() >= UNRECORDED_DECODED
    newer = suspect(_header(None), frozenset(UNRECORDED_DECODED) | {"EpochRefused"})
    assert newer is not None and "EpochRefused" in newer and "without a record" in newer
    ours = suspect(_header(None))
    newest = sorted(decoded_tags() - UNRECORDED_DECODED)
    assert (ours is None) == (not newest)
    assert ours is None or all(tag in ours for tag in newest)
    assert suspect(_header([])) is None
    assert suspect(_header(["FromTheFuture"])) is None
    why = suspect(_header(["FromTheFuture", "QueueDeleted"]))
    assert why is not None and "QueueDeleted" in why and "FromTheFuture" not in why
