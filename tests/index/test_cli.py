"""`usage`, `jobs --all`, `job OLD` and `explain OLD` answered by a running `corral index` process (#28 point 3).

A log of FINISHED_KEPT + 1,600 jobs (the fold forgets the oldest) is appended to a real nats-server, a
real `corral index` process folds it, and the commands run through corral's parser. Their answers must
equal what reading the whole log gives (`--no-index`) and an independent reading of the raw events; with
no index service running, the commands say so in one line and read the log.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from events.bus import Bus
from events.server import NatsServer
from orchestrator.cli import main
from orchestrator.cli.errors import NOT_FOUND
from orchestrator.index import api
from orchestrator.index.client import NoIndex, ask
from schemas import Event
from schemas.codec import encode
from tests.cli.test_usage import JOBS, T0, USERS, _log, independent_gpu_hours

ROOT = Path(__file__).resolve().parents[2]

#: Inside the log, before its last job started: the window cuts reservations, and ends the same for every reader.
UNTIL = dt.datetime.fromtimestamp(T0 + 300 * 86400).isoformat()


async def _append(url: str, events: list[Event]) -> int:
    bus = await Bus.connect(url)
    try:
        for i in range(0, len(events), 5000):
            await bus.append_many(events[i:i + 5000])
        return await bus.last_seq()
    finally:
        await bus.close()


async def _until_indexed(url: str, last: int, proc: subprocess.Popen[bytes]) -> None:
    bus = await Bus.connect(url)
    try:
        while proc.poll() is None:
            try:
                reply = await ask(bus.nc, api.USAGE, api.UsageRequest(), api.UsageReply, timeout=2)
                if reply.as_of_seq >= last:
                    return
            except NoIndex:
                pass
            await asyncio.sleep(0.1)
        raise AssertionError(f"corral index exited with {proc.returncode}")
    finally:
        await bus.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(NATS URL, the same log as a file): the stream holds the log, a `corral index` process has folded it."""
    d = tmp_path_factory.mktemp("indexcli")
    events = _log()
    path = d / "cluster.jsonl"
    path.write_bytes(b"\n".join(encode(e) for e in events) + b"\n")
    server = NatsServer(d / "nats").start()
    proc = None
    try:
        last = asyncio.run(_append(server.url, events))
        with (d / "index.log").open("wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "index", "--data-dir", str(d / "index")],
                                    cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                    env={**os.environ, "CORRAL_NATS_URL": server.url, "PYTHONPATH": str(ROOT)})
        try:
            asyncio.run(asyncio.wait_for(_until_indexed(server.url, last, proc), 120))
        except (AssertionError, TimeoutError):
            print((d / "index.log").read_text()[-3000:])
            raise
        yield server.url, path
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0  # a signal is a clean stop
        server.stop()


def corral(capsys: pytest.CaptureFixture[str], *args: str, code: int = 0) -> tuple[str, str]:
    with pytest.raises(SystemExit) as exit_:
        main(list(args))
    out = capsys.readouterr()
    assert exit_.value.code == code, out.err
    return out.out, out.err


@pytest.fixture
def url(cluster: tuple[str, Path], monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("CORRAL_NATS_URL", cluster[0])
    monkeypatch.setenv("CORRAL_LOG_LEVEL", "warning")
    return cluster[0]


@pytest.mark.parametrize("by", ["queue", "user", "state"])
def test_usage_from_the_index_equals_reading_the_whole_log(url: str, cluster: tuple[str, Path], by: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    out, err = corral(capsys, "usage", "--by", by, "--until", UNTIL, "--json")
    assert err == ""  # the index answered: no word about reading the log
    from_index = json.loads(out)
    out, _ = corral(capsys, "usage", "--by", by, "--until", UNTIL, "--json", "--no-index")
    from_log = json.loads(out)
    assert {k: v for k, v in from_index.items() if k != "rows"} == {k: v for k, v in from_log.items() if k != "rows"}
    assert [r[by] for r in from_index["rows"]] == [r[by] for r in from_log["rows"]]
    for a, b in zip(map(dict, from_index["rows"]), map(dict, from_log["rows"]), strict=True):
        assert (a.pop("finished"), a.pop(by)) == (b.pop("finished"), b.pop(by))
        assert a == pytest.approx(b, rel=1e-9)
    if by != "state":
        until = dt.datetime.fromisoformat(UNTIL).timestamp()
        expected = independent_gpu_hours(cluster[1], by, until=until)
        assert {r[by]: r["gpu_hours"] for r in from_index["rows"]} == pytest.approx(expected, rel=1e-9)
    out, _ = corral(capsys, "usage", "--by", by)
    assert "index as of #" in out.splitlines()[0]


def _submitted(path: Path) -> list[dict[str, object]]:
    return [e for e in map(json.loads, path.read_bytes().splitlines()) if e["type"] == "JobSubmitted"]


def test_jobs_all_by_user_since_lists_jobs_the_fold_forgot(url: str, cluster: tuple[str, Path],
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    submitted = _submitted(cluster[1])
    since = float(submitted[100]["occurred_at"])  # type: ignore[arg-type]
    when = dt.datetime.fromtimestamp(since).isoformat()
    expected = [e["job_id"] for e in submitted if e["submitted_by"] == USERS[1] and e["occurred_at"] >= since]
    out, err = corral(capsys, "jobs", "--all", "--by-user", USERS[1], "--since", when, "--json")
    assert err == ""
    listed = json.loads(out)["jobs"]
    assert [j["job_id"] for j in listed] == expected
    assert {j["submitted_by"] for j in listed} == {USERS[1]} and len(expected) > JOBS // 5
    out, _ = corral(capsys, "jobs", "--all", "--by-user", USERS[1], "--since", when, "--json", "--no-index")
    from_fold = [j["job_id"] for j in json.loads(out)["jobs"]]
    # Without the index the CLI folds the whole log (#39): every job of the window, not only the newest
    # FINISHED_KEPT finished ones a snapshot's fold keeps, each shown as the index shows it.
    assert from_fold == expected
    kept = {j["job_id"]: j for j in json.loads(out)["jobs"]}
    assert listed == list(kept.values())
    table, _ = corral(capsys, "jobs", "--all", "--by-user", USERS[1], "--since", when)
    assert table.splitlines()[0].split()[:3] == ["JOB", "NAME", "USER"] and expected[0] in table


def test_job_old_is_answered_by_the_index(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    out, err = corral(capsys, "job", "j00004", "--json")
    detail = json.loads(out)
    assert err == "" and detail["job_id"] == "j00004" and detail["status"] == "completed"
    assert detail["placement"] and detail["queue"] == "prod" and detail["gpus"] == 1
    out, _ = corral(capsys, "job", "j00004", "--json", "--no-index")  # the whole log: the fold forgot it (#39)
    assert json.loads(out)["status"] == "completed" and json.loads(out)["job_id"] == "j00004"
    _, err = corral(capsys, "job", "j99999", "--no-index", code=NOT_FOUND)
    assert "unknown job 'j99999'" in err
    lines, _ = corral(capsys, "job", "j00004")
    assert "j00004" in lines and "completed" in lines


def test_explain_old_tells_the_same_story_from_the_index(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    for job in ("j00010", "j00009", "j00017", "last"):  # requeued; failed; cancelled; still running
        out, err = corral(capsys, "explain", job, "--json")
        assert err == ""
        from_index = json.loads(out)
        out, _ = corral(capsys, "explain", job, "--json", "--no-index")
        assert from_index == json.loads(out)
    human, _ = corral(capsys, "explain", "j00010")
    assert "requeued as attempt 2" in human


def test_without_an_index_the_commands_say_so_and_read_the_log(nats_server: NatsServer, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    asyncio.run(_append(nats_server.url, _log()[:400]))
    monkeypatch.setenv("CORRAL_NATS_URL", nats_server.url)
    monkeypatch.setenv("CORRAL_LOG_LEVEL", "warning")
    out, err = corral(capsys, "usage", "--until", UNTIL, "--json")
    assert err.count("\n") == 1 and "no index service answers corral-index.usage" in err
    assert json.loads(out) == json.loads(corral(capsys, "usage", "--until", UNTIL, "--json", "--no-index")[0])
    out, err = corral(capsys, "explain", "j00003", "--json")
    assert "reading the whole log instead" in err and json.loads(out)["status"] == "completed"
    out, err = corral(capsys, "jobs", "--all", "--json")
    assert "no index service answers corral-index.jobs" in err and len(json.loads(out)["jobs"]) > 50


def test_jobs_all_has_sacct_columns_from_the_index(url: str, cluster: tuple[str, Path],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """#31: `--all --state failed` (no longer refused), start/end/elapsed/exit/reason per job, `--format`
    choosing the columns and the `--json` fields; checked against the raw events, read independently."""
    import time

    raw = [json.loads(line) for line in cluster[1].read_bytes().splitlines()]
    placed = {e["job_id"]: e["occurred_at"] for e in raw if e["type"] == "GangReserved"}  # (the last one wins)
    failed = {e["job_id"]: e["occurred_at"] for e in raw if e["type"] == "JobFailed"}
    order = [e["job_id"] for e in raw if e["type"] == "JobSubmitted" and e["job_id"] in failed]
    out, err = corral(capsys, "jobs", "--all", "--state", "failed", "--json")
    assert err == ""
    listed = json.loads(out)["jobs"]
    assert [j["job_id"] for j in listed] == order and len(order) > 1000
    for j in listed:
        start, end = placed[j["job_id"]], failed[j["job_id"]]
        assert (j["status"], j["started_at"], j["ended_at"], j["end_reason"]) == ("failed", start, end, "x")
        assert j["elapsed_s"] == pytest.approx(end - start) and j["exit_code"] is None  # (no worker reported)
    out, _ = corral(capsys, "jobs", "--all", "--state", "failed", "--json", "--no-index")
    kept = json.loads(out)["jobs"]
    assert kept and kept == listed[-len(kept):]
    before = time.time()
    out, _ = corral(capsys, "jobs", "--all", "--state", "failed", "--format", "job,age", "--json")
    after = time.time()
    for j in json.loads(out)["jobs"]:  # over since its end, not its submit-to-finish time
        assert before - failed[j["job_id"]] <= j["age_s"] <= after - failed[j["job_id"]]
    out, _ = corral(capsys, "jobs", "-a", "-s", "failed", "--format", "JobID,State,Elapsed,ExitCode,reason", "--json")
    assert list(json.loads(out)["jobs"][0]) == ["job_id", "status", "elapsed_s", "exit_code", "end_reason"]
    table, _ = corral(capsys, "jobs", "--all", "--state", "failed", "--format", "job,start,end,elapsed,exitcode")
    header, first, *_ = table.splitlines()
    assert header.split() == ["JOB", "START", "END", "ELAPSED", "EXIT"]
    job_id, start, end, *_ = first.split()
    assert (job_id, start, end) == (order[0], dt.datetime.fromtimestamp(placed[order[0]]).strftime("%Y-%m-%dT%H:%M:%S"),
                                    dt.datetime.fromtimestamp(failed[order[0]]).strftime("%Y-%m-%dT%H:%M:%S"))
    history = corral(capsys, "jobs", "--all")[0].splitlines()[0].split()
    assert history[:13] == ["JOB", "NAME", "USER", "QUEUE", "STATE", "ATTEMPT", "GPUS", "SUBMIT", "START", "END",
                            "ELAPSED", "EXIT", "WHERE"]
    _, err = corral(capsys, "jobs", "--all", "--format", "job,nosuch", code=2)
    assert "unknown column 'nosuch' in --format; known: job, name" in err
