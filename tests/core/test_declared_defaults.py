"""`Policies` fields that are None declare a default the core reads in a faster way.

`job_key` None is the fold's line order (`fairshare.job_order_key`), read from
`ClusterState.lines` without a sort; `may_use_held` None is `backfill.may_use_held`,
read as one comparison with the earliest reservation start, under which admission
may be certified complete after a placement on held GPUs. Passing the functions
themselves takes the general path: the same decisions, only slower (and, for
`may_use_held`, fewer skipped repeat calls: a rule function may let a gang outlast
a reservation, so such a cycle is not certified).
"""

from __future__ import annotations

import io
from dataclasses import replace

from orchestrator.policies import DEFAULT_POLICIES, Policies
from orchestrator.policies.backfill import may_use_held
from orchestrator.policies.fairshare import job_order_key
from orchestrator.sim.cluster import setup_events
from orchestrator.sim.engine import Scenario, SimConfig, simulate
from orchestrator.sim.gen import GenConfig, generate, standard_cluster
from orchestrator.sim.specs import sim_jobs


def _scenario() -> Scenario:
    cluster = standard_cluster(nodes=8, queues=4, leaf_nodes=2, block_leaves=2)
    trace = generate(cluster, GenConfig(jobs=250, seed=3, node_mtbf_days=2, urgent_share=0.2, load=1.1))
    return Scenario(tuple(setup_events(cluster)), tuple(sim_jobs(trace.jobs, cluster)), trace.outages)


def _run(scenario: Scenario, policies: Policies) -> tuple[bytes, int]:
    """The log and the count of skipped admissions (strict: every skip is checked against a full call)."""
    buf = io.BytesIO()
    r = simulate(scenario, "corral", SimConfig(strict=True), log=buf, policies=policies)
    return buf.getvalue(), r.stats.admission_skips


def test_the_declared_defaults_decide_as_the_functions_they_stand_for() -> None:
    scenario = _scenario()
    assert DEFAULT_POLICIES.job_key is None and DEFAULT_POLICIES.may_use_held is None
    # Young gangs hold reservations too (as before #29), so that placements on held GPUs happen; with the
    # fixed starvation bound, under which this trace places on held GPUs in cycles a rule function decertifies.
    base = replace(DEFAULT_POLICIES, reserve_after_s=0.0, starvation_bound_factor=0.0)
    log, skips = _run(scenario, base)
    sorted_log, sorted_skips = _run(scenario, replace(base, job_key=job_order_key))
    assert sorted_log == log and sorted_skips == skips
    default_log, _ = _run(scenario, DEFAULT_POLICIES)
    assert default_log == _run(scenario, replace(DEFAULT_POLICIES, job_key=job_order_key))[0]
    asked_log, asked_skips = _run(scenario, replace(base, may_use_held=may_use_held))
    assert asked_log == log
    # A rule function is not known to keep every gang within a reservation's start: the cycles
    # that placed on held GPUs are not certified complete, and their repeat calls run in full.
    assert asked_skips < skips
