"""`corral job` and `corral explain` show the run time corral expects of a job and where it comes from.

The estimate is the one the scheduler tells (core/model/estimates.py `told_estimate`, #41): the median of
at least 2 completed runs of the job's own name (same user and queue), else of at least 3 of its user's
jobs of its size in its queue; else not known. Read in-process through the parser from a folded log
file: three completed runs of alice's `train` (500, 600, 700 s) and one of bob's `eval` (300 s) in queue
q, then a running and a pending `train`, a pending job of a new name (alice's 1-GPU jobs' estimate), one
in a queue without history (not known), and a reservation holder waiting for the running `train`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.cli.timespec import LogClock
from schemas import (
    Event,
    GangReserved,
    JobCompleted,
    JobRunning,
    JobSpec,
    JobSubmitted,
    JobWaiting,
    NodeRegistered,
    QueueDefined,
    RankPlacement,
    SchedulerElected,
    WorkerStarted,
)
from schemas.codec import encode
from schemas.inventory import Gpu, Inventory

T0 = 1_700_000_000.0
#: When the jobs under test were submitted; the log ends 120 s later.
NOW = T0 + 10_000


def _submit(job_id: str, name: str, user: str, at: float, queue: str = "q") -> JobSubmitted:
    return JobSubmitted(event_id=f"s-{job_id}", occurred_at=at, job_id=job_id, submitted_by=user,
                        spec=JobSpec(name=name, queue=queue))


def _start(job_id: str, at: float, gpu: int = 0) -> list[Event]:
    ranks = (RankPlacement(rank=0, node_id="n1", gpus=(gpu,)),)
    return [GangReserved(event_id=f"g-{job_id}", occurred_at=at, job_id=job_id, attempt=1, epoch=1, ranks=ranks),
            WorkerStarted(event_id=f"w-{job_id}", occurred_at=at, job_id=job_id, attempt=1, rank=0, node_id="n1"),
            JobRunning(event_id=f"r-{job_id}", occurred_at=at, job_id=job_id, attempt=1)]


def _history() -> list[Event]:
    gpus = tuple(Gpu(index=i, uuid=f"g{i}", model="H100", memory_mib=1) for i in range(8))
    out: list[Event] = [
        NodeRegistered(event_id="n", occurred_at=T0, node_id="n1", incarnation="1", address="a",
                       inventory=Inventory(gpus=gpus)),
        QueueDefined(event_id="q", occurred_at=T0, queue="q"),
        QueueDefined(event_id="r", occurred_at=T0, queue="r"),
        SchedulerElected(event_id="e", occurred_at=T0, epoch=1, scheduler_id="s"),
        # A 16-GPU gang this one-node cluster cannot start (it is never rejected here: no decide runs); its
        # relative starvation bound (its 4 h limit) is still ahead at NOW.
        JobSubmitted(event_id="s-gang", occurred_at=T0 + 5, job_id="gang", submitted_by="carol",
                     spec=JobSpec(name="big", queue="q", ranks=2, gpus_per_rank=8, time_limit_s=14_400)),
    ]
    at = T0 + 10
    for job_id, name, user, seconds in [("d1", "train", "alice", 500), ("d2", "train", "alice", 600),
                                        ("d3", "train", "alice", 700), ("d4", "eval", "bob", 300)]:
        out += [_submit(job_id, name, user, at), *_start(job_id, at),
                JobCompleted(event_id=f"c-{job_id}", occurred_at=at + seconds, job_id=job_id, attempt=1)]
        at += seconds + 10
    out += [
        _submit("running", "train", "alice", NOW), *_start("running", NOW),
        _submit("waiting", "train", "alice", NOW),
        _submit("new-name", "sweep", "alice", NOW),
        _submit("lonely", "train", "alice", NOW, queue="r"),
        # #31: no run of its own, running longer than its queue's median (550 s).
        _submit("outran", "sweep", "alice", NOW - 1000), *_start("outran", NOW - 1000, gpu=1),
        JobWaiting(event_id="w", occurred_at=NOW + 120, job_id="waiting", code="capacity",
                   message="needs 1 GPU, 0 free", epoch=1),
        # #41: a reservation waiting for `running` (no time limit): its start is told from that job's estimate.
        _submit("holder", "eval", "bob", NOW + 60),
        JobWaiting(event_id="wh", occurred_at=NOW + 120, job_id="holder", code="backfill_head",
                   message="first in line for 1 GPUs: holding 0 free", epoch=1, behind=("running",)),
    ]
    return out


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(encode(e) + b"\n" for e in _history()))
    return path


def corral(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """`corral ARGS` in this process; its stdout (exit 0 asserted)."""
    with pytest.raises(SystemExit) as exit_:
        main(list(args))
    out = capsys.readouterr()
    assert int(exit_.value.code or 0) == 0, out.err
    return out.out


def _fields(text: str) -> dict[str, str]:
    """`corral job`'s aligned `key  value` lines as a dict (the rank lines after `ranks:` left out)."""
    head = text.split("\nranks:", 1)[0]
    return {k: v.strip() for k, _, v in (line.partition("  ") for line in head.splitlines())}


def test_job_shows_the_estimate_its_source_and_a_running_jobs_end(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    running = _fields(corral(capsys, "job", "--log", str(log), "running"))
    assert running["estimate"] == "~600 s, median of 3 runs of name 'train' of alice in queue q"
    # Started at NOW, expected to hold its GPUs 600 s; the log's end (the command's now) is NOW + 120.
    assert running["ends"] == f"{LogClock().instant(NOW + 600)} (in 8m00s, by the estimate)"

    waiting = _fields(corral(capsys, "job", "--log", str(log), "waiting"))
    assert waiting["estimate"] == "~600 s, median of 3 runs of name 'train' of alice in queue q"
    assert "ends" not in waiting  # not placed: no end to expect yet

    by_size = _fields(corral(capsys, "job", "--log", str(log), "new-name"))
    assert by_size["estimate"] == "~600 s, median of 3 runs of 1-GPU jobs of alice in queue q"
    assert _fields(corral(capsys, "job", "--log", str(log), "lonely"))["estimate"] == (
        "not known: fewer than 2 completed runs of 'train' by alice in its queue, and fewer than 3 of its user's "
        "1-GPU jobs there")
    # bob ran `eval` once: one run is no estimate (nor are alice's runs one for bob).
    assert _fields(corral(capsys, "job", "--log", str(log), "holder"))["estimate"].startswith("not known")
    # Running 1,120 s, its estimate 600 s: its end is not known (never "now", never a moment already past).
    outran = _fields(corral(capsys, "job", "--log", str(log), "outran"))
    assert outran["ends"] == "not known: it has run longer than its estimate, which is no guide to it"
    assert "estimate" not in _fields(corral(capsys, "job", "--log", str(log), "d1"))  # finished


def test_job_json_has_the_estimate(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    running = json.loads(corral(capsys, "job", "--log", str(log), "running", "--json"))["estimate"]
    assert running == {"seconds": 600.0, "source": "job", "samples": 3, "about": "name 'train' of alice in queue q",
                       "text": "~600 s, median of 3 runs of name 'train' of alice in queue q",
                       "expected_end": NOW + 600, "outrun": False}
    waiting = json.loads(corral(capsys, "job", "--log", str(log), "waiting", "--json"))["estimate"]
    assert (waiting["seconds"], waiting["source"], waiting["expected_end"]) == (600.0, "job", None)
    by_size = json.loads(corral(capsys, "job", "--log", str(log), "new-name", "--json"))["estimate"]
    assert (by_size["seconds"], by_size["source"], by_size["samples"]) == (600.0, "user_gpus", 3)
    outran = json.loads(corral(capsys, "job", "--log", str(log), "outran", "--json"))["estimate"]
    assert (outran["source"], outran["expected_end"], outran["outrun"]) == ("user_gpus", None, True)
    for job_id in ("lonely", "d1"):
        assert json.loads(corral(capsys, "job", "--log", str(log), job_id, "--json"))["estimate"] is None


def test_explain_tells_the_estimate_of_a_job_not_over(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A job placed at once, or told a capacity reason, never had its estimate in a JobWaiting: explain says it."""
    out = corral(capsys, "explain", "--log", str(log), "running")
    assert "  estimate: ~600 s, median of 3 runs of name 'train' of alice in queue q\n" in out
    assert f"  ends: {LogClock().instant(NOW + 600)} (in 8m00s, by the estimate)\n" in out
    out = corral(capsys, "explain", "--log", str(log), "waiting")
    assert "estimate: ~600 s" in out and "ends:" not in out
    assert "estimate" not in corral(capsys, "explain", "--log", str(log), "d1")
    assert "estimate" not in corral(capsys, "explain", "--log", str(log), "lonely")  # no history: nothing to add
    story = json.loads(corral(capsys, "explain", "--log", str(log), "new-name", "--json"))
    assert (story["estimate"]["seconds"], story["estimate"]["source"]) == (600.0, "user_gpus")


def test_job_and_explain_tell_a_reservations_start_alike(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """#41: one function tells both commands when a reservation holder starts, as of the same moment."""
    fields = _fields(corral(capsys, "job", "--log", str(log), "holder"))
    want = (f"{LogClock().instant(NOW + 600)} (in 8m00s, when job running ends by its estimate, ~600 s, median of "
            "3 runs of name 'train' of alice in queue q)")
    assert fields["starts"] == want
    assert f"  starts: {want}\n" in corral(capsys, "explain", "--log", str(log), "holder")
    job = json.loads(corral(capsys, "job", "--log", str(log), "holder", "--json"))["expected_start"]
    story = json.loads(corral(capsys, "explain", "--log", str(log), "holder", "--json"))["expected_start"]
    assert job == story == {"at": NOW + 600, "why": want.split("(in 8m00s, ", 1)[1].rstrip(")")}
    # A job holding no reservation is told no start.
    assert json.loads(corral(capsys, "job", "--log", str(log), "waiting", "--json"))["expected_start"] is None
    assert "starts" not in _fields(corral(capsys, "job", "--log", str(log), "waiting"))


def test_job_and_explain_show_a_pending_jobs_claim_and_a_big_gangs_starvation_bound(
        log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue #29: the claim its line is ordered by, where it comes from, and when a big gang may preempt."""
    waiting = json.loads(corral(capsys, "job", "--log", str(log), "waiting", "--json"))["line"]
    assert (waiting["claim_gpu_s"], waiting["claim_from"], waiting["starving_from"]) == (600.0, "job", None)
    fields = _fields(corral(capsys, "job", "--log", str(log), "waiting"))
    assert fields["claim"].startswith("0.2 GPU-h (1 GPUs x the learned run time of its name's past runs)")
    assert "starvation" not in fields  # a 1-GPU job is not bounded: it gets in as GPUs free up
    lonely = _fields(corral(capsys, "job", "--log", str(log), "lonely"))
    assert lonely["claim"].startswith("none known yet")
    gang = json.loads(corral(capsys, "job", "--log", str(log), "gang", "--json"))["line"]
    bound = gang["starvation_bound_s"]
    assert (gang["claim_gpu_s"], gang["claim_from"]) == (16 * 14_400.0, "limit")
    assert bound == 14_400.0, "relative to its run time: its time limit"
    assert gang["starving_from"] == T0 + 5 + bound and not gang["starving"]
    fields = _fields(corral(capsys, "job", "--log", str(log), "gang"))
    when = LogClock().instant(T0 + 5 + bound)
    assert fields["claim"].startswith("64.0 GPU-h (16 GPUs x its time limit)")
    assert fields["starvation"].startswith(f"not yet: starving from {when}, will preempt at {when}")
    out = corral(capsys, "explain", "--log", str(log), "gang")
    assert f"  starvation: not yet: starving from {when}" in out
    assert "line" in json.loads(corral(capsys, "explain", "--log", str(log), "gang", "--json"))
    assert json.loads(corral(capsys, "job", "--log", str(log), "running", "--json"))["line"] is None


def test_a_gang_past_the_bound_reads_starving_since() -> None:
    from orchestrator.cli.views import job_line, line_lines
    from orchestrator.core.model.state import Job
    from orchestrator.policies import DEFAULT_POLICIES

    job = Job(job_id="g", spec=JobSpec(name="g", ranks=2, gpus_per_rank=8), submitted_at=T0)
    line = job_line(job, T0 + 10**7, DEFAULT_POLICIES)
    assert line is not None and line["starving"]
    (_, claim), (_, starving) = line_lines(line, job, T0 + 10**7)
    assert claim.startswith("none known yet")
    assert starving.startswith(f"starving since {LogClock().instant(T0 + line['starvation_bound_s'])}")


@pytest.mark.parametrize(("policy", "bounded"), [("drf", False), ("las", False), ("corral", True), ("newer", True)])
def test_the_views_tell_the_bound_of_the_policy_the_leader_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], policy: str, bounded: bool) -> None:
    """`corral scheduler --policy drf` never lets a starving gang preempt: `job` and `explain` must not say it
    will. The newest SchedulerElected names the policy; a name this version does not know reads as corral's."""
    path = tmp_path / "events.jsonl"
    events = [*_history(), SchedulerElected(event_id="e2", occurred_at=NOW + 130, epoch=2, scheduler_id="s2",
                                            policy=policy)]
    path.write_bytes(b"".join(encode(e) + b"\n" for e in events))
    gang = json.loads(corral(capsys, "job", "--log", str(path), "gang", "--json"))["line"]
    assert (gang["starving_from"] is not None) is bounded
    assert ("starvation" in _fields(corral(capsys, "job", "--log", str(path), "gang"))) is bounded
    assert ("starvation:" in corral(capsys, "explain", "--log", str(path), "gang")) is bounded
