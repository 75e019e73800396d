"""A simulated log is on its own clock (seconds since 0): the readers print it and take `--at` on it.

t=0 is a time there (not "missing"), days apart read as days (`d3 21:57:45.831`, `+3d21h`), and `--at`
names its moments as `+3d`, `d3 12:00` or seconds; a cluster's (Unix-time) log reads as before.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from events.logfile import LogFile
from orchestrator.cli import main
from orchestrator.cli.errors import USAGE, CliError
from orchestrator.cli.position import log_clock
from orchestrator.cli.timespec import LogClock
from orchestrator.cli.views import readable
from schemas import (
    Event,
    GangReserved,
    JobCompleted,
    JobRejected,
    JobRunning,
    JobSpec,
    JobSubmitted,
    NodeRegistered,
    RankPlacement,
    WorkerStarted,
)
from schemas.codec import encode
from schemas.inventory import Gpu, Inventory

DAY = 86400.0
#: b's end: day 3 at 21:57:45.831.
B_DONE = 3 * DAY + 21 * 3600 + 57 * 60 + 45.831


def node(at: float) -> NodeRegistered:
    gpus = tuple(Gpu(index=i, uuid=f"g{i}", model="H100", memory_mib=1) for i in range(2))
    return NodeRegistered(event_id="n", occurred_at=at, node_id="n1", incarnation="1", address="a",
                          inventory=Inventory(gpus=gpus))


def submitted(job_id: str, at: float) -> JobSubmitted:
    return JobSubmitted(event_id=f"s-{job_id}", occurred_at=at, job_id=job_id, spec=JobSpec(name=job_id))


def rejected(job_id: str, at: float) -> JobRejected:
    return JobRejected(event_id=f"r-{job_id}", occurred_at=at, job_id=job_id, reasons=("over the limit",))


def story(t0: float) -> list[Event]:
    """a rejected at t0, b running from t0 to t0 + B_DONE, c rejected 20 s in, `late` submitted at 5 days."""
    ranks = (RankPlacement(rank=0, node_id="n1", gpus=(0,)),)
    return [
        node(t0),
        submitted("a", t0), rejected("a", t0),
        submitted("b", t0),
        GangReserved(event_id="g-b", occurred_at=t0, job_id="b", attempt=1, epoch=0, ranks=ranks),
        WorkerStarted(event_id="w-b", occurred_at=t0, job_id="b", attempt=1, rank=0, node_id="n1"),
        JobRunning(event_id="run-b", occurred_at=t0, job_id="b", attempt=1),
        submitted("c", t0 + 20), rejected("c", t0 + 20),
        JobCompleted(event_id="done-b", occurred_at=t0 + B_DONE, job_id="b", attempt=1),
        submitted("late", t0 + 5 * DAY),
    ]


def write(path: Path, events: list[Event]) -> Path:
    path.write_bytes(b"".join(encode(e) + b"\n" for e in events))
    return path


@pytest.fixture
def sim(tmp_path: Path) -> Path:
    return write(tmp_path / "events-corral.jsonl", story(0.0))


def corral(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`corral ARGS` in this process: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exit_:
        main(list(args))
    out = capsys.readouterr()
    return int(exit_.value.code or 0), out.out, out.err


def corral_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:  # type: ignore[type-arg]
    code, out, err = corral(capsys, *args, "--json")
    assert code == 0, err
    return json.loads(out)  # type: ignore[no-any-return]


# --- 1. t=0 is a time --------------------------------------------------------------------


def test_a_job_at_time_zero_has_an_age_and_times(sim: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A job finished at t=0 is over since t=0 (its AGE counts from its end, not from its submission), b ran
    from t=0 (a start, not "never"); 0.0 stays in --json."""
    code, out, _ = corral(capsys, "jobs", "--log", str(sim), "--all", "--format", "job,age,elapsed,start")
    assert code == 0
    cells = {line.split()[0]: line.split()[1:] for line in out.splitlines()[1:]}
    assert cells == {"a": ["5d00h", "-", "-"], "b": ["26h02m", "3d21h", "d0", "00:00:00.000"],
                     "c": ["4d23h", "-", "-"], "late": ["0s", "-", "-"]}, out
    jobs = {j["job_id"]: j for j in corral_json(capsys, "jobs", "--log", str(sim), "--all")["jobs"]}
    assert jobs["a"]["finished_at"] == 0.0 and jobs["b"]["running_at"] == 0.0
    assert jobs["late"]["finished_at"] is None and jobs["late"]["running_at"] is None


def test_replay_at_the_first_event_has_its_time(sim: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert corral_json(capsys, "replay", "--log", str(sim), "--at", "1")["at"] == {"seq": 1, "time": 0.0}
    code, out, _ = corral(capsys, "replay", "--log", str(sim), "--at", "#1")
    assert code == 0 and out.startswith("cluster at #1 (d0 00:00:00.000)\n"), out


# --- 2. one rendering of a simulated clock ------------------------------------------------


def test_explain_prints_the_day_and_offsets_as_durations(sim: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = corral(capsys, "explain", "--log", str(sim), "b")
    lines = out.splitlines()
    assert code == 0 and lines[0] == "b (b) is completed", out
    assert lines[1].split()[:4] == ["d0", "00:00:00.000", "+0s", "#4"], out
    assert lines[-1].split()[:4] == ["d3", "21:57:45.831", "+3d21h", "#10"], out
    assert " - " not in out and "1970" not in out


def test_replay_prints_the_day_not_1970(sim: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = corral(capsys, "replay", "--log", str(sim))
    assert code == 0 and out.startswith("cluster at #11 (d5 00:00:00.000)"), out


def test_a_cluster_log_reads_as_before(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Unix times: an ISO header, time of day and seconds in explain; a re-run's settings at 0.0 do not
    make it a simulated log (its end is what tells)."""
    t0 = 1_700_000_000.0
    log = write(tmp_path / "cluster.jsonl", [rejected("x", 0.0), *story(t0)])  # an event at 0.0 first
    clock = LogClock(t0, simulated=False)
    _, out, _ = corral(capsys, "replay", "--log", str(log))
    assert out.startswith(f"cluster at #12 ({clock.instant(t0 + 5 * DAY)})") and "T" in out.split()[3], out
    _, out, _ = corral(capsys, "explain", "--log", str(log), "b")
    first = out.splitlines()[1]
    assert re.match(rf"  {clock.instant(t0)[11:]} +\+ +0\.000s #5 ", first), out
    assert corral_json(capsys, "replay", "--log", str(log), "--at", "+1d")["seq"] == 10  # c rejected


async def test_the_log_clock_is_told_by_the_log(sim: Path, tmp_path: Path) -> None:
    assert await log_clock(LogFile(sim)) == LogClock(0.0, simulated=True)
    real = write(tmp_path / "real.jsonl", [rejected("x", 0.0), *story(1.7e9)])
    assert await log_clock(LogFile(real)) == LogClock(1.7e9, simulated=False)
    empty = write(tmp_path / "empty.jsonl", [])
    assert (await log_clock(LogFile(empty))).start is None


def test_clock_text_reads_back() -> None:
    sim = LogClock(0.0, simulated=True)
    assert sim.instant(B_DONE) == "d3 21:57:45.831" == sim.time_of_day(B_DONE)
    assert sim.instant(1.001) == "d0 00:00:01.001" and sim.instant(DAY - 1e-4) == "d0 23:59:59.999"
    assert sim.offset(501207.831) == "+5d19h" and sim.offset(59) == "+59s"
    assert sim.parse(sim.instant(B_DONE), now=0) == pytest.approx(B_DONE)
    real = LogClock(1.7e9)
    assert real.parse(real.instant(1.7e9 + 0.5), now=0) == pytest.approx(1.7e9 + 0.5)
    assert real.offset(12.3456) == "+  12.346s"


def test_a_reservations_expected_start_prints_on_the_logs_clock() -> None:
    told = "first in line for 64 GPUs: holding 0 free, expected to start at t=338265.831"
    assert LogClock(0.0, simulated=True).moments(told).endswith("expected to start at d3 21:57:45.831")
    assert LogClock(1.7e9).moments("at t=1700000000").startswith("at 20")  # an ISO date
    assert LogClock(0.0, simulated=True).moments("needs 64 GPUs (8x8), 10 free") == "needs 64 GPUs (8x8), 10 free"
    # corral jobs / job / top print it on the clock their "now" is on.
    assert readable(told, now=4 * DAY).endswith("at d3 21:57:45.831")
    assert "t=" not in readable("expected to start at t=1700000000", now=1.7e9)


# --- 3. --at on a simulated clock ---------------------------------------------------------


@pytest.mark.parametrize("when", ["+3d", "+72h", "+259200", "d3", "d3 00:00", "d3T00:00:00", "2d"])
def test_at_names_a_simulated_moment(sim: Path, capsys: pytest.CaptureFixture[str], when: str) -> None:
    """Day 3 at midnight: after c's rejection (#9), before b's end (#10). `2d` is two days before the end."""
    view = corral_json(capsys, "replay", "--log", str(sim), "--at", when)
    assert view["seq"] == 9 and view["at"]["time"] == 20.0, view


def test_at_takes_the_moment_explain_printed(sim: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert corral_json(capsys, "replay", "--log", str(sim), "--at", "d3 21:57:45.831")["seq"] == 10
    assert corral_json(capsys, "replay", "--log", str(sim), "--at", "+0")["seq"] == 7  # everything at t=0


def test_jobs_and_explain_take_at(sim: Path, capsys: pytest.CaptureFixture[str]) -> None:
    jobs = {j["job_id"]: j for j in corral_json(capsys, "jobs", "--log", str(sim), "--at", "+1d", "--all")["jobs"]}
    assert set(jobs) == {"a", "b", "c"} and jobs["b"]["status"] == "running"
    _, out, _ = corral(capsys, "jobs", "--log", str(sim), "--at", "+1d", "--state", "running")
    assert out.splitlines()[1].split()[8] == "24h00m", out  # its age then, not at the log's end
    story = corral_json(capsys, "explain", "--log", str(sim), "b", "--at", "+1d")
    assert story["status"] == "running" and story["timeline"][-1]["type"] == "JobRunning"
    code, _, err = corral(capsys, "explain", "--log", str(sim), "late", "--at", "+1d")
    assert code == 4 and "no event up to #9" in err


@pytest.mark.parametrize(("when", "says"), [
    ("6d", "before the log's first event, at d0 00:00:00.000"),
    ("0", "before the log's first event"),
    ("2025-01-31T14:05:00", "bad time '2025-01-31T14:05:00' for a simulated log"),
    ("+soon", "bad time '+soon'"),
    ("#99", "in the future"),
])
def test_at_outside_the_log_is_an_error(sim: Path, capsys: pytest.CaptureFixture[str], when: str,
                                        says: str) -> None:
    """Before the first event used to fold nothing and show an empty cluster as if it had been."""
    code, out, err = corral(capsys, "replay", "--log", str(sim), "--at", when)
    assert code == USAGE and out == "" and says in err and len(err.splitlines()) == 1, err


def test_a_simulated_day_is_not_a_cluster_time() -> None:
    with pytest.raises(CliError, match="is for a simulated log"):
        LogClock(1.7e9).parse("d3 12:00", now=1.8e9)
