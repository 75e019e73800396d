"""#28 acceptance 2: with a small retention, readers given the archive answer as before the events left the stream.

A real workload (an in-process scheduler snapshotting every 40 events, two agents with the simulated
runtime, 36 jobs in two queues) on a real nats-server; then the archiver, with a stream size limit of one
byte, archives the log in several segments and purges the stream up to the oldest snapshot the scheduler keeps.
The CLI (through its parser) is asked the same questions before and after: `explain` of the oldest job
(whose events all left the stream), `usage`, `replay --at` a position only the archive holds, `tail
--from-seq 1`. `usage`'s totals are also checked against an independent sum over the workload's raw
events (the JSON the stream held, read with nats-py alone).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from events.bus import Bus
from events.nodeviews import NODEVIEW_BUCKET
from events.sdk import Client
from events.server import NatsServer
from events.snapshots import SNAPSHOT_BUCKET, SnapshotStore
from orchestrator.archiver import Archiver, ArchiverConfig
from schemas import JobSpec
from tests.archive.segcheck import check_prefix, read_archive, read_stream
from tests.cli.conftest import corral
from tests.faults.services import agent_proc, stop_all, until
from tests.index.test_cli import ROOT, _until_indexed
from tests.integration.harness import agents, scheduler, wait_until

JOBS = 36
SNAPSHOT_EVERY = 40


async def _workload(url: str, data: Path) -> list[str]:
    """Run JOBS jobs to completion; returns their ids in submit order, once a snapshot covers most of the log."""
    bus = await Bus.connect(url)
    try:
        async with scheduler(bus, snapshot_every=SNAPSHOT_EVERY) as sched, agents(bus, 2, data, gpus=4):
            await wait_until(sched.follower, lambda s: s.epoch >= 1 and len(s.nodes) == 2, 30, "leader and nodes")
            client = Client(bus, user="alice")
            ids = [f"r{i:03d}" for i in range(JOBS)]
            for i, job_id in enumerate(ids):
                spec = JobSpec(name=job_id, queue=("research", "prod")[i % 2], ranks=1 + i % 2,
                               gpus_per_rank=1 + i % 3, command=("sleep", f"0.0{2 + i % 5}"))
                await client.submit(spec, job_id=job_id, submitted_by=("alice", "bob")[i % 3 % 2])
            await wait_until(sched.follower, lambda s: all(s.jobs[j].status == "completed" for j in ids), 60,
                             "every job completed")
            # The newest snapshot near the log's end: the archiver may then purge up to the oldest one the
            # store keeps (SnapshotSeq), KEEP snapshots back, well past the workload's first jobs.
            store = SnapshotStore(bus.js)
            end = await bus.last_seq()
            async with asyncio.timeout(30):
                while await store.newest_seq() < end - SNAPSHOT_EVERY:
                    await asyncio.sleep(0.2)
            return ids
    finally:
        await bus.close()


async def _archive_and_purge(url: str, path: Path, past: int) -> int:
    """Run the archiver until the stream no longer holds position `past`; the stream's first position then."""
    bus = await Bus.connect(url)
    try:
        archiver = Archiver(bus, ArchiverConfig(path, segment_events=60, segment_seconds=0.3, max_bytes=1,
                                                purge_every_s=0.2))
        task = asyncio.create_task(archiver.run())
        try:
            async with asyncio.timeout(30):
                while (first := (await bus.js.stream_info("CORRAL")).state.first_seq) <= past:
                    assert not task.done(), task.exception()
                    await asyncio.sleep(0.1)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        return int(first)
    finally:
        await bus.close()


def independent_usage(stream: dict[int, tuple[int, str, int, bytes]]) -> dict[str, float]:
    """GPU-seconds per queue from the raw events: each job's GangReserved to its JobCompleted, on the events'
    own clock, times its ranks x GPUs (one reservation per job in this workload: checked)."""
    spec: dict[str, dict[str, object]] = {}
    reserved: dict[str, float] = {}
    out: dict[str, float] = defaultdict(float)
    for _, _, _, data in sorted(stream.values()):
        ev = json.loads(data)
        kind, job = ev["type"], ev.get("job_id")
        if kind == "JobSubmitted":
            spec[job] = ev["spec"]
        elif kind == "GangReserved":
            assert job not in reserved, f"{job} reserved twice: not this workload"
            reserved[job] = ev["occurred_at"]
        elif kind == "JobCompleted":
            s = spec[job]
            out[str(s["queue"])] += int(s["ranks"]) * int(s["gpus_per_rank"]) * (ev["occurred_at"] - reserved[job])
    return dict(out)


@pytest.mark.timeout(180)
def test_readers_answer_from_the_archive_as_they_did_from_the_stream(nats_server: NatsServer, tmp_path: Path) -> None:
    url = nats_server.url
    ids = asyncio.run(_workload(url, tmp_path / "agents"))
    oldest = ids[0]
    stream = asyncio.run(read_stream(url))
    last_of_oldest = max(seq for seq, subject, _, _ in stream.values() if f".{oldest}." in subject)
    at = 30  # a position retention will drop

    story = corral("explain", oldest, url=url).stdout
    story_json = json.loads(corral("explain", oldest, "--json", url=url).stdout)
    usage = json.loads(corral("usage", "--json", url=url).stdout)
    by_user = json.loads(corral("usage", "--by", "user", "--json", url=url).stdout)
    cluster = json.loads(corral("replay", "--at", f"#{at}", "--json", url=url).stdout)
    log = corral("tail", "--from-seq", "1", "--no-follow", "--json", url=url).stdout
    assert oldest in story and "completed" in story_json["status"]

    archive = tmp_path / "archive"
    first = asyncio.run(_archive_and_purge(url, archive, max(last_of_oldest, at)))
    segments = sorted(archive.glob("*.seg"))
    assert len(segments) >= 3, f"the workload spans several segments: {segments}"
    assert [r[0] for r in read_archive(archive)][: first - 1] == list(range(1, first))
    assert first > max(last_of_oldest, at), "the oldest job's events and position #30 left the stream"

    # Without the archive, a reader cannot see them (and says so); with it, every answer is as before.
    gone = corral("explain", oldest, url=url, check=None)
    assert gone.returncode != 0 and oldest in gone.stderr
    assert f"seq {at}..{first - 1} are not in the stream" in corral("replay", "--at", f"#{at}", url=url, check=1).stderr
    gap = corral("replay", "--no-snapshot", url=url, check=1)  # a fold from position 1 stops, naming it
    assert "log gap: the fold needs seq 1 next" in gap.stderr and "removed" in gap.stderr, gap.stderr

    arch = ("--archive", str(archive))
    assert corral(*arch, "explain", oldest, url=url).stdout == story
    assert json.loads(corral(*arch, "explain", oldest, "--json", url=url).stdout) == story_json
    assert json.loads(corral(*arch, "replay", "--at", f"#{at}", "--json", url=url).stdout) == cluster
    assert corral(*arch, "tail", "--from-seq", "1", "--no-follow", "--json", url=url).stdout == log
    after = json.loads(corral(*arch, "usage", "--json", url=url).stdout)
    after_by_user = json.loads(corral("usage", "--by", "user", "--json", url=url, env={"CORRAL_ARCHIVE": str(archive)})
                               .stdout)
    for before, now in ((usage, after), (by_user, after_by_user)):
        assert (now["rows"], now["gpu_hours"], now["events"], now["seq"]) == \
               (before["rows"], before["gpu_hours"], before["events"], before["seq"])
    expected = independent_usage(stream)
    assert {r["queue"]: r["gpu_hours"] * 3600 for r in after["rows"]} == pytest.approx(expected, rel=1e-9)
    assert sum(expected.values()) > 0


@pytest.mark.timeout(90)
def test_corral_up_archives_under_its_data_dir_when_asked(tmp_path: Path) -> None:
    """`corral up --max-bytes`: an archiver runs beside the scheduler, under DATA_DIR/archive; its segments are
    the prefix of the log the embedded server keeps (read back after it stopped)."""
    data = tmp_path / "up"
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "up", "--port", "0", "--nodes", "1",
                           "--gpus-per-node", "1", "--data-dir", str(data), "--duration", "3", "--max-bytes", "1GB",
                           "--segment-seconds", "0.2", "--log-level", "warning"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"archiving the log to {data / 'archive'}" in done.stdout
    recs = read_archive(data / "archive")
    assert len(recs) >= 3, "the scheduler's and the node's first events are archived"
    server = NatsServer(data / "nats").start()
    try:
        stream = asyncio.run(read_stream(server.url))
    finally:
        server.stop()
    check_prefix(recs, stream)


def _corral_proc(*args: str, url: str, log: Path) -> subprocess.Popen[bytes]:
    """A real `corral` process (no CORRAL_ARCHIVE from the test's environment: only what ARGS say)."""
    env = {k: v for k, v in os.environ.items() if k != "CORRAL_ARCHIVE"}
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *args], cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT, env={**env, "CORRAL_NATS_URL": url, "PYTHONPATH": str(ROOT),
                                                               "CORRAL_LOG_LEVEL": "info"})


def _ended(proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> tuple[int, str]:
    """(exit code, log) of a process that must stop by itself: one still running after `timeout` fails."""
    try:
        return proc.wait(timeout), log.read_text(errors="replace")
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"{proc.args} did not stop by itself; its log:\n{log.read_text()[-3000:]}") from None


async def _fresh_agent_works(url: str, data: Path) -> str:
    """A scheduler (from its snapshot) and a NEW `corral agent` process (a node id the log never named, no
    archive) on the purged stream: the agent registers and a job that only it can hold (8 GPUs a rank; the
    workload's nodes had 4) runs on it to completion. Returns the agent's log."""
    data.mkdir(parents=True)
    bus = await Bus.connect(url)
    proc = agent_proc(url, "fresh", data, gpus=8, index=4)
    try:
        async with scheduler(bus, snapshot_every=SNAPSHOT_EVERY) as sched:
            await until(sched.follower, lambda s: "fresh" in s.nodes and s.nodes["fresh"].schedulable, 60,
                        "the fresh node registered", alive=[proc])
            await Client(bus, user="alice").submit(JobSpec(name="big", queue="research", ranks=1, gpus_per_rank=8,
                                                           command=("sleep", "0.05")), job_id="big")
            await until(sched.follower, lambda s: s.jobs["big"].status == "completed", 60, "job big completed",
                        alive=[proc])
            ran = {p.node_id for p in sched.follower.state.jobs["big"].placement}
            assert ran == {"fresh"}, ran
    finally:
        stop_all([proc])
        await bus.close()
    return (data / "agent-fresh.log").read_text()


@pytest.mark.timeout(300)
def test_after_the_head_left_the_stream_a_fresh_agent_works_and_the_index_rebuilds(nats_server: NatsServer,
                                                                                  tmp_path: Path) -> None:
    """#28 acceptance 2 across the parts: retention purged the stream's head; then (a) a fresh agent starts from
    the newest snapshot + the stream's tail and runs a job, (b) `corral index --rebuild` without the archive stops
    naming the missing range, with it rebuilds every job: `usage` equals an independent sum and `explain` of a job
    whose events left the stream tells the story the log told before; `sim --from-cluster` re-runs every job with
    the archive and names the gap without, (c) with no usable snapshot or node view and no archive
    a fresh agent stops naming the range it misses, instead of hanging."""
    url = nats_server.url
    ids = asyncio.run(_workload(url, tmp_path / "agents"))
    oldest = ids[0]
    stream = asyncio.run(read_stream(url))
    last_of_oldest = max(seq for seq, subject, _, _ in stream.values() if f".{oldest}." in subject)
    story = corral("explain", oldest, "--no-index", url=url).stdout
    story_json = json.loads(corral("explain", oldest, "--no-index", "--json", url=url).stdout)
    last = max(stream)

    archive = tmp_path / "archive"
    first = asyncio.run(_archive_and_purge(url, archive, last_of_oldest))
    assert first > last_of_oldest and len(list(archive.glob("*.seg"))) >= 3

    # (b) The index: without the archive it cannot rebuild, and says which range it misses.
    log = tmp_path / "index-no-archive.log"
    rc, text = _ended(_corral_proc("index", "--data-dir", str(tmp_path / "idx0"), "--rebuild", url=url, log=log), log)
    assert rc != 0 and "the fold needs seq 1 next" in text, text
    assert f"seq 1..{first - 1} are not in the stream: it now starts at seq {first}" in text, text
    assert "give --archive PATH" in text

    log = tmp_path / "index.log"
    index = _corral_proc("--archive", str(archive), "index", "--data-dir", str(tmp_path / "idx"), "--rebuild",
                         url=url, log=log)
    try:
        asyncio.run(_until_indexed(url, last, index))
        # The CLI has no archive: what it answers about the purged head comes from the index.
        usage = corral("usage", "--json", url=url)
        assert "reading the whole log" not in usage.stderr, usage.stderr
        rows = json.loads(usage.stdout)["rows"]
        expected = independent_usage(stream)
        # (the index sums whole days in GPU-microseconds: exact to a microsecond per reservation)
        assert {r["queue"]: r["gpu_hours"] * 3600 for r in rows} == pytest.approx(expected, rel=1e-9, abs=1e-4)
        assert sum(expected.values()) > 0
        told = corral("explain", oldest, url=url)
        assert "reading the whole log" not in told.stderr, told.stderr
        assert told.stdout == story
        assert json.loads(corral("explain", oldest, "--json", url=url).stdout) == story_json
        jobs = json.loads(corral("jobs", "--all", "--json", url=url).stdout)["jobs"]
        assert {j["job_id"] for j in jobs} >= set(ids), "every job of the workload, rebuilt from archive + stream"
    finally:
        stop_all([index])

    # `corral sim --from-cluster` re-runs the whole log: with the archive, every job; without, it names the gap.
    out = tmp_path / "rerun"
    gap = corral("sim", "--from-cluster", "--out", str(out), "--no-figures", "--json", url=url, check=1)
    assert "the fold needs seq 1 next" in gap.stderr and "removed" in gap.stderr and "--archive" in gap.stderr
    assert not (out / "cluster-log.jsonl").exists()
    rerun = corral(*("--archive", str(archive)), "sim", "--from-cluster", "--out", str(out), "--no-figures",
                   "--json", url=url)
    exported = (out / "cluster-log.jsonl").read_bytes().splitlines()
    assert len(exported) == last and [json.loads(x) for x in exported] == \
        [json.loads(stream[seq][3]) for seq in range(1, last + 1)], "line N is position N, as the stream held it"
    assert json.loads(rerun.stdout)["corral"]["completed"] == len(ids), "every job of the log re-run"

    # (a) A fresh agent on the purged stream, from the node views' base (events/nodeviews.py): no archive anywhere.
    agent_log = asyncio.run(_fresh_agent_works(url, tmp_path / "fresh"))
    caught_up = [json.loads(line) for line in agent_log.splitlines() if '"caught_up"' in line]
    assert caught_up and caught_up[0]["from_view"] >= first - 1, caught_up  # the node views' `_base` (#40)

    # (c) No usable snapshot nor node view (the buckets removed) and no archive: a new agent stops, naming the range.
    asyncio.run(_drop_snapshots(url))
    (tmp_path / "orphan").mkdir()
    proc = agent_proc(url, "orphan", tmp_path / "orphan", index=5)
    rc, text = _ended(proc, tmp_path / "orphan" / "agent-orphan.log")
    assert rc != 0 and "the fold needs seq 1 next" in text and "not in the stream" in text, text


async def _drop_snapshots(url: str) -> None:
    bus = await Bus.connect(url)
    try:
        await bus.js.delete_object_store(SNAPSHOT_BUCKET)
        await bus.js.delete_key_value(NODEVIEW_BUCKET)
    finally:
        await bus.close()
