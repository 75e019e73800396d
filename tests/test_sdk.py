"""The client SDK against a real nats-server: idempotent submit, cancel, queues, watch, wait."""

from __future__ import annotations

import asyncio
import re
import time
from contextlib import aclosing

import pytest

from events.bus import Bus, Envelope
from events.sdk import Client, new_job_id
from events.subjects import valid_id
from schemas import (
    CancelRequested,
    InvalidJobSpec,
    JobCompleted,
    JobRunning,
    JobSpec,
    JobSubmitted,
    QueueDefined,
)

SPEC = JobSpec(name="train", ranks=2, gpus_per_rank=8)


async def log(bus: Bus) -> list[Envelope]:
    return [e async for batch in bus.replay() for e in batch]


async def test_submit_with_an_id_is_idempotent(bus: Bus) -> None:
    client = Client(bus, user="alice")
    assert await client.submit(SPEC, job_id="j-retry") == "j-retry"
    assert await client.submit(SPEC, job_id="j-retry") == "j-retry"  # a retry after a lost reply
    (env,) = await log(bus)
    assert isinstance(env.event, JobSubmitted)
    assert env.event.job_id == "j-retry" and env.event.spec == SPEC and env.event.submitted_by == "alice"
    assert env.event.event_id == "submit:j-retry"
    assert env.subject == "corral.job.j-retry.JobSubmitted"


async def test_submit_generates_short_readable_ids(bus: Bus) -> None:
    client = Client(bus)
    ids = [await client.submit(SPEC) for _ in range(3)]
    assert len(set(ids)) == 3
    assert all(re.fullmatch(r"j-[0-9a-f]{10}", i) and valid_id(i) for i in ids)
    assert [e.event.job_id for e in await log(bus)] == ids  # type: ignore[union-attr]
    assert valid_id(new_job_id())


async def test_submit_validates(bus: Bus) -> None:
    client = Client(bus)
    with pytest.raises(ValueError, match="job id"):
        await client.submit(SPEC, job_id="no.dots")
    with pytest.raises(InvalidJobSpec) as e:
        await client.submit({"name": "x", "ranks": 0, "bogus": 1})
    assert {p.path for p in e.value.problems} == {"ranks", "bogus"}
    job = await client.submit({"name": "from-yaml", "command": "python train.py"})
    (env,) = await log(bus)
    assert env.event.spec.command == ("sh", "-c", "python train.py")  # type: ignore[union-attr]
    assert env.event.job_id == job  # type: ignore[union-attr]


async def test_cancel_and_define_queue_are_idempotent(bus: Bus) -> None:
    client = Client(bus)
    s1 = await client.cancel("j-1", reason="no longer needed")
    assert await client.cancel("j-1", reason="no longer needed") == s1
    q1 = await client.define_queue("research", weight=2.0, guaranteed_gpus=16)
    assert await client.define_queue("research", weight=2.0, guaranteed_gpus=16) == q1
    q2 = await client.define_queue("research", weight=3.0, guaranteed_gpus=16)  # a change is a new fact
    assert q2 > q1
    events = [e.event for e in await log(bus)]
    assert [type(e) for e in events] == [CancelRequested, QueueDefined, QueueDefined]
    assert [e.weight for e in events[1:]] == [2.0, 3.0]  # type: ignore[union-attr]


async def test_watch_replays_history_then_follows_live(bus: Bus) -> None:
    client = Client(bus)
    job = await client.submit(SPEC, job_id="j-watch")
    await client.submit(SPEC, job_id="j-other")
    await bus.append(JobRunning(event_id="running:j-watch:1", occurred_at=time.time(), job_id=job, attempt=1))
    seen: list[str] = []
    async with asyncio.timeout(10), aclosing(client.watch(job)) as events:
        async for env in events:
            seen.append(type(env.event).__name__)
            if len(seen) == 2:  # history is in; now something live
                await bus.append(JobCompleted(event_id="done:j-watch", occurred_at=time.time(), job_id=job,
                                              attempt=1))
            if len(seen) == 3:
                break
    assert seen == ["JobSubmitted", "JobRunning", "JobCompleted"]


async def test_wait_returns_the_final_event(bus: Bus) -> None:
    client = Client(bus)
    job = await client.submit(SPEC)

    async def finish_later() -> None:
        await bus.append(JobRunning(event_id=f"running:{job}", occurred_at=time.time(), job_id=job, attempt=1))
        await bus.append(JobCompleted(event_id=f"done:{job}", occurred_at=time.time(), job_id=job, attempt=1))

    async with asyncio.TaskGroup() as tg:
        tg.create_task(finish_later())
        env = await client.wait(job, timeout=10)
    assert isinstance(env.event, JobCompleted)
    running = await client.wait(job, until={"JobRunning"}, timeout=10)
    assert isinstance(running.event, JobRunning)


async def test_wait_times_out(bus: Bus) -> None:
    client = Client(bus)
    job = await client.submit(SPEC)
    with pytest.raises(TimeoutError):
        await client.wait(job, timeout=0.3)
    assert (await bus.js.stream_info(bus.stream)).state.consumer_count == 0  # the watch cleaned up
