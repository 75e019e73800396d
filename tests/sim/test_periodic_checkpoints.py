"""SimConfig.log_checkpoints: the simulated agents log each periodic checkpoint, so victim choice sees it.

By default the simulator saves a checkpoint every interval of work but logs
one only when an attempt is stopped, so the core's victim cost counts all
the work since an attempt began. With the option on, rank 0 logs each save
(as a real job's agent does) and a gang that has just saved is the cheap one
to stop.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from orchestrator.cli.sim import main
from orchestrator.sim.engine import SimConfig, simulate
from orchestrator.sim.metrics import summarize
from orchestrator.sim.trace import TraceJob
from schemas.codec import decode
from schemas.events import Checkpointed, JobSubmitted, PreemptionRequested
from tests.sim.conftest import scenario, tiny_cluster


def _run(jobs: list[TraceJob], nodes: int, on: bool) -> tuple[list[object], dict[str, object]]:
    cluster = tiny_cluster(nodes=nodes, queues=[{"name": "a"}])
    log = io.BytesIO()
    cfg = SimConfig(checkpoint_interval_s=100, restart_overhead_s=20, strict=True, log_checkpoints=on)
    result = simulate(scenario(cluster, jobs), "corral", cfg, log=log)
    events = [decode(line) for line in log.getvalue().splitlines()]
    return events, summarize(result)


def test_each_periodic_checkpoint_is_logged_when_asked_and_none_by_default() -> None:
    """One job of 350 s alone: saves at 100, 200 and 300 s of work (not at its end); by default none is logged."""
    jobs = [TraceJob("solo", 0, 350, 1, "a")]
    events, _ = _run(jobs, 1, on=True)
    ckpts = [(e.step, e.occurred_at, e.attempt, e.rank) for e in events if isinstance(e, Checkpointed)]
    assert ckpts == [(100, 100.0, 1, 0), (200, 200.0, 1, 0), (300, 300.0, 1, 0)]
    default, _ = _run(jobs, 1, on=False)
    assert not [e for e in default if isinstance(e, Checkpointed)]


def test_a_resumed_attempt_logs_from_its_resume_point_after_its_restart_overhead() -> None:
    """low (300 s) is preempted at 250 by high (50 s): it resumes from 200 at 300, +20 s overhead, saves no more
    (its next save, 300 s of work, is its end); its stop logs no second checkpoint of step 200."""
    jobs = [TraceJob("low", 0, 300, 1, "a"), TraceJob("high", 250, 50, 1, "a", priority=10)]
    events, m = _run(jobs, 1, on=True)
    ckpts = [(e.job_id, e.step, e.occurred_at, e.attempt) for e in events if isinstance(e, Checkpointed)]
    assert ckpts == [("low", 100, 100.0, 1), ("low", 200, 200.0, 1)]
    assert m["gpu_hours_lost_to_preemption"] * 3600 == 50 + 20  # as without the option (test_handchecked)


def test_the_victim_that_just_saved_is_stopped() -> None:
    """2 GPUs. old (1,000 s) runs from 0, young (1,000 s) from 50; high (priority 10) arrives at 210.

    old has run 210 s and saved at 200 (10 s at risk); young has run 160 s and
    saved at 100 (60 s at risk). Logged, old is the cheaper victim and loses 10 s;
    unlogged, the core sees 210 s against 160 s and stops young, which loses 60 s.
    """
    jobs = [TraceJob("old", 0, 1000, 1, "a"), TraceJob("young", 50, 1000, 1, "a"),
            TraceJob("high", 210, 50, 1, "a", priority=10)]
    events, m = _run(jobs, 2, on=True)
    assert [e.job_id for e in events if isinstance(e, PreemptionRequested)] == ["old"]
    assert m["gpu_hours_lost_to_preemption"] * 3600 == 10 + 20
    events, m = _run(jobs, 2, on=False)
    assert [e.job_id for e in events if isinstance(e, PreemptionRequested)] == ["young"]
    assert m["gpu_hours_lost_to_preemption"] * 3600 == 60 + 20


def test_sim_cli_logs_every_checkpoint_unless_told_not_to(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`corral sim` logs every save (the default); `--no-log-checkpoints` only the stops' saves; same trace."""
    trace, cluster = tmp_path / "t.csv", tmp_path / "c.yaml"
    assert main(["gen", "--nodes", "2", "--queues", "2", "--jobs", "30", "--seed", "3", "--out", str(trace),
                 "--cluster-out", str(cluster)]) == 0
    logs = {}
    for flag in (["--no-log-checkpoints"], []):
        out = tmp_path / ("off" if flag else "on")
        assert main(["--trace", str(trace), "--cluster", str(cluster), "--policy", "corral", "--checkpoint-interval",
                     "600", "--out", str(out), "--no-figures", *flag]) == 0
        logs[not flag] = [decode(line) for line in (out / "events-corral.jsonl").read_bytes().splitlines()]
    capsys.readouterr()
    saved = [e for e in logs[True] if isinstance(e, Checkpointed)]
    assert len(saved) > len([e for e in logs[False] if isinstance(e, Checkpointed)])
    assert all(e.step % 600 == 0 for e in saved)
    assert {e.job_id for e in logs[True] if isinstance(e, JobSubmitted)} == {
        e.job_id for e in logs[False] if isinstance(e, JobSubmitted)}
