"""`sim.threat.preemption_threat`: whether anyone waiting could preempt a gang -- False must be certain.

The simulator skips the wake-up for a gang becoming preemptible when it says
False, so a False where decide would have preempted would lose a preemption.
"""

from __future__ import annotations

import io

from hypothesis import HealthCheck, given, settings

from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import ClusterState
from orchestrator.sim.cluster import setup_events
from orchestrator.sim.engine import Scenario, SimConfig, simulate
from orchestrator.sim.gen import GenConfig, generate, standard_cluster
from orchestrator.sim.specs import sim_jobs
from orchestrator.sim.threat import preemption_threat
from orchestrator.sim.trace import Outage, TraceJob
from schemas.codec import decode
from schemas.events import PreemptionRequested
from tests.core.harness import Sim
from tests.sim.conftest import scenario, tiny_cluster
from tests.sim.test_properties import GPUS_PER_NODE, workloads


def test_a_higher_priority_job_waiting_in_the_queue_threatens_a_gang() -> None:
    s = Sim()
    s.node("n0")
    s.submit("low", gpus_per_rank=8, queue="a")
    s.run()
    assert not preemption_threat(s.state)(s.job("low"))  # nobody waits
    s.submit("same", gpus_per_rank=8, queue="a")
    assert not preemption_threat(s.state)(s.job("low"))  # same priority: it waits its turn
    s.submit("other", gpus_per_rank=8, queue="b", priority=10)
    assert not preemption_threat(s.state)(s.job("low"))  # another queue, no guarantees: no reclaim
    s.submit("urgent", gpus_per_rank=8, queue="a", priority=10)
    assert preemption_threat(s.state)(s.job("low"))


def test_a_borrowing_queue_is_threatened_by_a_queue_below_its_guarantee() -> None:
    s = Sim()
    s.node("n0")
    s.node("n1")
    s.queue("a", guaranteed_gpus=8)
    s.queue("b", guaranteed_gpus=8)
    s.submit("b1", gpus_per_rank=8, queue="b")
    s.submit("b2", gpus_per_rank=8, queue="b", preemptible=False)
    s.run()
    assert not preemption_threat(s.state)(s.job("b1"))  # nobody waits
    s.submit("a1", gpus_per_rank=8, queue="a")
    assert preemption_threat(s.state)(s.job("b1"))  # b holds 16 > 8, a holds 0 < 8 and waits
    assert not preemption_threat(s.state)(s.job("b2"))  # not preemptible at all


def _run_and_check(scn: Scenario) -> set[str]:
    """Simulate under corral, fold the log, and check each preemption was foreseen just before it; its kinds."""
    log = io.BytesIO()
    simulate(scn, "corral", SimConfig(restart_overhead_s=15), log=log)
    state = ClusterState()
    kinds: set[str] = set()
    for line in log.getvalue().splitlines():
        e = decode(line)
        if isinstance(e, PreemptionRequested):
            kinds.add("reclaim" if "reclaims" in e.reason else "priority")
            assert preemption_threat(state)(state.jobs[e.job_id]), f"{e.job_id} preempted unforeseen: {e.reason}"
        evolve(state, e)  # type: ignore[arg-type]
    return kinds


def test_every_preemption_of_a_simulated_run_was_foreseen() -> None:
    cluster = standard_cluster(nodes=8, queues=4, leaf_nodes=2, block_leaves=2)
    trace = generate(cluster, GenConfig(jobs=1000, seed=5, urgent_share=0.3, load=1.2))
    kinds = _run_and_check(Scenario(tuple(setup_events(cluster)), tuple(sim_jobs(trace.jobs, cluster))))
    assert kinds == {"priority", "reclaim"}, "the trace should exercise both kinds of preemption"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads())
def test_every_preemption_on_small_random_clusters_was_foreseen(
        w: tuple[int, list[dict[str, object]], list[TraceJob], list[Outage]]) -> None:
    nodes, queues, jobs, outages = w
    _run_and_check(scenario(tiny_cluster(nodes=nodes, gpus_per_node=GPUS_PER_NODE, queues=queues), jobs, outages))
