"""The simulator's event file is a real log: it folds with the normal evolve to the simulation's final state."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core.model.state import snapshot
from orchestrator.sim.baselines import POLICY_NAMES
from orchestrator.sim.cluster import setup_events
from orchestrator.sim.engine import Scenario, SimConfig, simulate
from orchestrator.sim.gen import GenConfig, generate, standard_cluster
from orchestrator.sim.replay import fold_log, from_log, read_log
from orchestrator.sim.specs import sim_jobs
from schemas.events import JobSubmitted, PreemptionRequested, Unknown

CLUSTER = standard_cluster(nodes=6, queues=3, leaf_nodes=2, block_leaves=2)


def _scenario() -> Scenario:
    trace = generate(CLUSTER, GenConfig(jobs=120, seed=7, node_mtbf_days=1.0, urgent_share=0.2))
    return Scenario(tuple(setup_events(CLUSTER)), tuple(sim_jobs(trace.jobs, CLUSTER)), trace.outages)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_event_file_folds_to_the_final_state(policy: str, tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    with path.open("wb") as f:
        result = simulate(_scenario(), policy, SimConfig(checkpoint_interval_s=600), log=f)
    events = list(read_log(path))
    assert len(events) == result.stats.events
    assert not any(isinstance(e, Unknown) for e in events)
    ids = [e.event_id for e in events if not isinstance(e, Unknown)]
    assert len(set(ids)) == len(ids), "event ids must be unique (they are NATS message ids)"
    times = [e.occurred_at for e in events if not isinstance(e, Unknown)]
    assert times == sorted(times), "occurred_at is the virtual clock: it never goes back"
    assert snapshot(fold_log(path)) == snapshot(result.state)
    if policy == "corral":
        assert any(isinstance(e, PreemptionRequested) for e in events), "the scenario should exercise preemption"
    assert result.timeline.requeues > 0, "the scenario should exercise node failures"


def test_from_log_reruns_the_same_workload_under_another_policy(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    scenario = _scenario()
    with path.open("wb") as f:
        simulate(scenario, "corral", log=f)
    logged = from_log(path)
    assert logged.skipped == ()
    assert [(j.job_id, j.submit_time, j.duration, j.spec) for j in logged.scenario.jobs] == [
        (j.job_id, j.submit_time, j.duration, j.spec) for j in scenario.jobs
    ]
    assert [(o.node_id, o.time, o.time + o.duration) for o in logged.scenario.outages] == [
        (o.node_id, o.time, o.time + o.duration) for o in scenario.outages
    ]
    # Same cluster and workload, so a re-run matches a direct run of that policy.
    direct = simulate(scenario, "fifo-backfill")
    rerun = simulate(logged.scenario, "fifo-backfill")
    assert rerun.timeline.end == direct.timeline.end
    assert rerun.timeline.first_start == direct.timeline.first_start


def test_from_log_with_a_cluster_spec_uses_only_the_jobs(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    with path.open("wb") as f:
        simulate(_scenario(), "corral", log=f)
    bigger = standard_cluster(nodes=12, queues=3, leaf_nodes=2, block_leaves=2)
    logged = from_log(path, bigger)
    assert logged.scenario.outages == ()
    result = simulate(logged.scenario, "corral")
    assert len(result.state.nodes) == 12
    assert sum(isinstance(e, JobSubmitted) for e in read_log(path)) == len(result.timeline.submit)
