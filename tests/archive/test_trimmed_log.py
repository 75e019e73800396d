"""A trimmed log is never answered silently (#30): each reader names the range the stream lost, or reads the archive.

A real nats-server holds a log with placements and completions; the archiver
copies it to an archive, then the stream's head is purged (JetStream purge
with a sequence), leaving positions HEAD.. in the stream. Without the archive,
`usage`, `explain`, `tail` (with and without --no-follow, filtered or not,
from a position or a time) and `replay` exit 1 naming "seq 1..HEAD-1 are not in
the stream" and the archive option, with nothing on stdout; the index cannot
be built from what is left either, so it never answers from it. With
`--archive` (or CORRAL_ARCHIVE) every answer is what it was before the purge;
`tail`'s is checked against the raw stream read with nats-py alone.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from contextlib import aclosing
from pathlib import Path

import pytest

from events.bus import Bus, LogGap
from events.server import NatsServer
from events.snapshots import SnapshotStore
from orchestrator.archiver import Archiver, ArchiverConfig
from orchestrator.index.service import IndexService
from tests.archive.segcheck import read_stream
from tests.cli.conftest import corral
from tests.test_snapshots import fold_to, workload

#: The stream keeps positions HEAD.. after the purge.
HEAD = 41
JOB = "j001"


async def _log_archived(url: str, archive: Path) -> tuple[int, float]:
    """Append the workload (its first HEAD-1 events a moment before the rest), archive all of it and save a
    snapshot at HEAD-1; the log's length, and the stream time of position HEAD-1."""
    log = workload()
    bus = await Bus.connect(url)
    try:
        await bus.append_many(log[:HEAD - 1])
        await asyncio.sleep(0.05)  # position HEAD is stored later than HEAD-1: `--since` between them
        await bus.append_many(log[HEAD - 1:])
        await SnapshotStore(bus.js).save(fold_to(log, HEAD - 1))
        archiver = Archiver(bus, ArchiverConfig(archive, segment_events=16, segment_seconds=0.1))
        task = asyncio.create_task(archiver.run())
        try:
            async with asyncio.timeout(30):
                while archiver.archived < len(log):
                    assert not task.done(), task.exception()
                    await asyncio.sleep(0.05)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        async with aclosing(bus.replay(from_seq=HEAD - 1, to_seq=HEAD - 1)) as batches:
            async for batch in batches:
                return len(log), batch[0].stream_time
        raise AssertionError(f"no position {HEAD - 1}")
    finally:
        await bus.close()


async def _purge_head(url: str) -> None:
    bus = await Bus.connect(url)
    try:
        await bus.js.purge_stream(bus.stream, seq=HEAD)  # removes 1..HEAD-1
        assert int((await bus.js.stream_info(bus.stream)).state.first_seq) == HEAD
    finally:
        await bus.close()


async def _index_refuses(url: str, data: Path) -> LogGap:
    """An index built from the purged stream alone stops, naming the range: it never answers from part."""
    bus = await Bus.connect(url)
    try:
        with pytest.raises(LogGap) as gap:
            await asyncio.wait_for(IndexService(bus, data).run(), 60)
        return gap.value
    finally:
        await bus.close()


READERS: dict[str, tuple[str, ...]] = {
    "usage": ("usage", "--until", "2020-01-01T00:00:00+00:00", "--json"),  # (a fixed end: the workload leaves GPUs held)
    "usage by user": ("usage", "--by", "user", "--until", "2020-01-01T00:00:00+00:00"),
    "explain": ("explain", JOB, "--json"),
    "explain text": ("explain", JOB),
    "tail --no-follow": ("tail", "--no-follow", "--json"),
    "tail --from-seq 1": ("tail", "--from-seq", "1", "--no-follow"),
    "tail --job": ("tail", "--job", JOB, "--no-follow", "--json"),
    "tail following from seq 1": ("tail", "--from-seq", "1"),
    "replay --no-snapshot": ("replay", "--no-snapshot", "--json"),
    "replay --at": ("replay", "--at", "#10", "--json"),
    "replay --at after the start": ("replay", "--at", "+0", "--json"),  # (counts from the first event)
    "usage since the start": ("usage", "--since", "+0", "--until", "+0.001", "--json"),
}


@pytest.mark.timeout(240)
def test_readers_name_the_missing_range_or_read_the_archive(nats_server: NatsServer, tmp_path: Path) -> None:
    url = nats_server.url
    archive = tmp_path / "archive"
    length, head_time = asyncio.run(_log_archived(url, archive))

    def answer(name: str, *before: str) -> str:
        args = READERS[name]
        return corral(*before, *args, *(["--no-index"] if args[0] in ("usage", "explain") else []), url=url).stdout

    whole = {name: answer(name) for name in READERS if "following" not in name}
    asyncio.run(_purge_head(url))
    raw = asyncio.run(read_stream(url))
    assert min(raw) == HEAD and max(raw) == length

    missing = f"seq 1..{HEAD - 1} are not in the stream: it now starts at seq {HEAD}"
    for name, args in READERS.items():
        got = corral(*args, url=url, check=None)
        assert got.returncode == 1, (name, got.returncode, got.stderr)
        lost = missing.replace("seq 1..", "seq 10..") if name == "replay --at" else missing  # (#10 itself is gone)
        assert lost in got.stderr and "--archive PATH" in got.stderr, (name, got.stderr)
        assert got.stdout == "", (name, got.stdout[:300])

    # From a time: the purged positions may hold events of the window (the first kept one is later).
    since = dt.datetime.fromtimestamp(head_time, dt.UTC).isoformat()
    got = corral("tail", "--since", since, "--no-follow", url=url, check=1)
    assert missing in got.stderr and got.stdout == "", got.stderr
    got = corral("replay", "--at", since, url=url, check=1)
    assert missing in got.stderr and "before the stream's first event" in got.stderr and got.stdout == "", got.stderr

    # Asked only for what the stream holds, or from the snapshot that covers the purged head: full answers.
    kept = corral("tail", "--from-seq", str(HEAD), "--no-follow", "--json", url=url).stdout.splitlines()
    assert [json.loads(x)["seq"] for x in kept] == list(range(HEAD, length + 1))
    assert json.loads(corral("replay", "--json", url=url).stdout)["at"]["seq"] == length

    # The index cannot be built from the trimmed stream alone: it stops naming the range, so never answers.
    gap = asyncio.run(_index_refuses(url, tmp_path / "index"))
    assert gap.expected == 1 and f"seq 1..{HEAD - 1} are not in the stream" in str(gap)
    assert corral("usage", "--json", url=url, check=1).stdout == ""

    # With the archive (the option, or CORRAL_ARCHIVE), every answer is what it was before the purge.
    for name, was in whole.items():
        assert answer(name, "--archive", str(archive)) == was, name
    exported = [json.loads(x) for x in whole["tail --no-follow"].splitlines()]
    assert [e["seq"] for e in exported] == list(range(1, length + 1))
    assert all(json.loads(raw[e["seq"]][3]) == e["event"] for e in exported if e["seq"] in raw), \
        "as the stream holds them (nats-py)"
    usage = json.loads(whole["usage"])
    assert usage["seq"] == length and usage["events"] == length and usage["gpu_hours"] > 0
    story = json.loads(whole["explain"])
    assert story["job_id"] == JOB and story["timeline"] and story["timeline"][0]["seq"] < HEAD
    env_usage = corral(*READERS["usage"], "--no-index", url=url, env={"CORRAL_ARCHIVE": str(archive)})
    assert env_usage.stdout == whole["usage"]
