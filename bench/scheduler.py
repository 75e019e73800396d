"""Scheduler benchmarks. Prints one JSON line of figures (not pass/fail).

core_bench(): the pure core alone -- 1,024 nodes x 8 GPUs in blocks and leaves,
10,000 pending mixed gangs (1-64 GPUs) -- decide cycles whose decisions are
folded back with evolve while simulated agents start and finish the gangs.
Reports gangs placed per second of decide time and decide latency.

fold_bench(): folding a 1,000,000-event log of busy-cluster lifecycles.

e2e_bench() (bench/scheduler_e2e.py): a real `corral scheduler` process over an
embedded nats-server -- submit -> GangReserved latency at a steady 100 submits/s
and the rate of a burst.
Usage: python bench/scheduler.py [--nodes N] [--jobs N] [--fold-events N] [--no-e2e] [--burst N] [--latency-s S]
(--nodes sizes the end-to-end run's cluster too.)
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from orchestrator.core.decide import decide_cycle
from orchestrator.core.evolve import evolve
from orchestrator.core.model.memo import Memo
from orchestrator.core.model.state import ClusterState
from schemas.events import (
    AnyEvent,
    Checkpointed,
    ClusterConfigured,
    GangReserved,
    JobCompleted,
    JobRunning,
    JobSubmitted,
    JobWaiting,
    NodeRegistered,
    QueueDefined,
    RankPlacement,
    SchedulerElected,
    WorkerExited,
    WorkerStarted,
)
from schemas.inventory import Gpu, Inventory
from schemas.jobspec import JobSpec, Topology

T0 = 1_700_000_000.0
TEAMS = ("vision", "language", "speech", "infra")
#: (GPUs, ranks, weight): single-rank jobs up to a node, multi-node gangs of 8-GPU ranks.
SHAPES = ((1, 1, 30), (2, 1, 15), (4, 1, 15), (8, 1, 20), (8, 2, 10), (8, 4, 6), (8, 8, 4))


def cluster_events(nodes: int = 1024, gpus: int = 8, blocks: int = 8, leaves_per_block: int = 8) -> list[AnyEvent]:
    """Config, leader, queues and `nodes` registered nodes labelled block/leaf."""
    out: list[AnyEvent] = [
        ClusterConfigured(event_id="cfg", occurred_at=T0, topology_levels=("block", "leaf"), min_runtime_s=300.0),
        SchedulerElected(event_id="elect", occurred_at=T0, epoch=1, scheduler_id="bench"),
    ]
    for i, team in enumerate(TEAMS):
        out.append(QueueDefined(event_id=f"q-{team}", occurred_at=T0, queue=team, weight=1.0 + i % 2,
                                guaranteed_gpus=nodes * gpus // (len(TEAMS) * 2)))
    per_leaf = max(1, nodes // (blocks * leaves_per_block))
    gpu_list = tuple(Gpu(index=g, uuid=f"GPU-{g}", model="H100", memory_mib=81920) for g in range(gpus))
    links = tuple(tuple(0 if a == b else 118 for b in range(gpus)) for a in range(gpus))
    for n in range(nodes):
        leaf = n // per_leaf
        labels = {"block": f"b{leaf // leaves_per_block}", "leaf": f"l{leaf}"}
        out.append(NodeRegistered(event_id=f"reg-{n}", occurred_at=T0, node_id=f"node{n:04}", incarnation="1",
                                  address=f"10.{n // 256}.{n % 256}.1",
                                  inventory=Inventory(gpus=gpu_list, links=links, labels=labels)))
    return out


def job_events(count: int = 10_000, seed: int = 7) -> tuple[list[JobSubmitted], dict[str, float]]:
    """`count` mixed gangs across the teams, and how long each runs once started."""
    rnd = random.Random(seed)
    shapes = [s[:2] for s in SHAPES]
    weights = [s[2] for s in SHAPES]
    jobs: list[JobSubmitted] = []
    runtime: dict[str, float] = {}
    for i in range(count):
        per_rank, ranks = rnd.choices(shapes, weights)[0]
        topo = Topology(level="leaf", mode="require") if ranks > 1 and rnd.random() < 0.5 else None
        limit = rnd.choice([None, 1800.0, 7200.0])
        spec = JobSpec(name=f"job{i}", queue=rnd.choice(TEAMS), priority=rnd.randint(0, 3), ranks=ranks,
                       gpus_per_rank=per_rank, topology=topo, time_limit_s=limit)
        jid = f"job{i:05}"
        jobs.append(JobSubmitted(event_id=f"sub-{jid}", occurred_at=T0 + i * 0.001, job_id=jid, spec=spec))
        runtime[jid] = rnd.uniform(60.0, min(limit or 1500.0, 1500.0))
    return jobs, runtime


def core_bench(nodes: int = 1024, jobs: int = 10_000, max_cycles: int = 2000, tick_s: float = 20.0) -> dict[str, Any]:
    state = ClusterState()
    for e in cluster_events(nodes):
        evolve(state, e)
    submitted, runtime = job_events(jobs)
    for e in submitted:
        evolve(state, e)
    now = T0 + 60.0
    memo = Memo()  # kept between cycles, as the scheduler service keeps its own
    latencies: list[float] = []
    cpu = 0.0
    placed = 0
    events_out = 0
    waiting = 0
    first: dict[str, float] = {}
    n = 0
    cpus: list[float] = []
    more = False
    for _cycle in range(max_cycles):
        t, c = time.perf_counter(), time.process_time()
        decided, _, more = decide_cycle(state, now, epoch=1, memo=memo)
        dt = time.perf_counter() - t
        cpus.append(time.process_time() - c)
        cpu += cpus[-1]
        latencies.append(dt)
        events_out += len(decided)
        for e in decided:
            evolve(state, e)  # type: ignore[arg-type]
        # Agents: start every placed rank.
        for e in decided:
            if isinstance(e, GangReserved):
                placed += 1
                for rp in e.ranks:
                    n += 1
                    evolve(state, WorkerStarted(event_id=f"ws{n}", occurred_at=now, job_id=e.job_id,
                                                attempt=e.attempt, rank=rp.rank, node_id=rp.node_id))
            elif isinstance(e, JobWaiting):
                waiting += 1
        if not first:
            first = {"first_cycle_ms": dt * 1000, "first_cycle_gangs": placed}
        # Workloads end after their run time.
        for jid in list(state.active):
            job = state.jobs[jid]
            if job.status == "running" and now - job.reserved_at >= runtime[jid]:
                for rp in job.placement:
                    n += 1
                    evolve(state, WorkerExited(event_id=f"we{n}", occurred_at=now, job_id=jid, attempt=job.attempt,
                                               rank=rp.rank, node_id=rp.node_id, exit_code=0))
        if not state.pending and not state.active:
            break
        if not more:  # a cycle that left new jobs unexplained is followed at once, as in the service
            now += tick_s
    total = sum(latencies)
    lat_ms = sorted(x * 1000 for x in latencies)
    return {
        "core_nodes": nodes,
        "core_jobs": jobs,
        "core_gangs_placed": placed,
        "core_cycles": len(latencies),
        "core_gangs_per_s": round(placed / total, 1) if total else 0.0,
        # The same per CPU second of decide: steadier than wall time on a shared machine.
        "core_gangs_per_cpu_s": round(placed / cpu, 1) if cpu else 0.0,
        "core_decide_p50_ms": round(statistics.median(lat_ms), 2),
        "core_decide_p99_ms": round(lat_ms[min(len(lat_ms) - 1, int(len(lat_ms) * 0.99))], 2),
        "core_decide_max_ms": round(lat_ms[-1], 2),
        # Per cycle in CPU time (process_time: coarse, but not inflated by waiting for a CPU).
        "core_decide_cpu_p50_ms": round(statistics.median(cpus) * 1000, 2),
        "core_decide_cpu_p99_ms": round(sorted(cpus)[min(len(cpus) - 1, int(len(cpus) * 0.99))] * 1000, 2),
        "core_decide_cpu_max_ms": round(max(cpus) * 1000, 2),
        "core_first_cycle_ms": round(first.get("first_cycle_ms", 0.0), 1),
        "core_first_cycle_gangs": int(first.get("first_cycle_gangs", 0)),
        "core_events_decided": events_out,
        "core_waiting_events": waiting,
        "core_voids": state.voids,
    }


def lifecycle_log(target: int = 1_000_000, nodes: int = 1024, seed: int = 11) -> list[AnyEvent]:
    """A valid busy-cluster log: gangs on whole nodes, started, checkpointed, finished, over and over."""
    rnd = random.Random(seed)
    log: list[AnyEvent] = list(cluster_events(nodes))
    free = [f"node{n:04}" for n in range(nodes)]
    running: list[tuple[str, str, int]] = []
    i = 0
    now = T0
    while len(log) < target:
        now += 0.01
        if free and (len(running) < nodes // 2 or rnd.random() < 0.5):
            i += 1
            jid = f"j{i:07}"
            node = free.pop(rnd.randrange(len(free)))
            ranks = rnd.choice((1, 2, 4, 8))
            per = 8 // ranks
            log.append(JobSubmitted(event_id=f"s{i}", occurred_at=now, job_id=jid,
                                    spec=JobSpec(name=jid, queue=rnd.choice(TEAMS), ranks=ranks, gpus_per_rank=per)))
            placement = tuple(RankPlacement(rank=r, node_id=node, gpus=tuple(range(r * per, (r + 1) * per)))
                              for r in range(ranks))
            log.append(GangReserved(event_id=f"r{i}", occurred_at=now, job_id=jid, attempt=1, epoch=1,
                                    ranks=placement))
            log.extend(WorkerStarted(event_id=f"w{i}-{r}", occurred_at=now, job_id=jid, attempt=1, rank=r,
                                     node_id=node) for r in range(ranks))
            log.append(JobRunning(event_id=f"run{i}", occurred_at=now, job_id=jid, attempt=1))
            running.append((jid, node, ranks))
        elif running:
            jid, node, ranks = running.pop(rnd.randrange(len(running)))
            log.append(Checkpointed(event_id=f"c{jid}", occurred_at=now, job_id=jid, attempt=1, rank=0, step=100,
                                    path=f"/ckpt/{jid}"))
            log.extend(WorkerExited(event_id=f"x{jid}-{r}", occurred_at=now, job_id=jid, attempt=1, rank=r,
                                    node_id=node, exit_code=0) for r in range(ranks))
            log.append(JobCompleted(event_id=f"d{jid}", occurred_at=now, job_id=jid, attempt=1))
            free.append(node)
    return log[:target]


def fold_bench(events: int = 1_000_000) -> dict[str, Any]:
    log = lifecycle_log(events)
    state = ClusterState()
    t, c = time.perf_counter(), time.process_time()
    for seq, e in enumerate(log, 1):
        evolve(state, e, seq)
    dt, cpu = time.perf_counter() - t, time.process_time() - c
    return {
        "fold_events": len(log),
        "fold_events_per_s": round(len(log) / dt),
        "fold_events_per_cpu_s": round(len(log) / cpu),
        "fold_s": round(dt, 2),
        "fold_voids": state.voids,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--fold-events", type=int, default=1_000_000)
    ap.add_argument("--no-e2e", action="store_true", help="skip the end-to-end run through NATS")
    ap.add_argument("--burst", type=int, default=4000, help="end-to-end burst size")
    ap.add_argument("--latency-s", type=float, default=10.0, help="end-to-end: seconds of steady submits")
    args = ap.parse_args()
    figures = {**core_bench(args.nodes, args.jobs)}
    print(f"core: {figures['core_gangs_per_s']:,} gangs/s, decide p99 {figures['core_decide_p99_ms']} ms", flush=True)
    if args.fold_events:
        figures.update(fold_bench(args.fold_events))
    if not args.no_e2e:
        import asyncio

        from scheduler_e2e import e2e_bench

        figures.update(asyncio.run(e2e_bench(latency_s=args.latency_s, burst=args.burst, nodes=args.nodes)))
        print(f"e2e: {figures['e2e_gangs_per_s']:,} gangs/s, p99 {figures['e2e_p99_ms']} ms at 100 submits/s",
              flush=True)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
