"""From a trace row to the JobSpec a user would have submitted for it.

A trace only says "N GPUs"; a JobSpec says ranks x GPUs per rank and where the
ranks should sit. Up to one node's worth is one rank (one worker per node is
how multi-GPU training is launched); above it, whole nodes: N / G ranks of G
GPUs, preferring the finest topology domain (a leaf switch) so the gang's
all-reduce stays under one switch when the cluster has room.

The run time rides along in the spec's env (`SIM_DURATION_S`): the log then
carries everything a re-run needs, so `from_log` can replay it under another
policy without the original trace. So do the sizes of a job's datasets
(`SIM_DATASETS_GB`, "name:GB;..."): a spec names datasets by source, and the
simulator stages them by size (engine.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

from orchestrator.core.model.state import Queue
from orchestrator.core.model.usage import first_over_limit
from orchestrator.sim.cluster import ClusterSpec
from orchestrator.sim.trace import TraceError, TraceJob
from schemas.datasets import Dataset
from schemas.jobspec import JobSpec, Topology

DURATION_ENV = "SIM_DURATION_S"
#: The sizes of a job's datasets, "name:GB;name:GB" (only in specs with datasets).
DATASETS_ENV = "SIM_DATASETS_GB"
#: Grace period the simulated jobs ask for (agents here checkpoint at once, so it only bounds a stop).
GRACE_S = 30.0


class SimJob(NamedTuple):
    """One job of a simulation: when it arrives, how much work it is, what it asks for."""

    job_id: str
    submit_time: float
    #: Seconds of run time the job needs (on its full gang) to complete.
    duration: float
    spec: JobSpec
    line: int = 0

    @property
    def gpus(self) -> int:
        return self.spec.total_gpus


def shape(num_gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """(ranks, GPUs per rank): one rank up to a node, whole nodes above. ValueError if it does not split."""
    if num_gpus <= gpus_per_node:
        return 1, num_gpus
    if num_gpus % gpus_per_node:
        raise ValueError(f"num_gpus {num_gpus} is above one node ({gpus_per_node} GPUs) but not a multiple of it")
    return num_gpus // gpus_per_node, gpus_per_node


def cluster_check(cluster: ClusterSpec) -> Callable[[JobSpec], list[str]]:
    """Why `cluster` could never run a spec: the scheduler's own admission checks (policies/reject.py), made
    before the run so a mistake is told with its line instead of turning into a rejected job. What the
    checks read of the cluster is gathered once, not per job."""
    names = [q.name for q in cluster.queues]
    queues = {q.name: Queue(name=q.name, weight=q.weight, guaranteed_gpus=q.guaranteed_gpus, limit_gpus=q.limit_gpus,
                            parent=q.parent) for q in cluster.queues}  # as the fold holds them, for its limit walk
    levels = ("node", "cluster", *cluster.level_names)
    listed = ", ".join(["node", *cluster.level_names])
    models = sorted({g.gpu_model for g in cluster.groups})

    def problems(spec: JobSpec) -> list[str]:
        out = []
        total = spec.total_gpus
        if total > cluster.total_gpus:
            out.append(f"needs {total} GPUs, more than the cluster's {cluster.total_gpus}")
        elif spec.gpus_per_rank > cluster.gpus_per_node:
            out.append(f"a rank needs {spec.gpus_per_rank} GPUs, the largest node has {cluster.gpus_per_node}")
        queue = spec.queue if spec.queue in queues or cluster.default_queue not in queues else cluster.default_queue
        if names and queue not in queues:
            out.append(f"queue {spec.queue!r} is not in the cluster spec (queues: {', '.join(names)}; "
                       f"no {cluster.default_queue!r} queue to run it in)")
        elif (over := first_over_limit(queues, lambda _name: 0, queue, total)) is not None:
            out.append(f"needs {total} GPUs, more than queue {over[0]}'s limit_gpus {over[1]}")
        if spec.topology is not None and spec.topology.level not in levels:
            out.append(f"topology level {spec.topology.level!r} is not in the cluster spec (levels: {listed})")
        if spec.gpu_model is not None and not any(spec.gpu_model.lower() in m.lower() for m in models):
            out.append(f"gpu_model {spec.gpu_model!r} matches no GPU of the cluster (models: {', '.join(models)})")
        return out

    return problems


def spec_of(job: TraceJob, cluster: ClusterSpec) -> JobSpec:
    ranks, per_rank = shape(job.num_gpus, cluster.gpus_per_node)
    if job.topology is not None:
        topo: Topology | None = Topology(level=job.topology[0], mode=job.topology[1])  # type: ignore[arg-type]
    elif ranks == 1:
        topo = Topology(level="node", mode="prefer")
    elif cluster.levels:
        topo = Topology(level=cluster.levels[-1].name, mode="prefer")
    else:
        topo = None
    env = {DURATION_ENV: repr(float(job.duration))}
    extra: dict[str, object] = {}
    if job.datasets:
        env[DATASETS_ENV] = ";".join(f"{n}:{gb!r}" for n, gb in job.datasets)
        extra["datasets"] = tuple(Dataset(name=n, source=f"file:///sim/datasets/{n}", mount=f"/data/{n}")
                                  for n, _ in job.datasets)
    if job.locality != "prefer":
        extra["locality"] = job.locality
    return JobSpec(
        name=job.job_id,
        queue=job.queue,
        priority=job.priority,
        ranks=ranks,
        gpus_per_rank=per_rank,
        gpu_model=job.gpu_model,
        topology=topo,
        env=env,
        grace_period_s=GRACE_S,
        time_limit_s=job.time_limit,
        preemptible=job.preemptible,
        **extra,  # type: ignore[arg-type]
    )


def dataset_sizes(spec: JobSpec) -> dict[str, int]:
    """A simulated spec's datasets -> size in bytes (from `DATASETS_ENV`; 0 for one it does not size)."""
    sizes: dict[str, int] = {}
    for part in spec.env.get(DATASETS_ENV, "").split(";"):
        name, _, gb = part.partition(":")
        try:
            sizes[name] = max(0, int(float(gb) * 1e9))
        except (ValueError, OverflowError):  # a hand-edited log's "x:inf" or "x:nan" sizes nothing
            continue
    return {d.name: sizes.get(d.name, 0) for d in spec.dataset_list}


def sim_jobs(jobs: Iterable[TraceJob], cluster: ClusterSpec, source: str = "<trace>") -> list[SimJob]:
    """Every trace job as a SimJob; TraceError listing each job this cluster cannot take."""
    out: list[SimJob] = []
    problems: list[str] = []
    check = cluster_check(cluster)
    for j in jobs:
        where = f"{source}:{j.line}: " if j.line else f"{source}: job {j.job_id}: "
        try:
            spec = spec_of(j, cluster)
        except ValueError as e:
            problems.append(where + str(e))
            continue
        problems += [where + p for p in check(spec)]
        out.append(SimJob(j.job_id, j.submit_time, j.duration, spec, j.line))
    if problems:
        raise TraceError(problems)
    return out


def unfit_jobs(jobs: Iterable[SimJob], cluster: ClusterSpec, source: str) -> list[str]:
    """"file:line: job J: why" for each job (of a log) that `cluster` could never run."""
    check = cluster_check(cluster)
    return [f"{source}:{j.line}: job {j.job_id}: {p}" for j in jobs for p in check(j.spec)]
