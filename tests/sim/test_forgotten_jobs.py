"""A simulation outlives the fold's memory of finished jobs (FINISHED_KEPT).

At 20,000 jobs and load 1.2 the LAS run crashed with KeyError: a job whose
protection was still maturing had finished and been dropped from the fold,
and the wake-up search looked it up. Here the fold keeps only a handful of
finished jobs, so the same thing happens on a small trace.
"""

from __future__ import annotations

import pytest

from orchestrator.core import evolve_jobs
from orchestrator.sim.cluster import setup_events
from orchestrator.sim.engine import Scenario, SimConfig, simulate
from orchestrator.sim.gen import GenConfig, generate, standard_cluster
from orchestrator.sim.specs import sim_jobs


@pytest.mark.parametrize("policy", ["corral", "las"])
def test_jobs_forgotten_by_the_fold_do_not_stop_the_simulation(
        policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(evolve_jobs, "FINISHED_KEPT", 10)  # (retire, the fold of a finished job, reads it)
    cluster = standard_cluster(nodes=4, queues=3, leaf_nodes=2, block_leaves=2)
    trace = generate(cluster, GenConfig(jobs=300, seed=3, load=1.2))
    scenario = Scenario(tuple(setup_events(cluster)), tuple(sim_jobs(trace.jobs, cluster)), trace.outages)
    result = simulate(scenario, policy, SimConfig())
    assert result.stats.unfinished == 0
    assert sum(1 for s in result.timeline.status.values() if s == "completed") == 300
