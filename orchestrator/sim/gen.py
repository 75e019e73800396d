"""Synthetic traces with the shape of a shared training cluster (seeded; the only randomness in the simulator).

What published GPU-cluster traces (Philly, Helios, Alibaba PAI) agree on, and
what this generator reproduces:

* arrivals are Poisson with a daily cycle (busy days, quiet nights);
* durations are heavy-tailed: most jobs run minutes, a few run days
  (lognormal, clipped);
* most jobs ask for 1 GPU, yet most GPU-time goes to 8-128 GPU gangs;
* bigger gangs run longer: single-GPU jobs are mostly short debugging and
  evaluation runs, 64-128 GPU gangs are training runs of many hours (the
  median grows as the square root of the gang's GPUs);
* a few teams (queues) submit most of the work, with different mixes:
  some train big models, some mostly debug on single GPUs;
* users give time limits, generous ones: a few times the real duration.

Datasets (issue #33, off by default): with `datasets` K > 0, a share of the
jobs train on one dataset drawn from a shared pool of K, popular ones more
often (Zipf, exponent 1), so reuse -- and warm caches -- happen; each pool
dataset's size is lognormal around `dataset_gb`. They come from their own
random stream: a trace generated without datasets is the same as before.

The offered load is a parameter, and it is the load the cluster sees while
the trace runs: arrivals are spread so that the GPU-seconds the jobs would
run *inside the arrival window* if each started on arrival equal `load` x
the cluster's GPUs x the window. (Dividing all the work asked for by the
window instead counts the hours that long jobs run after the last arrival:
with GPU-time dominated by day-long gangs, a trace "at 90%" then loaded the
cluster to about 83% on average, and its first day to far less.)
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import NamedTuple

from orchestrator.sim.cluster import ClusterSpec, Level, NodeGroup, QueueSpec, node_id
from orchestrator.sim.trace import Outage, Trace, TraceJob

DAY_S = 86_400.0

#: (GPUs, probability) of a gang size for a "mixed" team.
SIZES: tuple[tuple[int, float], ...] = (
    (1, 0.70), (2, 0.05), (4, 0.05), (8, 0.10), (16, 0.04), (32, 0.03), (64, 0.02), (128, 0.01),
)
#: Team profiles, cycled over the queues: how much more (or less) likely gangs of >= 8 GPUs are.
PROFILES: tuple[tuple[str, float], ...] = (("mixed", 1.0), ("training", 2.0), ("dev", 0.25))


class GenConfig(NamedTuple):
    jobs: int = 20_000
    #: Offered load: GPU-seconds asked for / (cluster GPUs x trace span).
    load: float = 0.9
    seed: int = 1
    #: Arrival rate swings +-this fraction over a day.
    day_amplitude: float = 0.5
    #: Median duration of a 1-GPU job; a g-GPU gang's median is this x g ** size_exponent.
    median_duration_s: float = 1200.0
    size_exponent: float = 0.5
    #: Lognormal sigma of durations (1.8: p99 about 60x the median).
    duration_sigma: float = 1.8
    min_duration_s: float = 60.0
    max_duration_s: float = 5 * DAY_S
    #: Share of jobs with a higher priority (they may preempt their own queue's jobs).
    urgent_share: float = 0.03
    #: Share of jobs that may not be preempted.
    pinned_share: float = 0.05
    #: Team loads fall off as 1 / rank ** skew (0: every team submits alike).
    team_skew: float = 0.8
    #: Mean days between outages of one node (0: no outages).
    node_mtbf_days: float = 0.0
    #: Median hours an outage lasts.
    repair_hours: float = 2.0
    #: GPU faults (one GPU of one node each) spread over the trace, and their median hours out of service.
    gpu_faults: int = 0
    gpu_fault_hours: float = 4.0
    #: Datasets (module docstring): the pool's size (0: none), the median dataset's GB, the share of jobs that
    #: train on one, and their `locality` ("prefer" or "require").
    datasets: int = 0
    dataset_gb: float = 100.0
    dataset_share: float = 1.0
    locality: str = "prefer"


def _size_table(boost: float, max_gpus: int) -> tuple[list[int], list[float]]:
    sizes = [(g, p * (boost if g >= 8 else 1.0)) for g, p in SIZES if g <= max_gpus]
    total = sum(p for _, p in sizes)
    return [g for g, _ in sizes], [p / total for _, p in sizes]


def _time_limit(rng: random.Random, duration: float) -> float:
    """A user's estimate: 1.5-4x the real duration, rounded up to 15 minutes, at least 30 minutes."""
    est = duration * rng.uniform(1.5, 4.0) + 600.0
    return max(1800.0, math.ceil(est / 900.0) * 900.0)


def _arrivals(rng: random.Random, n: int, span: float, amplitude: float) -> list[float]:
    """n arrival times of a Poisson process whose rate follows a daily sine, averaging n / span (thinning)."""
    rate = n / span
    peak = rate * (1.0 + amplitude)
    out: list[float] = []
    t = 0.0
    while len(out) < n:
        t += rng.expovariate(peak)
        if rng.random() * peak <= rate * (1.0 + amplitude * math.sin(2 * math.pi * t / DAY_S)):
            out.append(round(t, 3))
    return out


#: How close the arrival window's load must come to the asked one; further off, the load is out of reach.
LOAD_TOLERANCE = 0.05


def _spread(drafts: list[tuple[str, int, float, int, bool]], cfg: GenConfig, gpus: int) -> list[float]:
    """Arrival times whose window carries `cfg.load` (module docstring): the span is corrected until it does.

    Jobs too few for the cluster cannot carry the load however close they
    arrive (all at once they still ask for less): each correction only
    shrinks the window, towards every job at 0.0. Those jobs are spread by
    their total work instead -- the span in which it is `load` of the GPUs.
    """
    work = sum(g * d for _, g, d, _, _ in drafts)
    span = work / (cfg.load * gpus)
    for _ in range(20):
        times = _stretched(cfg, len(drafts), span)
        ratio = _window_ratio(times, drafts, cfg.load * gpus)
        if abs(ratio - 1.0) < 1e-3:
            return times
        if ratio <= 0:
            break
        span *= ratio
    if abs(ratio - 1.0) < LOAD_TOLERANCE:
        return times
    return _stretched(cfg, len(drafts), work / (cfg.load * gpus))


def _stretched(cfg: GenConfig, n: int, span: float) -> list[float]:
    # The same arrival pattern at every try, only stretched: its own seeded stream.
    return _arrivals(random.Random(f"arrivals-{cfg.seed}"), n, span, cfg.day_amplitude)


def _window_ratio(times: list[float], drafts: list[tuple[str, int, float, int, bool]], wanted_gpus: float) -> float:
    """GPUs the jobs keep busy inside their arrival window / the GPUs asked for (0 for a window of no length)."""
    end = times[-1]
    if end <= 0:
        return 0.0
    inside = sum(g * min(d, end - t) for t, (_, g, d, _, _) in zip(times, drafts, strict=True))
    return inside / (wanted_gpus * end)


def window_load(trace: Trace, gpus: int) -> float:
    """The load a trace puts on `gpus` GPUs while it arrives, if every job started on arrival."""
    return arrival_load([(j.submit_time, j.duration, j.num_gpus) for j in trace.jobs], gpus)


def arrival_load(jobs: Sequence[tuple[float, float, int]], gpus: int) -> float:
    """`window_load` of jobs given as (submit time, duration, GPUs): the GPU-seconds they would run inside their
    arrival window (first to last submit) if each started on arrival, over `gpus` x the window; 0 for no window."""
    if not jobs:
        return 0.0
    start, end = min(t for t, _, _ in jobs), max(t for t, _, _ in jobs)
    inside = sum(g * min(d, end - t) for t, d, g in jobs)
    return inside / (gpus * (end - start)) if end > start else 0.0


def generate(cluster: ClusterSpec, cfg: GenConfig | None = None) -> Trace:
    """A trace for `cluster` with the shape described above; equal seeds give equal traces."""
    cfg = cfg if cfg is not None else GenConfig()
    if cfg.jobs < 1 or cfg.load <= 0:
        raise ValueError("need at least one job and a positive load")
    rng = random.Random(cfg.seed)
    queues = [q.name for q in cluster.queues if not any(c.parent == q.name for c in cluster.queues)] or [
        cluster.default_queue
    ]
    team_weights = [1.0 / (i + 1) ** cfg.team_skew for i in range(len(queues))]
    tables = [_size_table(PROFILES[i % len(PROFILES)][1], cluster.total_gpus) for i in range(len(queues))]
    mu = math.log(cfg.median_duration_s)
    drafts: list[tuple[str, int, float, int, bool]] = []
    for _ in range(cfg.jobs):
        team = rng.choices(range(len(queues)), weights=team_weights)[0]
        sizes, probs = tables[team]
        gpus = rng.choices(sizes, weights=probs)[0]
        median = mu + cfg.size_exponent * math.log(gpus)
        duration = min(cfg.max_duration_s, max(cfg.min_duration_s, rng.lognormvariate(median, cfg.duration_sigma)))
        priority = 10 if rng.random() < cfg.urgent_share else 0
        preemptible = rng.random() >= cfg.pinned_share
        drafts.append((queues[team], gpus, round(duration, 1), priority, preemptible))
    times = _spread(drafts, cfg, cluster.total_gpus)
    jobs = tuple(
        TraceJob(job_id=f"j{i:06d}", submit_time=t, duration=d, num_gpus=g, queue=q, priority=p, preemptible=pre,
                 time_limit=_time_limit(rng, d))
        for i, (t, (q, g, d, p, pre)) in enumerate(zip(times, drafts, strict=True))
    )
    if cfg.datasets > 0:
        jobs = _with_datasets(jobs, cfg)
    span = times[-1] if times else 0.0
    outages = _outages(rng, cluster, cfg, span) + _gpu_faults(cluster, cfg, span)
    return Trace(jobs=jobs, outages=tuple(sorted(outages, key=lambda o: (o.time, o.node_id, o.gpu or 0))),
                 source=f"gen(seed={cfg.seed})")


def _with_datasets(jobs: tuple[TraceJob, ...], cfg: GenConfig) -> tuple[TraceJob, ...]:
    """Each job, with probability `dataset_share`, trains on one dataset of the pool (module docstring)."""
    rng = random.Random(f"datasets/{cfg.seed}")
    pool = [(f"ds{i:03d}", round(max(0.1, rng.lognormvariate(math.log(cfg.dataset_gb), 0.5)), 1))
            for i in range(cfg.datasets)]
    popularity = [1.0 / (i + 1) for i in range(cfg.datasets)]
    out = []
    for j in jobs:
        if rng.random() < cfg.dataset_share:
            j = j._replace(datasets=(rng.choices(pool, weights=popularity)[0],), locality=cfg.locality)
        out.append(j)
    return tuple(out)


def _outages(rng: random.Random, cluster: ClusterSpec, cfg: GenConfig, span: float) -> tuple[Outage, ...]:
    if cfg.node_mtbf_days <= 0:
        return ()
    out: list[Outage] = []
    rate = 1.0 / (cfg.node_mtbf_days * DAY_S)
    for i in range(cluster.node_count):
        t = rng.expovariate(rate)
        while t < span:
            down = rng.lognormvariate(math.log(cfg.repair_hours * 3600.0), 0.8)
            out.append(Outage(node_id(i), round(t, 3), round(down, 1)))
            t += down + rng.expovariate(rate)
    return tuple(sorted(out, key=lambda o: (o.time, o.node_id)))


def _gpu_faults(cluster: ClusterSpec, cfg: GenConfig, span: float) -> tuple[Outage, ...]:
    """`cfg.gpu_faults` faults on random GPUs at uniform times (their own random stream: a trace
    generated without them is the same as before they existed)."""
    if cfg.gpu_faults <= 0:
        return ()
    rng = random.Random(f"gpu-faults/{cfg.seed}")
    sizes = [g.gpus_per_node for g in cluster.groups for _ in range(g.nodes)]
    out = []
    for _ in range(cfg.gpu_faults):
        i = rng.randrange(len(sizes))
        down = rng.lognormvariate(math.log(cfg.gpu_fault_hours * 3600.0), 0.8)
        out.append(Outage(node_id(i), round(rng.uniform(0.0, span), 3), round(down, 1), gpu=rng.randrange(sizes[i])))
    return tuple(out)


def standard_cluster(nodes: int = 352, gpus_per_node: int = 8, queues: int = 11, *, leaf_nodes: int = 8,
                     block_leaves: int = 4, guarantee_share: float = 0.5, half_life_s: float = 0.0) -> ClusterSpec:
    """A cluster like the benchmark's: blocks of leaves of nodes, `queues` equal teams.

    Each team is guaranteed `guarantee_share` of an equal split of the GPUs, so
    idle GPUs are lent out and a team below its guarantee reclaims them.
    """
    total = nodes * gpus_per_node
    guaranteed = int(total / max(queues, 1) * guarantee_share)
    return ClusterSpec(
        groups=(NodeGroup(nodes=nodes, gpus_per_node=gpus_per_node),),
        levels=(Level("block", block_leaves), Level("leaf", leaf_nodes)),
        queues=tuple(QueueSpec(name=f"team-{chr(ord('a') + i)}" if queues <= 26 else f"team-{i:02d}",
                               guaranteed_gpus=guaranteed) for i in range(queues)),
        fairshare_half_life_s=half_life_s,
    )
