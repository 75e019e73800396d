"""Simulator speed of each policy relative to FIFO's on one trace, in CPU seconds (issue #42 acceptance 4).

The machine is shared, so wall time says little: each run is timed with
`time.process_time()` (this process's CPU), the policies run interleaved
round after round in one process, and the medians are compared. Each run's
log is hashed (sha256, first 12 hex digits): a speed change that is meant to
decide nothing must leave every hash as it was.

    nice -n 5 .venv/bin/python bench/sim_speed.py [--trace isolated|standard] [--nodes 64] [--queues 4]
                                                  [--jobs 3000] [--load 1.0] [--seed 1] [--rounds 3]
                                                  [--policies corral,fifo] [--set FIELD=N ...]
                                                  [--no-log-checkpoints]

`isolated`: bench/sweep.py's isolated trace (each team's limit its guarantee, an equal split; no time
limits), at any size: the heaviest teams' backlogs grow for the whole trace, so their multi-day jobs and
big gangs wait past the starvation bound and corral judges them first in every cycle. `standard`:
bench/sim.py's trace. `--set` changes a numeric field of corral's `Policies` record (as
bench/policy_variant.py does; the other policies keep theirs), `--no-log-checkpoints` clears
`SimConfig.log_checkpoints` for every policy: `--set starvation_bound_factor=0 --no-log-checkpoints` is
round 2's record. The last line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.sim import machine, with_settings
from orchestrator.sim.baselines import parse_policies, policies_for
from orchestrator.sim.cluster import setup_events
from orchestrator.sim.engine import Scenario, SimConfig, simulate
from orchestrator.sim.gen import GenConfig, generate, standard_cluster
from orchestrator.sim.specs import sim_jobs


def scenario(kind: str, nodes: int, queues: int, jobs: int, load: float, seed: int) -> Scenario:
    if kind == "standard":
        cluster = standard_cluster(nodes, 8, queues)
        trace = generate(cluster, GenConfig(jobs=jobs, seed=seed, load=load))
        return Scenario(tuple(setup_events(cluster)), tuple(sim_jobs(trace.jobs, cluster)), trace.outages)
    base = standard_cluster(nodes, 8, queues, guarantee_share=1.0)
    cluster = base._replace(queues=tuple(q._replace(limit_gpus=q.guaranteed_gpus) for q in base.queues))
    trace = generate(cluster, GenConfig(jobs=jobs, seed=seed, load=load))
    anonymous = tuple(j._replace(time_limit=None) for j in trace.jobs)
    return Scenario(tuple(setup_events(cluster)), tuple(sim_jobs(anonymous, cluster)), trace.outages)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", choices=("isolated", "standard"), default="isolated")
    p.add_argument("--nodes", type=int, default=64)
    p.add_argument("--queues", type=int, default=4)
    p.add_argument("--jobs", type=int, default=3000)
    p.add_argument("--load", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--policies", default="corral,fifo", help="timed in this order each round (default %(default)s)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=NUMBER",
                   help="a numeric field of corral's Policies record (repeatable)")
    p.add_argument("--log-checkpoints", action=argparse.BooleanOptionalAction, default=True,
                   help="the simulated agents log every periodic checkpoint (SimConfig.log_checkpoints, the default)")
    args = p.parse_args()
    policies = parse_policies(args.policies)
    corral, changes = with_settings(p, policies_for("corral"), args.set)
    config = SimConfig(log_checkpoints=args.log_checkpoints)
    sc = scenario(args.trace, args.nodes, args.queues, args.jobs, args.load, args.seed)
    cpu: dict[str, list[float]] = {name: [] for name in policies}
    logs: dict[str, set[str]] = {name: set() for name in policies}
    for r in range(args.rounds):
        for name in policies:
            log = io.BytesIO()
            t0 = time.process_time()
            simulate(sc, name, config, log=log, policies=corral if name == "corral" else None)
            cpu[name].append(time.process_time() - t0)
            logs[name].add(hashlib.sha256(log.getvalue()).hexdigest()[:12])
            print(f"round {r + 1} {name}: {cpu[name][-1]:.2f} CPU s, log {min(logs[name])}, "
                  f"load average {os.getloadavg()[0]:.1f}", flush=True)
    med = {name: statistics.median(v) for name, v in cpu.items()}
    speed = {name: med["fifo"] / m for name, m in med.items()} if "fifo" in med else {}
    for name in policies:
        rel = f", {speed[name]:.2f}x fifo's speed" if speed else ""
        print(f"{name}: median {med[name]:.2f} CPU s of {', '.join(f'{t:.2f}' for t in cpu[name])}{rel}")
    print(json.dumps({"trace": args.trace, "nodes": args.nodes, "queues": args.queues, "jobs": args.jobs,
                      "load": args.load, "seed": args.seed, "set": changes,
                      "log_checkpoints": args.log_checkpoints, "machine": machine(), "cpu_s": cpu, "median_cpu_s": med,
                      "speed_vs_fifo": speed, "logs": {k: sorted(v) for k, v in logs.items()}}))


if __name__ == "__main__":
    main()
