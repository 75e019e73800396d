"""Helpers shared by the simulator tests: tiny clusters and scenarios built in memory."""

from __future__ import annotations

from collections.abc import Iterable

from orchestrator.sim.cluster import ClusterSpec, parse_cluster, setup_events
from orchestrator.sim.engine import Scenario
from orchestrator.sim.specs import SimJob, spec_of
from orchestrator.sim.trace import Outage, TraceJob


def tiny_cluster(nodes: int = 2, gpus_per_node: int = 1, queues: Iterable[dict[str, object]] = ({"name": "a"}, {"name": "b"}),
                 **extra: object) -> ClusterSpec:
    doc: dict[str, object] = {"nodes": nodes, "gpus_per_node": gpus_per_node, "queues": list(queues), "min_runtime_s": 0}
    doc.update(extra)
    return parse_cluster(doc)


def scenario(cluster: ClusterSpec, jobs: Iterable[TraceJob], outages: Iterable[Outage] = ()) -> Scenario:
    """The jobs go in unchecked (not through sim_jobs): what the cluster can never take -- a gang over its
    queue's limit -- is the scheduler's to reject at run time, as in a re-run log, and the tests see it do so."""
    made = (SimJob(j.job_id, j.submit_time, j.duration, spec_of(j, cluster), j.line) for j in jobs)
    return Scenario(tuple(setup_events(cluster)), tuple(made), tuple(outages))
