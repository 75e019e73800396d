"""Chaos run at the issue's size: >= 2,000 jobs on >= 32 simulated nodes, two schedulers, random faults.

Prints progress, then the figures as one JSON object on the last line:
faults by kind, restarts, jobs and outcomes, epochs, NodeFailed (effective and
void), decisions voided by epoch, violations found by the independent checker
(tests/faults/chaos_check.py) and services whose fold differed from a fresh one.

    .venv/bin/python bench/chaos.py [--jobs 2000] [--nodes 32] [--chaos-s 180] [--seed 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.faults.chaos import ChaosConfig, run_chaos
from tests.faults.test_chaos import fresh_fold


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--chaos-s", type=float, default=180.0)
    ap.add_argument("--drain-s", type=float, default=600.0)
    ap.add_argument("--fault-every", type=float, default=1.5)
    ap.add_argument("--lease-ttl", type=float, default=4.0)
    ap.add_argument("--heartbeat-timeout", type=float, default=8.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-nats-faults", action="store_true")
    args = ap.parse_args()
    cfg = ChaosConfig(jobs=args.jobs, nodes=args.nodes, chaos_s=args.chaos_s, drain_s=args.drain_s,
                      fault_every=args.fault_every, seed=args.seed, nats_faults=not args.no_nats_faults,
                      lease_ttl=args.lease_ttl, heartbeat_timeout=args.heartbeat_timeout)
    with tempfile.TemporaryDirectory(prefix="corral-chaos-") as d:
        result = asyncio.run(run_chaos(cfg, Path(d), fresh_digest=fresh_fold,
                                       progress=lambda s: print(s, file=sys.stderr, flush=True)))
    for v in result.report.violations[:50]:
        print("violation:", v)
    for m in result.state_mismatches:
        print("state mismatch:", m)
    print(json.dumps({"machine": platform.machine(), "cpus": os.cpu_count(),
                      "config": {"jobs": cfg.jobs, "nodes": cfg.nodes, "schedulers": cfg.schedulers,
                                 "chaos_s": cfg.chaos_s, "seed": cfg.seed, "lease_ttl": cfg.lease_ttl,
                                 "heartbeat_timeout": cfg.heartbeat_timeout}, **result.summary()}))


if __name__ == "__main__":
    main()
