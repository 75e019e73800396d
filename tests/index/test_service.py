"""The index service (orchestrator/index/service.py) on a real nats-server: it follows the stream and answers
over request/reply; bad requests get a clear refusal and the service goes on; a gap stops it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from events.archive import Archive
from events.bus import Bus, LogGap
from events.history import History
from events.logfile import LogFile
from orchestrator.archiver import Archiver, ArchiverConfig
from orchestrator.index import api
from orchestrator.index.client import IndexRefused, NoIndex, ask
from orchestrator.index.service import IndexService, stamp_seconds
from schemas import JobSpec, JobSubmitted, Unknown
from schemas.codec import decode
from tests.archive.workload import snapshot_at_end
from tests.index.held_index import Held


async def load(bus: Bus, path: Path) -> int:
    events = [env.event for env in LogFile(path).envelopes() if not isinstance(env.event, Unknown)]
    await bus.append_many(events)
    return await bus.last_seq()


async def until_folded(service: IndexService, seq: int) -> None:
    while service.seq < seq:  # (pytest-timeout bounds it)
        await asyncio.sleep(0.02)


@pytest.fixture
async def indexed(bus: Bus, sim_log: Path, tmp_path: Path) -> AsyncIterator[tuple[IndexService, int]]:
    last = await load(bus, sim_log)
    service = IndexService(bus, tmp_path / "index")
    task = asyncio.create_task(service.run())
    try:
        await asyncio.wait_for(service.caught_up.wait(), 60)
        yield service, last
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def raw(bus: Bus, subject: str, data: bytes) -> dict[str, object]:
    msg = await bus.nc.request(subject, data, timeout=5)
    return json.loads(msg.data)  # type: ignore[no-any-return]


@pytest.mark.parametrize(("subject", "body", "error", "says"), [
    (api.USAGE, b"\xff not json", "bad_request", "bad corral-index.usage request"),
    (api.USAGE, b'{"by": "planet"}', "bad_request", "planet"),
    (api.USAGE, b'{"since": 10, "until": 5}', "bad_request", "before since"),
    (api.USAGE, b'{"by": "queue", "drop": "table"}', "bad_request", "drop"),
    (api.JOBS, b'{"limit": 0}', "bad_request", "limit 0"),
    (api.JOBS, b'{"limit": 1000000}', "bad_request", "limit 1000000"),
    (api.JOBS, b'{"states": ["asleep"]}', "bad_request", "asleep"),
    (api.JOBS, b'{"queue": "no such/queue"}', "bad_request", "not a valid corral id"),
    (api.JOBS, b'{"after": "yesterday"}', "bad_request", "after"),
    (api.JOB, b"{}", "bad_request", "job_id"),
    (api.JOB, b'{"job_id": "../../etc/passwd"}', "bad_request", "not a valid corral id"),
    (api.JOB, b'{"job_id": "no-such-job"}', "not_found", "no job 'no-such-job'"),
    (api.EVENTS, b'{"job_id": "no-such-job"}', "not_found", "no event about job"),
    (api.EVENTS, b'{"job_id": "j000001", "limit": -3}', "bad_request", "limit -3"),
    (api.USAGE, b"[" * 200_000, "bad_request", "bad corral-index.usage request"),
])
async def test_a_bad_request_gets_a_clear_refusal_and_the_service_goes_on(
        indexed: tuple[IndexService, int], bus: Bus, subject: str, body: bytes, error: str, says: str) -> None:
    service, last = indexed
    reply = await raw(bus, subject, body)
    assert reply["ok"] is False and reply["error"] == error
    assert says in str(reply["message"])
    ok = await ask(bus.nc, api.USAGE, api.UsageRequest(), api.UsageReply)
    assert ok.rows and ok.as_of_seq == last and service.refused == 1


async def test_an_index_still_catching_up_takes_no_request_and_says_not_ready(bus: Bus, sim_log: Path,
                                                                              tmp_path: Path) -> None:
    """Readiness is part of the protocol (#39): until caught up an index is in no queue group (an asker finds no
    responder, or a caught-up replica), and a request that reaches it anyway is refused `not_ready`."""
    last = await load(bus, sim_log)
    held = Held(bus, last // 2)
    service = IndexService(bus, tmp_path / "index", history=held)
    task = asyncio.create_task(service.run())
    try:
        await asyncio.wait_for(held.reached.wait(), 60)
        reply = await service.answer(api.USAGE, b"{}")
        assert not reply.ok and reply.error == api.NOT_READY and "not caught up" in reply.message, reply
        assert not service.serving.is_set() and service.seq == last // 2
        with pytest.raises(NoIndex):
            await ask(bus.nc, api.USAGE, api.UsageRequest(), api.UsageReply, timeout=2)
        held.opened.set()
        await asyncio.wait_for(service.serving.wait(), 60)
        ok = await ask(bus.nc, api.USAGE, api.UsageRequest(at_least=last), api.UsageReply)
        assert ok.rows and ok.as_of_seq == last
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_an_unknown_subject_is_refused(indexed: tuple[IndexService, int]) -> None:
    reply = await indexed[0].answer("corral-index.drop", b"{}")
    assert not reply.ok and reply.error == "bad_request" and "unknown request subject" in reply.message


async def test_jobs_come_in_bounded_pages_that_add_up_to_every_job(indexed: tuple[IndexService, int], bus: Bus,
                                                                  sim_log: Path) -> None:
    submitted = [json.loads(line)["job_id"] for line in sim_log.read_bytes().splitlines()
                 if json.loads(line)["type"] == "JobSubmitted"]
    request, listed, pages = api.JobsRequest(limit=7), [], 0
    while True:
        reply = await ask(bus.nc, api.JOBS, request, api.JobsReply)
        assert len(reply.jobs) <= 7 and reply.as_of_seq == indexed[1]
        listed += [j.job_id for j in reply.jobs]
        pages += 1
        if reply.next_after is None:
            break
        request = msgspec.structs.replace(request, after=reply.next_after)
    assert listed == submitted and pages == -(-len(submitted) // 7)
    mine = await ask(bus.nc, api.JOBS, api.JobsRequest(user="nobody"), api.JobsReply)
    assert mine.jobs == [] and mine.next_after is None


async def test_a_story_comes_back_as_the_stream_stores_it(indexed: tuple[IndexService, int], bus: Bus,
                                                         sim_log: Path) -> None:
    victim = next(json.loads(line)["job_id"] for line in sim_log.read_bytes().splitlines()
                  if json.loads(line)["type"] == "Preempted")
    request, got = api.EventsRequest(job_id=victim, limit=3), []
    while True:
        reply = await ask(bus.nc, api.EVENTS, request, api.EventsReply)
        assert len(reply.events) <= 3
        got += reply.events
        if reply.next_after is None:
            break
        request = msgspec.structs.replace(request, after=reply.next_after)
    own = [e for e in got if e.own]
    assert [decode(e.data).job_id for e in own] == [victim] * len(own)  # type: ignore[union-attr]
    assert any(e.subject.endswith(".Preempted") for e in own)
    # Each is what a replay of the stream delivers at that position: subject, bytes and time to the bit.
    stored = {}
    async for batch in bus.replay(from_seq=got[0].seq, to_seq=got[-1].seq):
        stored.update({env.seq: env for env in batch})
    for e in got:
        assert e.subject == stored[e.seq].subject and e.time == stored[e.seq].stream_time
        assert decode(e.data) == stored[e.seq].event


async def test_it_follows_the_log_live(indexed: tuple[IndexService, int], bus: Bus) -> None:
    service, _ = indexed
    seq = await bus.append(JobSubmitted(event_id="live-1", occurred_at=1e9, job_id="live-1", submitted_by="zoe",
                                        spec=JobSpec(name="fresh", queue="team-a", ranks=1, gpus_per_rank=1)))
    await until_folded(service, seq)
    while True:  # committed within COMMIT_S of folding (pytest-timeout bounds the wait)
        try:
            reply = await ask(bus.nc, api.JOB, api.JobRequest(job_id="live-1"), api.JobReply)
            break
        except IndexRefused as e:
            assert e.error == "not_found" and e.reply.as_of_seq < seq
        await asyncio.sleep(0.05)
    assert reply.as_of_seq >= seq
    assert reply.job is not None and reply.job.user == "zoe" and reply.job.state == "pending"


async def test_restarted_it_resumes_from_its_position(bus: Bus, sim_log: Path, tmp_path: Path) -> None:
    last = await load(bus, sim_log)
    first = IndexService(bus, tmp_path)
    task = asyncio.create_task(first.run())
    await until_folded(first, 1000)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    again = IndexService(bus, tmp_path)
    task = asyncio.create_task(again.run())
    try:
        await asyncio.wait_for(again.caught_up.wait(), 60)
        reply = await ask(bus.nc, api.USAGE, api.UsageRequest(), api.UsageReply)
        assert reply.as_of_seq == last and reply.events == last  # each event folded once in all
        # (A reply is bounded in bytes too: page through, as a client does.)
        request, listed = api.JobsRequest(limit=1000), 0
        while True:
            jobs = await ask(bus.nc, api.JOBS, request, api.JobsReply)
            listed += len(jobs.jobs)
            if jobs.next_after is None:
                break
            request = msgspec.structs.replace(request, after=jobs.next_after)
        assert listed == 300
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_log_whose_head_was_removed_stops_it_naming_the_position(bus: Bus, sim_log: Path,
                                                                         tmp_path: Path) -> None:
    await load(bus, sim_log)
    await bus.js.purge_stream(bus.stream, seq=100)  # removes positions 1..99
    with pytest.raises(LogGap) as gap:
        await asyncio.wait_for(IndexService(bus, tmp_path).run(), 60)
    assert gap.value.expected == 1 and "seq 1..99 are not in the stream" in str(gap.value)


async def test_without_an_index_the_asker_is_told_so(bus: Bus) -> None:
    with pytest.raises(NoIndex, match="no index service answers"):
        await ask(bus.nc, api.USAGE, api.UsageRequest(), api.UsageReply)


async def test_a_refusal_reaches_the_asker_as_an_error(indexed: tuple[IndexService, int], bus: Bus) -> None:
    with pytest.raises(IndexRefused) as refused:
        await ask(bus.nc, api.JOB, api.JobRequest(job_id="nope"), api.JobReply)
    assert refused.value.error == "not_found"


def test_a_direct_gets_time_stamp_reads_to_the_nanosecond() -> None:
    assert stamp_seconds("2026-12-03T10:40:26.811159612Z") == 1796294426811159612 / 1e9
    assert stamp_seconds("2026-12-03T10:40:26Z") == 1796294426.0
    assert stamp_seconds("garbage") == 0.0


async def test_an_answer_includes_what_the_asker_saw_in_the_log(indexed: tuple[IndexService, int], bus: Bus) -> None:
    """Read your writes: asked with `at_least` (the log's end as the asker saw it), the index answers once it
    has folded and committed that far, not as of a moment before."""
    seq = await bus.append(JobSubmitted(event_id="now-1", occurred_at=1e9, job_id="now-1",
                                        spec=JobSpec(name="fresh", queue="team-a", ranks=1, gpus_per_rank=1)))
    reply = await ask(bus.nc, api.JOB, api.JobRequest(job_id="now-1", at_least=seq), api.JobReply)
    assert reply.as_of_seq >= seq and reply.job is not None and reply.job.job_id == "now-1"


async def _story(bus: Bus, job_id: str) -> list[api.StoredEvent]:
    request, got = api.EventsRequest(job_id=job_id, limit=5), []
    while True:
        reply = await ask(bus.nc, api.EVENTS, request, api.EventsReply)
        got += reply.events
        if reply.next_after is None:
            return got
        request = msgspec.structs.replace(request, after=reply.next_after)


async def test_with_the_archive_it_rebuilds_and_tells_stories_the_stream_dropped(bus: Bus, sim_log: Path,
                                                                                 tmp_path: Path) -> None:
    """Retention purged the stream's head: given the archive, the index folds every position (archive, then
    stream) and `explain`'s events that only the archive holds come back as the stream stored them; a segment
    that fails its check is named in the refusal, never read."""
    last = await load(bus, sim_log)
    victim = next(json.loads(line)["job_id"] for line in sim_log.read_bytes().splitlines()
                  if json.loads(line)["type"] == "Preempted")
    stored = {}
    async for batch in bus.replay():
        stored.update({env.seq: env for env in batch})
    await snapshot_at_end(bus)
    path = tmp_path / "archive"
    archiver = asyncio.create_task(Archiver(bus, ArchiverConfig(path, segment_events=500, segment_seconds=0.2,
                                                                max_bytes=1, purge_every_s=0.1)).run())
    try:
        while (await bus.js.stream_info(bus.stream)).state.first_seq <= last:  # (pytest-timeout bounds it)
            assert not archiver.done(), archiver
            await asyncio.sleep(0.05)
    finally:
        archiver.cancel()
        await asyncio.gather(archiver, return_exceptions=True)

    service = IndexService(bus, tmp_path / "index", history=History(bus, Archive(path)))
    task = asyncio.create_task(service.run())
    try:
        await asyncio.wait_for(service.caught_up.wait(), 60)
        usage = await ask(bus.nc, api.USAGE, api.UsageRequest(), api.UsageReply)
        assert usage.as_of_seq == last and usage.events == last
        # (A reply is bounded in bytes too: page through, as a client does.)
        request, listed = api.JobsRequest(limit=1000), 0
        while True:
            jobs = await ask(bus.nc, api.JOBS, request, api.JobsReply)
            listed += len(jobs.jobs)
            if jobs.next_after is None:
                break
            request = msgspec.structs.replace(request, after=jobs.next_after)
        assert listed == 300
        story = await _story(bus, victim)
        assert story and any(e.subject.endswith(".Preempted") for e in story)
        for e in story:
            assert e.subject == stored[e.seq].subject and e.time == stored[e.seq].stream_time
            assert decode(e.data) == stored[e.seq].event

        seg = next(path / m.segment for m in Archive(path).segments() if m.first_seq <= story[0].seq <= m.last_seq)
        blob = bytearray(seg.read_bytes())
        blob[len(blob) // 2] ^= 0x20
        seg.write_bytes(bytes(blob))
        with pytest.raises(IndexRefused) as refused:
            await _story(bus, victim)
        assert refused.value.error == "unavailable" and f"segment {seg}: checksum mismatch" in str(refused.value)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
