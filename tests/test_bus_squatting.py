"""Nats-Msg-Id squatting against a real nats-server (deploy/README.md, "Residual risks").

The duplicate window is per stream, not per subject: whoever publishes first
under an event id owns it, and a later publish under that id is acked as a
duplicate and not stored. The bus checks where a duplicate ack points, so an
event it reports as appended is in the log on its own subject.
"""

from __future__ import annotations

import msgspec
import nats
import pytest

from events.bus import Bus, BusError, IdSquatted
from events.server import NatsServer
from events.subjects import subject_for
from schemas import JobRunning, JobSpec, JobSubmitted, WorkerStarted

T0 = 1_750_000_000.0


def running(job: str) -> JobRunning:
    # decide's ids are predictable: kind, job, attempt
    return JobRunning(event_id=f"running:{job}:1", occurred_at=T0, job_id=job, attempt=1)


def started(job: str, rank: int) -> WorkerStarted:
    return WorkerStarted(event_id=f"started:{job}:{rank}", occurred_at=T0, job_id=job, attempt=1, rank=rank,
                         node_id="node-1")


async def squat(nats_server: NatsServer, event_id: str, job: str) -> int:
    """What a client may do: publish on a subject it is allowed to, under someone else's future event id."""
    nc = await nats.connect(nats_server.url)
    try:
        ack = await nc.jetstream().publish(f"corral.job.{job}.JobSubmitted", b"{}", headers={"Nats-Msg-Id": event_id})
    finally:
        await nc.close()
    assert not ack.duplicate
    return int(ack.seq)


async def stored_on(bus: Bus, subject: str) -> int:
    info = await bus.js.stream_info(bus.stream, subjects_filter=subject)
    return int((info.state.subjects or {}).get(subject, 0))


async def test_append_under_a_squatted_id_raises(nats_server: NatsServer, bus: Bus) -> None:
    await bus.append(started("a", 0))
    decision = running("a")
    seq = await squat(nats_server, decision.event_id, "a")
    with pytest.raises(IdSquatted) as err:
        await bus.append(decision)
    assert isinstance(err.value, BusError)
    assert (err.value.event_id, err.value.seq, err.value.found) == (decision.event_id, seq,
                                                                    "corral.job.a.JobSubmitted")
    assert decision.event_id in str(err.value) and str(seq) in str(err.value)
    assert await stored_on(bus, subject_for(decision)) == 0, "the decision is not in the log"


async def test_append_many_under_a_squatted_id_raises(nats_server: NatsServer, bus: Bus) -> None:
    decision = running("a")
    seq = await squat(nats_server, decision.event_id, "a")
    with pytest.raises(IdSquatted) as err:
        await bus.append_many([started("a", 0), decision, started("a", 1)])
    assert (err.value.event_id, err.value.seq) == (decision.event_id, seq)
    # The others were stored; appending the batch again stores nothing twice and fails the same way.
    with pytest.raises(IdSquatted):
        await bus.append_many([started("a", 0), decision, started("a", 1)])
    assert await bus.last_seq() == 3


async def test_honest_duplicates_still_return_the_original(bus: Bus) -> None:
    """A retry of our own append, also one re-encoded with a new occurred_at (a service deciding
    the same again, a client re-submitting), is on the same subject: the original's sequence."""
    first = await bus.append(running("a"))
    assert await bus.append(running("a")) == first
    later = msgspec.structs.replace(running("a"), occurred_at=T0 + 5.0)
    assert await bus.append(later) == first
    assert await bus.append_many([started("a", 0), later]) == [2, first]
    assert await bus.last_seq() == 2
    assert await stored_on(bus, subject_for(later)) == 1


async def test_duplicates_are_checked_without_direct_get(bus: Bus) -> None:
    """A stream an operator made without allow_direct: the check falls back to the stream API."""
    config = (await bus.js.stream_info(bus.stream)).config
    await bus.js.update_stream(config.evolve(allow_direct=False))
    first = await bus.append(running("a"))
    assert await bus.append(running("a")) == first
    other = JobSubmitted(event_id=running("b").event_id, occurred_at=T0, job_id="b",
                         spec=JobSpec(name="b", command=("true",)))
    await bus.append(other)
    with pytest.raises(IdSquatted):
        await bus.append(running("b"))


async def test_services_append_a_squatted_decision_under_a_fresh_id(nats_server: NatsServer, bus: Bus) -> None:
    """The scheduler and agents append through append_reclaiming: a squatted id does not hold their event off."""
    from events.bus import append_reclaiming

    first, decision, last = started("b", 0), running("b"), started("b", 1)
    squatted = await squat(nats_server, decision.event_id, "b")
    seqs = await append_reclaiming(bus, [first, decision, last])
    assert len(seqs) == 3 and squatted not in seqs
    stored = {}
    async for batch in bus.replay():
        stored.update({env.seq: env for env in batch})
    got = stored[seqs[1]]
    assert got.subject == subject_for(decision)
    assert got.event.event_id.startswith(decision.event_id + "~")  # type: ignore[union-attr]
    assert msgspec.structs.replace(got.event, event_id=decision.event_id) == decision
    assert [stored[s].event for s in (seqs[0], seqs[2])] == [first, last]
    # Honest retries of the same batch store nothing twice.
    assert (await append_reclaiming(bus, [first, last])) == [seqs[0], seqs[2]]
