"""What-if forensics: `corral replay/explain/jobs --log FILE` read a simulated run's log file as they read NATS.

The answers are checked against the file itself: a fold of its first lines
with the normal `evolve`, and the events it holds about a preempted job.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from events.logfile import LogFile
from orchestrator.cli.sim import main as sim_main
from orchestrator.cli.timeline import Story, story_summary
from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import FREE, ClusterState
from orchestrator.sim.replay import read_log
from schemas import Event, JobSpec, JobSubmitted, JobWaiting, PreemptionRequested
from schemas.codec import encode
from tests.cli.conftest import assert_one_line_error, corral


@pytest.fixture(scope="module")
def sim_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small simulated run with preemptions (reclaimed guarantees), as `corral sim` writes it."""
    d = tmp_path_factory.mktemp("whatif")
    trace, cluster = d / "t.csv", d / "c.yaml"
    assert sim_main(["gen", "--nodes", "4", "--queues", "3", "--jobs", "120", "--seed", "5", "--out", str(trace),
                     "--cluster-out", str(cluster)]) == 0
    assert sim_main(["--trace", str(trace), "--cluster", str(cluster), "--policy", "corral", "--out", str(d),
                     "--no-figures"]) == 0
    return d / "events-corral.jsonl"


def fold_lines(path: Path, seq: int) -> ClusterState:
    state = ClusterState()
    for i, event in enumerate(read_log(path), 1):
        if i > seq:
            break
        evolve(state, event, i)
    return state


def run_json(*args: str) -> dict:  # type: ignore[type-arg]
    return json.loads(corral(*args, "--json").stdout)


def test_explain_tells_a_simulated_preemption_from_the_file(sim_log: Path) -> None:
    events = list(read_log(sim_log))
    asked = next(e for e in events if isinstance(e, PreemptionRequested))
    story = run_json("explain", "--log", str(sim_log), asked.job_id)

    assert story["job_id"] == asked.job_id and story["status"] == "completed"
    texts = [e["text"] for e in story["timeline"]]
    assert any(t.startswith(f"preemption requested by {asked.preemptor_job_id}") for t in texts), texts
    assert "preempted" in story["summary"]
    # Its waits, reason by reason, add up to the time it was pending: submit to its last reservation,
    # less the time it held GPUs in between (the simulation's waits start at submit).
    held = 0.0
    reserved_at = None
    for e in story["timeline"]:
        if e["type"] == "GangReserved":
            reserved_at = e["time"]
        elif e["type"] == "Preempted" and reserved_at is not None:
            held += e["time"] - reserved_at
    last_reserved = max(e["time"] for e in story["timeline"] if e["type"] == "GangReserved")
    waited = last_reserved - story["timeline"][0]["time"] - held
    assert abs(sum(story["pending_s"].values()) - waited) < 1e-6, (story["pending_s"], waited)
    # Positions are the file's line numbers, times the simulation's clock.
    submitted = next(i for i, e in enumerate(events, 1) if isinstance(e, JobSubmitted) and e.job_id == asked.job_id)
    first = story["timeline"][0]
    assert first["seq"] == submitted and first["time"] == events[submitted - 1].occurred_at


def test_replay_at_a_line_is_the_fold_of_the_lines_before(sim_log: Path) -> None:
    events = list(read_log(sim_log))
    at = next(i for i, e in enumerate(events, 1) if isinstance(e, PreemptionRequested))
    expected = fold_lines(sim_log, at)
    view = run_json("replay", "--log", str(sim_log), "--at", str(at))

    assert view["at"] == {"seq": at, "time": events[at - 1].occurred_at}
    owners = {n["node_id"]: [o or FREE for o in n["owners"]] for n in view["nodes"]}
    assert owners == {nid: list(o) for nid, o in expected.owners.items()}
    assert [p["job_id"] for p in view["pending"]] == list(expected.pending)
    assert view["jobs"]["preempting"] == sum(j.status == "preempting" for j in expected.jobs.values()) > 0

    # A duration is counted back from the file's last event, not from today.
    end = events[-1].occurred_at
    back = run_json("replay", "--log", str(sim_log), "--at", "1h")
    assert back["at"]["time"] <= end - 3600 < events[back["at"]["seq"]].occurred_at


def test_listings_read_the_file_to_its_end(sim_log: Path) -> None:
    final = fold_lines(sim_log, 10**9)
    listed = run_json("jobs", "--log", str(sim_log), "--all")
    assert {j["job_id"] for j in listed["jobs"]} == set(final.jobs) and len(final.jobs) == 120
    assert {j["status"] for j in listed["jobs"]} == {"completed"}
    queues = run_json("queues", "--log", str(sim_log))
    assert {q["queue"] for q in queues["queues"]} == set(final.queues)
    assert len(run_json("nodes", "--log", str(sim_log))["nodes"]) == len(final.nodes) == 4


def test_a_bad_line_is_read_past_and_a_missing_file_is_one_line(sim_log: Path, tmp_path: Path) -> None:
    lines = sim_log.read_bytes().splitlines(keepends=True)
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_bytes(b"".join([*lines[:10], b'{"type": "NoSuchEvent", "x": 1}\n', b"not json\n", *lines[10:]]))
    assert run_json("replay", "--log", str(damaged))["jobs"] == run_json("replay", "--log", str(sim_log))["jobs"]
    assert run_json("replay", "--log", str(damaged))["seq"] == len(lines) + 2

    line = assert_one_line_error(corral("explain", "--log", str(tmp_path / "nope.jsonl"), "j1", check=None), 4)
    assert line.endswith("cannot read log file " + str(tmp_path / "nope.jsonl") + ": No such file or directory")
    line = assert_one_line_error(corral("explain", "--log", str(sim_log), "j-none", check=None), 4)
    assert "unknown job 'j-none'" in line

    # A job whose submission is the unreadable line: its other steps are shown, and the exit says "not found".
    at = next(i for i, raw in enumerate(lines) if b'"JobSubmitted"' in raw)
    job = json.loads(lines[at])["job_id"]
    lost = tmp_path / "lost.jsonl"
    lost.write_bytes(b"".join([*lines[:at], b"not json\n", *lines[at + 1:]]))
    out = corral("explain", "--log", str(lost), job, check=None)
    assert out.returncode == 4
    assert out.stdout.startswith(f"{job}: its submission is not in the log")
    assert "reserved" in out.stdout


async def test_explain_still_summarises_a_job_the_fold_has_forgotten(sim_log: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The fold keeps the newest FINISHED_KEPT finished jobs; an older job's story still says how it ended."""
    import orchestrator.core.evolve_jobs as fold  # (retire, the fold of a finished job, reads it)

    monkeypatch.setattr(fold, "FINISHED_KEPT", 5)  # a long log's worth of later finished jobs
    first = next(e.job_id for e in read_log(sim_log) if isinstance(e, JobSubmitted))
    story = Story(first)
    async for batch in LogFile(sim_log).replay():
        for env in batch:
            story.add(env)
    assert first not in story.state.jobs, "the fold was meant to forget it"
    assert story.job is not None and story.job.status == "completed"
    assert story_summary(story.job, first, story.entries).startswith(f"{first} ({first}) is completed")


def test_explain_shows_a_reason_told_again_in_a_row_once(tmp_path: Path) -> None:
    """A waiting job re-told its reason with new numbers is one line per run for a human, every step with --all and --json."""
    def waiting(i: int, at: float, code: str, message: str) -> JobWaiting:
        return JobWaiting(event_id=f"w{i}", occurred_at=at, job_id="big", code=code, message=message)

    events: list[Event] = [JobSubmitted(event_id="s", occurred_at=0.0, job_id="big",
                                        spec=JobSpec(name="big", ranks=4, gpus_per_rank=8))]
    events += [waiting(i, 60.0 * (i + 1), "capacity", f"needs 32 GPUs (4x8), {9 + i} free in the cluster")
               for i in range(5)]
    events.append(waiting(5, 400.0, "quota", "queue default at its limit 8: holds 8, needs 32 more"))
    events += [waiting(6 + i, 3600.0 * (i + 1), "capacity", "needs 32 GPUs (4x8), 3 free in the cluster")
               for i in range(3)]
    log = tmp_path / "waits.jsonl"
    log.write_bytes(b"".join(encode(e) + b"\n" for e in events))

    out = corral("explain", "--log", str(log), "big").stdout.splitlines()
    # Still pending at the log's end (its last event): capacity 60-400 s and 3600-10800 s, quota 400-3600 s.
    assert out[1] == "  pending 2h59m in all: 2h05m capacity, 53m20s quota", out
    out.pop(1)
    # A pending job's claim and, for a gang of 9+ GPUs, its starvation bound (issue #29) come next.
    assert out[1].startswith("  claim: none known yet") and out[2].startswith("  starvation: not yet"), out
    del out[1:3]
    # Each step on the simulation's clock (day, time of day) and after submit as a duration.
    steps = [m.groups() for line in out if (m := re.match(r"  (d0 [\d:.]+) +(\+\w+) #(\d+) ", line))]
    assert steps == [("d0 00:00:00.000", "+0s", "1"), ("d0 00:01:00.000", "+60s", "2"),
                     ("d0 00:06:40.000", "+6m40s", "7"), ("d0 01:00:00.000", "+60m00s", "8")], out
    assert "told 5 times, the last at" in out[3] and "#6 (4m00s later)" in out[3], out
    assert out[3].endswith("newest: needs 32 GPUs (4x8), 13 free in the cluster"), out
    assert "told 3 times" in out[6] and "(2h00m later)" in out[6] and "newest" not in out[6], out  # the same words
    assert "--all prints every step" in out[-1]

    every = corral("explain", "--log", str(log), "big", "--all").stdout.splitlines()
    assert len(every) == 4 + len(events) and not any("told" in line for line in every), every  # (+ claim, starvation)
    story = run_json("explain", "--log", str(log), "big")
    assert len(story["timeline"]) == len(events)
    assert story["pending_s"] == {"capacity": 340.0 + 7200.0, "quota": 3200.0}
