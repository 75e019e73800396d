"""Every policy keeps DESIGN.md's invariants on small random traces (hypothesis).

Strict mode checks, at every simulated instant: no GPU held by two gangs,
every gang whole, no queue over its limit, no void decision, and decide
settled (another call would append nothing). On top: every job ends, and a
completed job received at least its duration of GPU time on its whole gang.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.sim.baselines import POLICY_NAMES
from orchestrator.sim.engine import SimConfig, simulate
from orchestrator.sim.trace import Outage, TraceJob
from tests.sim.conftest import scenario, tiny_cluster

GPUS_PER_NODE = 4


@st.composite
def workloads(draw: st.DrawFn) -> tuple[int, list[dict[str, object]], list[TraceJob], list[Outage]]:
    nodes = draw(st.integers(1, 4))
    total = nodes * GPUS_PER_NODE
    guaranteed_b = draw(st.integers(0, total // 2))
    queues: list[dict[str, object]] = [
        {"name": "a", "weight": draw(st.sampled_from([1, 2])), "guaranteed_gpus": draw(st.integers(0, total // 2))},
        # A limit below the guarantee is refused (as by `corral queue set`).
        {"name": "b", "guaranteed_gpus": guaranteed_b,
         "limit_gpus": draw(st.one_of(st.none(), st.integers(max(GPUS_PER_NODE, guaranteed_b), total)))},
    ]
    sizes = [g for g in (1, 2, 3, 4, 8, 12, 16) if g <= total and (g <= GPUS_PER_NODE or g % GPUS_PER_NODE == 0)]
    jobs = []
    t = 0.0
    for i in range(draw(st.integers(1, 10))):
        t += draw(st.sampled_from([0.0, 5.0, 30.0, 200.0]))
        duration = draw(st.sampled_from([10.0, 60.0, 400.0, 1500.0]))
        limit = draw(st.one_of(st.none(), st.just(duration * 2 + 200)))
        jobs.append(TraceJob(f"j{i}", t, duration, draw(st.sampled_from(sizes)), draw(st.sampled_from(["a", "b"])),
                             priority=draw(st.sampled_from([0, 0, 5])), preemptible=draw(st.booleans()),
                             time_limit=limit))
    outages = []
    if draw(st.booleans()):
        outages.append(Outage(f"n{draw(st.integers(0, nodes - 1)):04d}", draw(st.sampled_from([20.0, 100.0, 700.0])),
                              draw(st.sampled_from([50.0, 500.0]))))
    return nodes, queues, jobs, outages


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads(), policy=st.sampled_from(POLICY_NAMES), interval=st.sampled_from([0.0, 100.0]))
def test_every_policy_keeps_the_invariants(w: tuple[int, list[dict[str, object]], list[TraceJob], list[Outage]],
                                           policy: str, interval: float) -> None:
    nodes, queues, jobs, outages = w
    cluster = tiny_cluster(nodes=nodes, gpus_per_node=GPUS_PER_NODE, queues=queues)
    result = simulate(scenario(cluster, jobs, outages), policy,
                      SimConfig(checkpoint_interval_s=interval, restart_overhead_s=15, strict=True))
    assert result.stats.voids == 0
    assert result.stats.unfinished == 0, "a job never ended"
    tl = result.timeline
    for job in jobs:
        if tl.status[job.job_id] == "completed":
            assert tl.end[job.job_id] - tl.first_start[job.job_id] >= job.duration - 1e-6
