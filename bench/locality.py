"""Issue #33, acceptance 5 (the simulator's half): JCT with and without locality-aware placement.

A generated trace whose jobs train on datasets drawn from a shared pool (`sim gen --datasets K`: popular
ones more often, so caches are reused), on a cluster whose nodes stage datasets at `--staging-gbps` into
LRU caches of `--cache-gb` (orchestrator/sim/staging.py). The same policy runs twice, with placement's
warm-node preference and without it (`Policies.prefer_warm`); both runs use the same staging model,
so the difference is the preference's. Prints the side-by-side table, the machine and its load average,
and as the LAST line one JSON object with the figures.

    nice -n 10 .venv/bin/python bench/locality.py [--jobs N] [--nodes N] [--datasets K] [--dataset-gb G]
                                                  [--staging-gbps B] [--cache-gb C] [--load L] [--seed S]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.sim import machine
from orchestrator.sim.cluster import setup_events
from orchestrator.sim.engine import Scenario, SimConfig
from orchestrator.sim.gen import GenConfig, generate, standard_cluster
from orchestrator.sim.locality import compare_locality
from orchestrator.sim.specs import sim_jobs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=4000)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--queues", type=int, default=4)
    ap.add_argument("--load", type=float, default=0.8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--datasets", type=int, default=40, help="the pool's size")
    ap.add_argument("--dataset-gb", type=float, default=500.0, dest="dataset_gb", help="median dataset size, GB")
    ap.add_argument("--staging-gbps", type=float, default=1.0, dest="staging_gbps")
    ap.add_argument("--cache-gb", type=float, default=2000.0, dest="cache_gb")
    ap.add_argument("--policy", default="corral")
    args = ap.parse_args()

    cluster = standard_cluster(nodes=args.nodes, queues=args.queues, leaf_nodes=8, block_leaves=4)
    trace = generate(cluster, GenConfig(jobs=args.jobs, load=args.load, seed=args.seed, datasets=args.datasets,
                                        dataset_gb=args.dataset_gb))
    scenario = Scenario(tuple(setup_events(cluster)), tuple(sim_jobs(trace.jobs, cluster)), trace.outages)
    config = SimConfig(staging_gbps=args.staging_gbps, cache_gb=args.cache_gb)
    started = time.perf_counter()
    cmp = compare_locality(scenario, args.policy, config)
    wall = time.perf_counter() - started
    load = os.getloadavg()
    print(f"{args.jobs} jobs, {args.nodes} nodes x 8 GPUs, load {args.load}, {args.datasets} datasets "
          f"(median {args.dataset_gb:g} GB), staging {args.staging_gbps:g} GB/s per node, cache {args.cache_gb:g} GB")
    print(cmp.table())
    print(f"machine: {machine()}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; both runs {wall:.1f} s")
    figures = cmp.figures()
    figures.update({"nodes": args.nodes, "load": args.load, "datasets": args.datasets, "dataset_gb": args.dataset_gb,
                    "staging_gbps": args.staging_gbps, "cache_gb": args.cache_gb, "seed": args.seed,
                    "wall_s": round(wall, 2), "loadavg_1m": round(load[0], 2)})
    print(json.dumps(figures, allow_nan=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
