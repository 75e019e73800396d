"""`corral usage`: GPU-hours from the whole log, past the fold's FINISHED_KEPT retained jobs (#21 acceptance 5).

The log is written here, event by event, and the expected GPU-hours are summed from its raw JSON lines by
code that shares nothing with corral's fold: a reservation holds its GPUs from its GangReserved to the
job's next JobCompleted, JobFailed, JobCancelled or JobRequeued.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.core.model.state import FINISHED_KEPT
from schemas import (
    ClusterConfigured,
    Event,
    GangReserved,
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobRequeued,
    JobSpec,
    JobSubmitted,
    NodeRegistered,
    QueueDefined,
    RankPlacement,
    SchedulerElected,
)
from schemas.codec import encode
from schemas.inventory import Gpu, Inventory

#: Enough that the fold evicts some (it drops the oldest in batches of a tenth of FINISHED_KEPT).
JOBS = FINISHED_KEPT + FINISHED_KEPT // 10 + 500
NODES = 4
QUEUES = ("research", "prod", "batch")
USERS = ("alice", "bob", "carol", "dave")
T0 = 1_700_000_000.0  # a cluster's clock (Unix time)


def _log() -> list[Event]:
    gpus = tuple(Gpu(index=i, uuid=f"g{i}", model="H100", memory_mib=1) for i in range(8))
    out: list[Event] = [
        ClusterConfigured(event_id="cfg", occurred_at=T0, default_queue="research"),
        SchedulerElected(event_id="elect", occurred_at=T0, epoch=1, scheduler_id="s"),
        *(QueueDefined(event_id=f"q-{q}", occurred_at=T0, queue=q) for q in QUEUES),
        *(NodeRegistered(event_id=f"n{n}", occurred_at=T0, node_id=f"n{n}", incarnation="1", address="a",
                         inventory=Inventory(gpus=gpus)) for n in range(NODES)),
    ]
    t = T0 + 10
    for i in range(JOBS):
        jid, per_rank, ranks = f"j{i:05d}", (1, 2, 4, 8)[i % 4], 1 + (i % 7 == 0)
        queue = QUEUES[i % 3] if i % 11 else "nosuch"  # undefined: charged to the default queue
        spec = JobSpec(name=jid, queue=queue, ranks=ranks, gpus_per_rank=per_rank)
        placement = tuple(RankPlacement(rank=r, node_id=f"n{(i + r) % NODES}", gpus=tuple(range(per_rank)))
                          for r in range(ranks))
        out.append(JobSubmitted(event_id=f"s-{jid}", occurred_at=t, job_id=jid, spec=spec,
                                submitted_by=USERS[i % 4] if i % 13 else ""))
        attempt = 1
        if i % 10 == 0:  # lost its GPUs once (a node failure): requeued, then placed again
            out.append(GangReserved(event_id=f"r1-{jid}", occurred_at=t + 1, job_id=jid, attempt=1, epoch=1,
                                    ranks=placement))
            out.append(JobRequeued(event_id=f"q-{jid}", occurred_at=t + 1 + (i % 37) * 60, job_id=jid, attempt=2,
                                   reason="node lost", epoch=1))
            attempt, t = 2, t + 1 + (i % 37) * 60
        out.append(GangReserved(event_id=f"r{attempt}-{jid}", occurred_at=t + 2, job_id=jid, attempt=attempt,
                                epoch=1, ranks=placement))
        end = t + 2 + 30 + (i * 7919) % 5400
        if i % 9 == 0:
            out.append(JobFailed(event_id=f"f-{jid}", occurred_at=end, job_id=jid, attempt=attempt, reason="x",
                                 epoch=1))
        elif i % 17 == 0:
            out.append(JobCancelled(event_id=f"c-{jid}", occurred_at=end, job_id=jid, reason="by hand", epoch=1))
        else:
            out.append(JobCompleted(event_id=f"d-{jid}", occurred_at=end, job_id=jid, attempt=attempt, epoch=1))
        t = end + 1
    # One still running at the end of the log: counted up to the log's last event.
    spec = JobSpec(name="last", queue="prod", ranks=1, gpus_per_rank=8)
    out += [JobSubmitted(event_id="s-last", occurred_at=t, job_id="last", spec=spec, submitted_by="erin"),
            GangReserved(event_id="r-last", occurred_at=t + 1, job_id="last", attempt=1, epoch=1,
                         ranks=(RankPlacement(rank=0, node_id="n0", gpus=tuple(range(8))),)),
            QueueDefined(event_id="q-late", occurred_at=t + 3601, queue="late")]
    return out


@pytest.fixture(scope="module")
def log_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("usage") / "cluster.jsonl"
    path.write_bytes(b"\n".join(encode(e) for e in _log()) + b"\n")
    return path


def independent_gpu_hours(path: Path, key: str, since: float = float("-inf"),
                          until: float = float("inf")) -> dict[str, float]:
    """GPU-hours per queue (the spec's, or the default for an undefined one) or user, from raw JSON lines."""
    queues, default, end_of_log = set(), "", 0.0
    who: dict[str, str] = {}
    held: dict[str, tuple[float, int]] = {}
    out: dict[str, float] = defaultdict(float)

    def close(job: str, at: float) -> None:
        start, gpus = held.pop(job)
        lo, hi = max(start, since), min(at, until)
        if hi > lo:
            out[who[job]] += gpus * (hi - lo) / 3600

    for line in path.read_bytes().splitlines():
        e = json.loads(line)
        end_of_log = e["occurred_at"]
        match e["type"]:
            case "ClusterConfigured":
                default = e["default_queue"]
            case "QueueDefined":
                queues.add(e["queue"])
            case "JobSubmitted":
                q = e["spec"]["queue"]
                who[e["job_id"]] = (q if q in queues else default) if key == "queue" else e["submitted_by"] or "(unknown)"
            case "GangReserved":
                held[e["job_id"]] = (e["occurred_at"], sum(len(r["gpus"]) for r in e["ranks"]))
            case "JobCompleted" | "JobFailed" | "JobCancelled" | "JobRequeued":
                close(e["job_id"], e["occurred_at"])
    for job in list(held):
        close(job, end_of_log)
    return dict(out)


def corral_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:  # type: ignore[type-arg]
    with pytest.raises(SystemExit) as exit_:
        main([*args, "--json"])
    out = capsys.readouterr()
    assert exit_.value.code == 0, out.err
    return json.loads(out.out)  # type: ignore[no-any-return]


def _hours(report: dict, key: str) -> dict[str, float]:  # type: ignore[type-arg]
    return {r[key]: r["gpu_hours"] for r in report["rows"]}


def test_usage_by_queue_counts_every_job_of_the_log(log_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The fold keeps the newest FINISHED_KEPT finished jobs (and up to a tenth more); `jobs --all` and usage read
    # them all (#39: no silent partial answers).
    listed = corral_json(capsys, "jobs", "--log", str(log_file), "--all")["jobs"]
    assert len(listed) == JOBS + 1  # (and the one still running at the end of the log)
    report = corral_json(capsys, "usage", "--log", str(log_file), "--by", "queue")
    expected = independent_gpu_hours(log_file, "queue")
    assert set(expected) == set(QUEUES)
    assert _hours(report, "queue") == pytest.approx(expected, rel=1e-9)
    assert report["gpu_hours"] == pytest.approx(sum(expected.values()), rel=1e-9)
    finished = sum(sum(r["finished"].values()) for r in report["rows"])
    assert finished == JOBS


def test_usage_by_user_in_a_window(log_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    since, until = T0 + 3 * 86400, T0 + 9 * 86400  # cuts reservations at both ends
    report = corral_json(capsys, "usage", "--log", str(log_file), "--by", "user", "--since",
                         "2023-11-17T22:13:20+00:00", "--until", "+9d")
    assert (report["since"], report["until"]) == (since, until)
    expected = independent_gpu_hours(log_file, "user", since, until)
    assert set(expected) == {*USERS, "(unknown)"}
    assert _hours(report, "user") == pytest.approx(expected, rel=1e-9)


def test_usage_table_and_bad_window(log_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["usage", "--log", str(log_file)])
    out = capsys.readouterr().out
    assert exit_.value.code == 0
    header = out.splitlines()[1].split()
    assert header == ["QUEUE", "GPU-HOURS", "SHARE", "RESERVATIONS", "FINISHED"]
    assert {line.split()[0] for line in out.splitlines()[2:-1]} == set(QUEUES) and "total" in out
    with pytest.raises(SystemExit) as exit_:
        main(["usage", "--log", str(log_file), "--since", "1d", "--until", "2d"])
    assert exit_.value.code == 2 and "before --since" in capsys.readouterr().err
