"""Only the generator may draw random numbers; a simulation is a function of its scenario."""

from __future__ import annotations

import ast
import io
from pathlib import Path

from orchestrator.sim.baselines import POLICY_NAMES
from orchestrator.sim.cluster import setup_events
from orchestrator.sim.engine import Scenario, SimConfig, simulate
from orchestrator.sim.gen import GenConfig, generate, standard_cluster
from orchestrator.sim.specs import sim_jobs

SIM = Path(__file__).resolve().parents[2] / "orchestrator" / "sim"


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_randomness_only_in_the_generator() -> None:
    users = sorted(p.name for p in SIM.glob("*.py") if {"random", "secrets", "uuid"} & _imports(p))
    assert users == ["gen.py"]


def test_no_io_services_in_the_simulator() -> None:
    for p in SIM.glob("*.py"):
        assert not {"nats", "docker", "socket", "subprocess", "threading"} & _imports(p), p.name


def test_same_scenario_same_log() -> None:
    cluster = standard_cluster(nodes=4, queues=2, leaf_nodes=2, block_leaves=2)
    trace = generate(cluster, GenConfig(jobs=80, seed=11, node_mtbf_days=1))
    scenario = Scenario(tuple(setup_events(cluster)), tuple(sim_jobs(trace.jobs, cluster)), trace.outages)
    logs = []
    for _ in range(2):
        buf = io.BytesIO()
        simulate(scenario, "corral", SimConfig(checkpoint_interval_s=300), log=buf)
        logs.append(buf.getvalue())
    assert logs[0] == logs[1]


def test_skipping_complete_admissions_changes_nothing() -> None:
    """The round after a placement skips admission when the placing one was complete
    (core/decide.decide_cycle): every policy writes the same log without the skip."""
    cluster = standard_cluster(nodes=8, queues=4, leaf_nodes=2, block_leaves=2)
    trace = generate(cluster, GenConfig(jobs=600, seed=3, node_mtbf_days=2, urgent_share=0.2, load=1.1))
    scenario = Scenario(tuple(setup_events(cluster)), tuple(sim_jobs(trace.jobs, cluster)), trace.outages)
    for policy in POLICY_NAMES:
        logs, skips = [], []
        for skip in (True, False):
            buf = io.BytesIO()
            r = simulate(scenario, policy, SimConfig(skip_complete=skip), log=buf)
            logs.append(buf.getvalue())
            skips.append(r.stats.admission_skips)
        assert logs[0] == logs[1], policy
        assert skips[0] > 0 and skips[1] == 0, (policy, skips)
