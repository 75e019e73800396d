"""#39 acceptance 3: `jobs --all`, `usage`, `explain` and `job` answer complete and correct, or exit non-zero
naming what is missing -- never a silent partial answer.

A log of a few hundred jobs (tests/cli/test_usage.py's, smaller: submitted, reserved, requeued, failed,
cancelled, completed, one still holding its GPUs) is appended to a real nats-server. What each command
must say is computed here from the log's raw JSON lines (line N is position N), by code that shares
nothing with corral's fold. The commands run through corral's parser:

* with no index running: they read the whole log;
* with an index still catching up (a real IndexService held part way, tests/index/held_index.py, in a
  process of its own): it takes no share of the requests, so they read the whole log;
* with that one and a caught-up `corral index` process: every answer comes from the caught-up one;
* with the stream's head trimmed (a scheduler snapshot at the end, the head purged) and no archive, no
  index: what needs the whole log exits non-zero naming the positions and `--archive`; `job` answers
  from the snapshot or refuses the same way;
* trimmed, with the caught-up index started again (it resumes from its file): the index answers.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from events.bus import Bus
from events.server import NatsServer
from schemas.codec import encode
from tests.archive.workload import snapshot_at_end
from tests.cli import test_usage
from tests.cli.conftest import corral
from tests.cli.test_usage import independent_gpu_hours
from tests.index.test_cli import _append, _until_indexed
from tests.integration.harness import start_corral

ROOT = Path(__file__).resolve().parents[2]
JOBS = 300
OLD = "j00000"  # requeued once, then failed: its story spans the log's head
TERMINAL = {"JobCompleted": "completed", "JobFailed": "failed", "JobCancelled": "cancelled",
            "JobRejected": "rejected"}


@dataclass
class Expected:
    """What a full fold of the untrimmed log says, from its raw JSON lines."""

    until: str  # a `--until` inside the log (the job still holding GPUs is then cut the same for every reader)
    statuses: dict[str, str] = field(default_factory=dict)  # job -> status, in submit order
    positions: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))  # job -> its events
    hours: dict[str, float] = field(default_factory=dict)  # queue -> GPU-hours up to `until`


def independent(path: Path) -> Expected:
    lines = [json.loads(line) for line in path.read_bytes().splitlines()]
    submits = [e["occurred_at"] for e in lines if e["type"] == "JobSubmitted"]
    until = submits[len(submits) // 2] + 0.5
    out = Expected(until=dt.datetime.fromtimestamp(until).isoformat())
    for seq, e in enumerate(lines, 1):
        job = e.get("job_id")
        match e["type"]:
            case "JobSubmitted":
                out.statuses[job] = "pending"
            case "GangReserved":
                out.statuses[job] = "reserved"
            case "JobRequeued":
                out.statuses[job] = "pending"
            case kind if kind in TERMINAL:
                out.statuses[job] = TERMINAL[kind]
        if job is not None:
            out.positions[job].append(seq)
    out.hours = independent_gpu_hours(path, "queue", until=until)
    return out


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NatsServer, Path, int]]:
    """(the server, the log as a file, its last position): the stream holds the log."""
    d = tmp_path_factory.mktemp("whole")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(test_usage, "JOBS", JOBS)
        events = test_usage._log()
    path = d / "cluster.jsonl"
    path.write_bytes(b"\n".join(encode(e) for e in events) + b"\n")
    server = NatsServer(d / "nats").start()
    try:
        last = asyncio.run(_append(server.url, events))
        assert last == len(events)
        yield server, path, last
    finally:
        server.stop()


def ask_all(url: str, exp: Expected) -> dict[str, subprocess.CompletedProcess[str]]:
    """The four commands, as a shell runs them (exit code any)."""
    return {
        "jobs": corral("jobs", "--all", "--json", url=url, check=None),
        "usage": corral("usage", "--until", exp.until, "--json", url=url, check=None),
        "explain": corral("explain", OLD, "--json", url=url, check=None),
        "job": corral("job", OLD, "--json", url=url, check=None),
    }


def check_answer(name: str, done: subprocess.CompletedProcess[str], exp: Expected) -> None:
    """A complete and correct answer of command `name` (exit 0)."""
    assert done.returncode == 0, (name, done.stderr)
    out = json.loads(done.stdout)
    match name:
        case "jobs":
            assert [(j["job_id"], j["status"]) for j in out["jobs"]] == list(exp.statuses.items())
        case "usage":
            assert {r["queue"]: r["gpu_hours"] for r in out["rows"]} == pytest.approx(exp.hours, rel=1e-9, abs=1e-9)
        case "explain":
            assert out["status"] == exp.statuses[OLD]
            assert sorted(e["seq"] for e in out["timeline"] if e["event"].get("job_id") == OLD) == exp.positions[OLD]
        case "job":
            assert (out["job_id"], out["status"]) == (OLD, exp.statuses[OLD])


def whole_or_refused(name: str, done: subprocess.CompletedProcess[str], exp: Expected, first: int) -> None:
    """Complete and correct, or a non-zero exit naming the positions the stream lacks and the flag to read them."""
    if done.returncode == 0:
        check_answer(name, done, exp)
        return
    assert done.stdout == "", (name, done.stdout)
    assert f"seq 1..{first - 1}" in done.stderr and "--archive" in done.stderr, (name, done.stderr)


def check_whole(answers: dict[str, subprocess.CompletedProcess[str]], exp: Expected) -> None:
    for name, done in answers.items():
        check_answer(name, done, exp)


def _index(url: str, data: Path, log: Path) -> subprocess.Popen[bytes]:
    return start_corral("--nats", url, "index", "--data-dir", str(data), "--log-level", "info", log=log)


def _held(url: str, data: Path, upto: int, log: Path) -> subprocess.Popen[bytes]:
    """A real IndexService in a process of its own, held after position `upto` (tests/index/held_index.py)."""
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "tests.index.held_index", url, str(data), str(upto)],
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)


def _wait_held(proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> dict[str, object]:
    async def wait() -> dict[str, object]:
        async with asyncio.timeout(timeout):
            while True:
                for line in log.read_text(errors="replace").splitlines():
                    if line.startswith('{"event": "held"'):
                        return json.loads(line)  # type: ignore[no-any-return]
                assert proc.poll() is None, log.read_text()[-3000:]
                await asyncio.sleep(0.1)

    return asyncio.run(wait())


def _stop(*procs: subprocess.Popen[bytes]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


async def _trim(url: str, keep_from: int) -> int:
    """A scheduler snapshot at the log's end, then the stream's head purged: it starts at `keep_from`."""
    bus = await Bus.connect(url)
    try:
        await snapshot_at_end(bus)
        await bus.js.purge_stream(bus.stream, seq=keep_from)
        return int((await bus.js.stream_info(bus.stream)).state.first_seq)
    finally:
        await bus.close()


@pytest.mark.timeout(180)
def test_history_answers_are_whole_or_name_what_is_missing(cluster: tuple[NatsServer, Path, int],
                                                           tmp_path: Path) -> None:
    server, path, last = cluster
    url = server.url
    exp = independent(path)
    assert len(exp.statuses) == JOBS + 1 and set(exp.statuses.values()) >= {"completed", "failed", "cancelled"}

    # No index: the whole log is read.
    answers = ask_all(url, exp)
    check_whole(answers, exp)
    assert "reading the whole log" in answers["jobs"].stderr

    # An index still catching up takes no share: the whole log again.
    held_log = tmp_path / "held.log"
    held = _held(url, tmp_path / "held", last // 3, held_log)
    index = None
    try:
        line = _wait_held(held, held_log)
        assert line["seq"] == last // 3 and line["serving"] is False, line
        answers = ask_all(url, exp)
        check_whole(answers, exp)
        assert "reading the whole log" in answers["jobs"].stderr

        # And beside a caught-up index: that one answers every request, and all of them whole.
        index = _index(url, tmp_path / "index", tmp_path / "index.log")
        asyncio.run(asyncio.wait_for(_until_indexed(url, last, index), 60))
        for _ in range(3):
            answers = ask_all(url, exp)
            check_whole(answers, exp)
            for name, done in answers.items():
                assert "reading the whole log" not in done.stderr and "not caught up" not in done.stderr, \
                    (name, done.stderr)
        assert held.poll() is None, "the held index is still catching up"
    finally:
        _stop(held, *([index] if index else []))

    # The stream's head trimmed, no archive, no index: no answer from part of the log.
    first = asyncio.run(_trim(url, last // 2))
    assert first == last // 2
    answers = ask_all(url, exp)
    for name, done in answers.items():
        whole_or_refused(name, done, exp, first)
    assert answers["jobs"].returncode != 0 and answers["usage"].returncode != 0 and answers["explain"].returncode != 0

    # The caught-up index again (it resumes from its file, past the trimmed head): it can, so it answers.
    index = _index(url, tmp_path / "index", tmp_path / "index-again.log")
    try:
        asyncio.run(asyncio.wait_for(_until_indexed(url, last, index), 60))
        answers = ask_all(url, exp)
        for name in ("jobs", "usage", "job"):
            check_answer(name, answers[name], exp)
            assert "reading the whole log" not in answers[name].stderr, (name, answers[name].stderr)
        # `explain` reads the story's events back by position: the index without --archive cannot read those
        # the stream dropped, and says so (README: give the index --archive).
        whole_or_refused("explain", answers["explain"], exp, first)
    finally:
        _stop(index)
