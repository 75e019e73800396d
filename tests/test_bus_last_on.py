"""`Bus.last_on`: the newest event on a subject, where a compare-and-set on it (`append_after`) starts.

Checked against a replay of the whole stream (another read path): the newest
envelope on the subject there is the one `last_on` names.
"""

from __future__ import annotations

import nats.js.errors
import pytest

from events.bus import Bus, Envelope, NotLast
from events.subjects import subject_for
from schemas import JobRunning, SchedulerElected, Unknown

T0 = 1_750_000_000.0
ELECTIONS = subject_for(SchedulerElected(event_id="-", occurred_at=0.0, epoch=0, scheduler_id="-"))


def elected(epoch: int) -> SchedulerElected:
    return SchedulerElected(event_id=f"elected:{epoch}", occurred_at=T0, epoch=epoch, scheduler_id=f"s{epoch}")


async def newest_by_replay(bus: Bus, subject: str) -> Envelope | None:
    found = None
    async for batch in bus.replay():
        for env in batch:
            if env.subject == subject:
                found = env
    return found


async def test_last_on_is_the_newest_event_on_its_subject_and_none_before_one(bus: Bus) -> None:
    assert await bus.last_on(ELECTIONS) is None
    await bus.append(JobRunning(event_id="r1", occurred_at=T0, job_id="j1", attempt=1))
    assert await bus.last_on(ELECTIONS) is None  # other subjects do not count
    await bus.append_many([elected(1), JobRunning(event_id="r2", occurred_at=T0, job_id="j2", attempt=1), elected(2),
                           JobRunning(event_id="r3", occurred_at=T0, job_id="j3", attempt=1)])
    newest = await bus.last_on(ELECTIONS)
    expected = await newest_by_replay(bus, ELECTIONS)
    assert newest is not None and expected is not None
    assert (newest.seq, newest.subject, newest.event) == (expected.seq, expected.subject, expected.event)
    assert isinstance(newest.event, SchedulerElected) and newest.event.epoch == 2
    assert abs(newest.stream_time - expected.stream_time) < 1e-5  # the API's microseconds, not the replay's ns


async def test_last_on_names_an_undecodable_newest_message_by_its_position(bus: Bus) -> None:
    """The election's compare-and-set needs the subject's newest position even when nobody can read it."""
    await bus.append(elected(1))
    ack = await bus.js.publish(ELECTIONS, b"\xffnot an event")
    newest = await bus.last_on(ELECTIONS)
    assert newest is not None and newest.seq == ack.seq and isinstance(newest.event, Unknown)
    with pytest.raises(NotLast):
        await bus.append_after(elected(2), 1)  # the readable one is no longer the newest
    assert await bus.append_after(elected(2), newest.seq) == ack.seq + 1


async def test_message_at_reads_a_position_with_and_without_direct_gets(bus: Bus) -> None:
    seqs = await bus.append_many([elected(1), elected(2)])
    assert (await bus.message_at(seqs[1])).subject == ELECTIONS
    info = await bus.js.stream_info(bus.stream)
    await bus.js.update_stream(info.config.evolve(allow_direct=False))  # as an operator may make it
    stored = await bus.message_at(seqs[0])
    assert stored.seq == seqs[0] and stored.headers is not None and stored.headers["Nats-Msg-Id"] == "elected:1"
    await bus.js.delete_msg(bus.stream, seqs[0])
    with pytest.raises(nats.js.errors.NotFoundError):
        await bus.message_at(seqs[0])
