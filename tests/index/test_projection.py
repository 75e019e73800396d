"""The index's projection (orchestrator/index/projection.py) folded from a log file, without NATS.

* usage from the index equals `corral usage`'s pass over the log (orchestrator/core/accounting.GpuTime) for
  every grouping and window, on a simulated workload with preemptions, node failures and requeues; and each
  job's GPU-seconds equal an independent sum over the raw JSON lines (code that shares nothing with corral);
* a fold killed at any point and resumed from its stored position gives the same tables as one fold
  straight through (in-process crashes at many points, and one real SIGKILL of a folding process);
* unreadable, malformed and huge events never stop it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from events.bus import Envelope, LogGap
from events.logfile import LogFile
from orchestrator.cli.usage import gpu_time
from orchestrator.core.accounting import GpuTime
from orchestrator.index import queries
from orchestrator.index.projection import DAY_S, IndexFormatError, Projection, connect, record_decoder
from schemas import JobCancelled, JobCompleted, JobSpec, JobSubmitted, Unknown
from schemas.codec import decode, encode

ROOT = Path(__file__).resolve().parents[2]

#: The tables that hold answers (fold_state is a cache of the fold: its position may differ after a resume).
TABLES = ("position", "jobs", "reservations", "job_events", "job_nodes", "context_events", "usage_days",
          "reservation_days", "finished_days")


def envelopes(path: Path) -> list[Envelope]:
    return list(LogFile(path).envelopes())


def fold(path: Path, db: Path, **kw: int) -> Projection:
    p = Projection(db, **kw)
    p.apply_batch(envelopes(path), contiguous=False)
    p.close()
    return p


def dump(db: Path) -> dict[str, list[tuple[object, ...]]]:
    conn = connect(db, readonly=True)
    try:
        return {t: sorted(conn.execute(f"SELECT * FROM {t}").fetchall(), key=repr) for t in TABLES}
    finally:
        conn.close()


@pytest.fixture(scope="module")
def folded(sim_log: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("index") / "index.sqlite"
    fold(sim_log, db)
    return db


def log_scan(path: Path, by: str, since: float | None, until: float | None) -> GpuTime:
    async def scan() -> GpuTime:
        source = LogFile(path)
        meter = GpuTime(by=by, since=since, until=until)  # type: ignore[arg-type]
        state, _ = await gpu_time(source, meter)
        end = await source.last_time()
        meter.held_until(state, end if until is None else min(end, until))
        return meter

    return asyncio.run(scan())


@pytest.mark.parametrize("by", ["queue", "user", "state"])
@pytest.mark.parametrize("window", [(None, None), (0.2, 0.55), (0.5, None), (None, 0.3)])
def test_usage_from_the_index_equals_the_log_scan(sim_log: Path, folded: Path, by: str,
                                                  window: tuple[float | None, float | None]) -> None:
    end = envelopes(sim_log)[-1].stream_time
    since, until = (None if w is None else w * end for w in window)
    expected = log_scan(sim_log, by, since, until).accounts
    conn = connect(folded, readonly=True)
    got = queries.usage(conn, by, since, until, end if until is None else min(end, until))
    conn.close()
    assert expected, "the window holds GPU time"
    assert set(got) == set(expected)
    for key, acct in expected.items():
        assert got[key].gpu_seconds == pytest.approx(acct.gpu_seconds, rel=1e-9), key
        assert got[key].reservations == acct.reservations, key
        assert got[key].finished == acct.finished, key


@pytest.mark.parametrize("days", [(2, 5), (3, 3), (4, None), (None, 6), (1.5, 2)])
def test_usage_over_whole_days_and_their_edges_equals_the_log_scan(sim_log: Path, folded: Path,
                                                                   days: tuple[float | None, float | None]) -> None:
    """Windows on and just off day bounds: the rollups (projection.usage_days) give whole days, the edge days
    are clipped one by one; nothing is counted twice or lost at a bound (the workload spans about 11 days)."""
    end = envelopes(sim_log)[-1].stream_time
    assert end > 7 * DAY_S, "the workload spans several days"
    since, until = (None if d is None else d * DAY_S for d in days)
    for by in ("queue", "state"):
        expected = log_scan(sim_log, by, since, until).accounts
        conn = connect(folded, readonly=True)
        got = queries.usage(conn, by, since, until, end if until is None else min(end, until))
        conn.close()
        assert set(got) == set(expected)
        for key, acct in expected.items():
            assert got[key].gpu_seconds == pytest.approx(acct.gpu_seconds, rel=1e-9), key
            assert got[key].reservations == acct.reservations, key
            assert got[key].finished == acct.finished, key


def independent_job_seconds(path: Path) -> dict[str, float]:
    """GPU-seconds per job from the raw lines: each GangReserved holds its GPUs until the job's next release."""
    held: dict[str, tuple[float, int]] = {}
    out: dict[str, float] = defaultdict(float)
    for line in path.read_bytes().splitlines():
        e = json.loads(line)
        job = e.get("job_id")
        if e["type"] == "GangReserved":
            held[job] = (e["occurred_at"], sum(len(r["gpus"]) for r in e["ranks"]))
        elif e["type"] in ("JobCompleted", "JobFailed", "JobCancelled", "JobRequeued", "Preempted") and job in held:
            start, gpus = held.pop(job)
            out[job] += gpus * (e["occurred_at"] - start)
    assert not held, "every job of the workload finished"
    return dict(out)


def test_each_jobs_row_matches_an_independent_reading_of_the_log(sim_log: Path, folded: Path) -> None:
    expected = independent_job_seconds(sim_log)
    preempted: dict[str, int] = defaultdict(int)
    for line in sim_log.read_bytes().splitlines():
        e = json.loads(line)
        if e["type"] == "Preempted":
            preempted[e["job_id"]] += 1
    conn = connect(folded, readonly=True)
    rows = {r[0]: r for r in conn.execute("SELECT job_id, gpu_seconds, preemptions, state, record FROM jobs")}
    conn.close()
    assert set(rows) == set(expected)
    assert sum(preempted.values()) >= 1
    for job_id, (_, seconds, preemptions, state, record) in rows.items():
        assert seconds == pytest.approx(expected[job_id], rel=1e-9), job_id
        assert preemptions == preempted.get(job_id, 0), job_id
        assert state == "completed" == record_decoder.decode(record).status


def test_story_positions_hold_every_event_about_the_job(sim_log: Path, folded: Path) -> None:
    by_job: dict[str, list[int]] = defaultdict(list)
    for env in envelopes(sim_log):
        for key in ("job_id", "preemptor_job_id"):
            job = getattr(env.event, key, None)
            if job and env.seq not in by_job[job]:
                by_job[job].append(env.seq)
    conn = connect(folded, readonly=True)
    for job_id, seqs in by_job.items():
        positions = queries.story_positions(conn, job_id)
        assert [p.seq for p in positions if p.own] == seqs
        assert [p.seq for p in positions] == sorted({p.seq for p in positions})
    conn.close()


@pytest.mark.parametrize("stops", [(1,), (137, 1500), (999, 1000, 1001, 2500), (3000,)])
def test_a_fold_stopped_anywhere_and_resumed_equals_one_fold(sim_log: Path, folded: Path, tmp_path: Path,
                                                             stops: tuple[int, ...]) -> None:
    """A crash loses what was not committed; the resumed fold refolds from its snapshot, records from its
    stored position, and ends with the same tables."""
    envs = envelopes(sim_log)
    db = tmp_path / "index.sqlite"
    for stop in stops:
        p = Projection(db, commit_every=97, snapshot_every=701)
        assert p.seq <= stop
        p.apply_batch([e for e in envs if e.seq <= stop])
        # A crash: whatever was not committed is lost; the file holds the last commit and its position.
        p.conn.close()
    p = Projection(db, commit_every=97, snapshot_every=701)
    assert p.state.seq <= p.seq
    p.apply_batch([e for e in envs if e.seq > p.state.seq])
    p.close()
    assert dump(db) == dump(folded)


_KILLED_FOLD = """
import sys, time
from events.logfile import LogFile
from orchestrator.index.projection import Projection
p = Projection(sys.argv[2], commit_every=50, snapshot_every=400)
for env in LogFile(sys.argv[1]).envelopes():
    p.apply_batch([env])
    time.sleep(0.0005)
p.close()
"""


def test_a_fold_killed_with_sigkill_resumes_to_the_same_tables(sim_log: Path, folded: Path, tmp_path: Path) -> None:
    db = tmp_path / "index.sqlite"
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_FOLD, str(sim_log), str(db)], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        while proc.poll() is None:  # until it has committed a part of the log, but not all of it
            if db.exists():
                try:
                    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
                    seq = conn.execute("SELECT seq FROM position").fetchone()
                    conn.close()
                except sqlite3.Error:
                    seq = None
                if seq is not None and seq[0] > 500:
                    break
            time.sleep(0.02)
        assert proc.poll() is None, "the fold ended before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    p = Projection(db)
    assert 500 < p.seq < envelopes(sim_log)[-1].seq
    p.apply_batch([e for e in envelopes(sim_log) if e.seq > p.state.seq])
    p.close()
    assert dump(db) == dump(folded)


def test_a_gap_in_the_stream_stops_the_fold_naming_the_position(sim_log: Path, tmp_path: Path) -> None:
    envs = envelopes(sim_log)[:50]
    p = Projection(tmp_path / "index.sqlite")
    with pytest.raises(LogGap) as gap:
        p.apply_batch([*envs[:20], *envs[21:]])
    assert gap.value.expected == 21
    assert p.seq == 20  # what came before the gap is folded; nothing after it
    p.close()


def _spec(name: str = "j") -> JobSpec:
    return JobSpec(name=name, queue="q", ranks=1, gpus_per_rank=1)


def test_poison_events_never_stop_the_fold(tmp_path: Path) -> None:
    """Unreadable bytes, unknown types, malformed payloads, a huge event, events about unknown jobs: each is
    counted or folded as no change, and the fold goes on to the events after them."""
    submitted = JobSubmitted(event_id="s1", occurred_at=1.0, job_id="ok", spec=_spec(), submitted_by="u")
    huge = JobSubmitted(event_id="s2", occurred_at=2.0, job_id="big", spec=_spec("x" * 2_000_000))
    raw = [
        b"\xff\xfe not json",
        b'{"type": "FromTheFuture", "event_id": "f", "occurred_at": 1.0, "job_id": "ok"}',
        b'{"type": "JobCompleted", "event_id": "c", "occurred_at": "yesterday", "job_id": "ok"}',
        b'{"type": "JobSubmitted"}',
        b"[1, 2, 3]",
        b"",
        encode(huge),
        encode(JobCompleted(event_id="c0", occurred_at=3.0, job_id="never-submitted", attempt=1)),
        encode(submitted),
        encode(JobCancelled(event_id="c1", occurred_at=4.0, job_id="ok", reason="enough")),
    ]
    subjects = ["corral.job.ok.Mystery", "corral.job.ok.FromTheFuture", "corral.job.ok.JobCompleted",
                "corral.junk", "corral.job", "corral.job.ok.Empty", "corral.job.big.JobSubmitted",
                "corral.job.never-submitted.JobCompleted", "corral.job.ok.JobSubmitted",
                "corral.job.ok.JobCancelled"]
    envs = [Envelope(i + 1, subj, float(i), decode(data)) for i, (data, subj) in enumerate(zip(raw, subjects,
                                                                                               strict=True))]
    db = tmp_path / "index.sqlite"
    p = Projection(db, commit_every=3)
    p.apply_batch(envs)
    p.close()
    assert p.seq == len(envs)
    conn = connect(db, readonly=True)
    unreadable = [e.seq for e in envs if isinstance(e.event, Unknown)]
    assert len(unreadable) >= 5 and queries.as_of(conn).unreadable == len(unreadable)
    ok = queries.job(conn, "ok")
    assert ok is not None and ok.state == "cancelled" and ok.user == "u" and ok.end_reason == "enough"
    big = queries.job(conn, "big")  # only submitted, and 2 MB large
    assert big is not None and big.state == "pending" and len(record_decoder.decode(big.record).spec.name) == 2_000_000
    # The unreadable messages published on the job's subjects are part of its story, as explain tells it.
    kinds = [p.type for p in queries.story_positions(conn, "ok") if p.own]
    assert kinds.count("Unknown") == 4 and kinds[-2:] == ["JobSubmitted", "JobCancelled"]
    conn.close()


def test_an_index_of_another_format_or_no_index_is_refused_by_name(tmp_path: Path) -> None:
    db = tmp_path / "index.sqlite"
    Projection(db).close()
    conn = sqlite3.connect(db)
    conn.execute("UPDATE position SET format = 99")
    conn.commit()
    conn.close()
    with pytest.raises(IndexFormatError, match=r"format 99.*--rebuild"):
        Projection(db)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(IndexFormatError, match="not a corral index"):
        Projection(junk)
