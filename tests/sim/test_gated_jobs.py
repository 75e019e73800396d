"""The simulator folds and decides holds, dependencies and job arrays as the scheduler does (#31),
and a re-run of its log under another policy keeps them: the gates travel in the specs."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from orchestrator.sim.cluster import setup_events
from orchestrator.sim.engine import Scenario, SimConfig, simulate
from orchestrator.sim.gen import standard_cluster
from orchestrator.sim.replay import from_log, read_log
from orchestrator.sim.specs import DURATION_ENV, SimJob
from schemas.events import AnyEvent, GangReserved, JobCancelled, JobCompleted, JobFailed, Unknown
from schemas.jobspec import ArrayElement, Gates, JobSpec

CLUSTER = standard_cluster(nodes=2, queues=1, leaf_nodes=2, block_leaves=1)


def _job(job_id: str, t: float, duration: float, gates: Gates | None = None) -> SimJob:
    spec = JobSpec(name=job_id, queue="team-a", gpus_per_rank=1, env={DURATION_ENV: str(duration)})
    if gates is not None:
        spec = msgspec.structs.replace(spec, gates=gates)
    return SimJob(job_id, t, duration, spec)


def _scenario() -> Scenario:
    array = [_job(f"arr_{i}", 0.0, 100.0, Gates(array=ArrayElement(array_id="arr", index=i, limit=3, indexes="0-9")))
             for i in range(10)]
    jobs = [*array, _job("first", 0.0, 500.0),
            _job("after", 10.0, 50.0, Gates(after_ok=("first", "arr_9"))),
            _job("orphan", 10.0, 50.0, Gates(after_ok=("ghost",)))]
    return Scenario(tuple(setup_events(CLUSTER)), tuple(jobs))


def _check(events: list[AnyEvent | Unknown]) -> None:
    """From the log alone: the array's limit, the dependency's order, the orphan's end."""
    holding: set[str] = set()
    most = 0
    at: dict[tuple[str, str], float] = {}
    for e in events:
        if isinstance(e, GangReserved):
            at.setdefault(("reserved", e.job_id), e.occurred_at)
            if e.job_id.startswith("arr_"):
                holding.add(e.job_id)
                most = max(most, len(holding))
        elif isinstance(e, (JobCompleted, JobFailed, JobCancelled)):
            at.setdefault(("ended", e.job_id), e.occurred_at)
            holding.discard(e.job_id)
            if isinstance(e, JobCancelled) and e.job_id == "orphan":
                assert e.reason == "dependency never satisfied: job ghost does not exist"
    assert most == 3
    assert all(("ended", f"arr_{i}") in at for i in range(10))
    assert at[("reserved", "after")] >= max(at[("ended", "first")], at[("ended", "arr_9")])
    assert ("reserved", "orphan") not in at and ("ended", "orphan") in at


@pytest.mark.parametrize("policy", ["corral", "fifo"])
def test_gates_in_the_simulator_and_its_rerun(policy: str, tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    with path.open("wb") as f:
        simulate(_scenario(), policy, SimConfig(strict=True), log=f)
    _check(list(read_log(path)))
    logged = from_log(path)
    assert {j.job_id for j in logged.scenario.jobs} >= {"after", "orphan", "arr_0"}
    rerun = tmp_path / "rerun.jsonl"
    with rerun.open("wb") as f:
        simulate(logged.scenario, "fifo-backfill", SimConfig(strict=True), log=f)
    _check(list(read_log(rerun)))


def test_a_job_submitted_held_waits_in_the_simulation_but_not_in_a_rerun(tmp_path: Path) -> None:
    """Nothing releases it in a simulation; a re-run of the log replays submissions, not users' holds."""
    scenario = Scenario(tuple(setup_events(CLUSTER)), (_job("held", 0.0, 50.0, Gates(hold=True)), _job("free", 0.0, 50.0)))
    path = tmp_path / "events.jsonl"
    with path.open("wb") as f:
        result = simulate(scenario, "corral", SimConfig(strict=True), log=f)
    assert result.state.jobs["held"].status == "pending" and result.state.jobs["free"].status == "completed"
    logged = from_log(path)
    assert {j.job_id: j.spec.gating.hold for j in logged.scenario.jobs} == {"held": False, "free": False}
    rerun = simulate(logged.scenario, "corral", SimConfig(strict=True))
    assert rerun.state.jobs["held"].status == "completed"
