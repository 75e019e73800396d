"""One policy, or a variant of it, on bench/sweep.py's standard trace at one point: issue #42's figures as JSON.

A variant changes numeric fields of the policy's `Policies` record (`--set
starvation_bound_factor=0`), so an option is measured beside the policy it
would change, on the same trace and figures as the sweep's:

    nice -n 15 .venv/bin/python bench/policy_variant.py --jobs 20000 --seed 1 --load 1.0 \\
        --policy corral --set starvation_bound_factor=0 --no-log-checkpoints

Printed (one JSON line): avg JCT, the longest wait of a >= 32-GPU gang and
the >= 32-GPU gangs that waited more than twice their time limit (the
estimated run time corral has of them on this trace: every generated job has
one), preemptions (most per job, all), the share of GPU-hours lost to
preemption, the worst queue's share error, CPU seconds (`time.process_time`:
the machine is shared) and the log's sha256 (first 12 hex digits: the same
inputs must give the same bytes).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.sim import scenario, with_settings
from orchestrator.sim.baselines import POLICY_NAMES, policies_for
from orchestrator.sim.engine import SimConfig, simulate
from orchestrator.sim.metrics import big_gang_waits, summarize


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--load", type=float, default=1.0)
    p.add_argument("--policy", choices=POLICY_NAMES, default="corral")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=NUMBER",
                   help="a numeric field of the policy's Policies record (repeatable)")
    p.add_argument("--log-checkpoints", action=argparse.BooleanOptionalAction, default=True,
                   help="the simulated agents log every periodic checkpoint (SimConfig.log_checkpoints, the default)")
    args = p.parse_args()
    pol, changes = with_settings(p, policies_for(args.policy), args.set)
    sc = scenario(args.jobs, args.seed, args.load)
    limit = {j.job_id: j.spec.time_limit_s for j in sc.jobs}
    log = io.BytesIO()
    t0 = time.process_time()
    result = simulate(sc, args.policy, SimConfig(log_checkpoints=args.log_checkpoints), log=log, policies=pol)
    cpu = time.process_time() - t0
    m = summarize(result)
    big = {j: w for j, w in big_gang_waits(result).items() if result.timeline.gpus[j] >= 32}
    past = sorted((w / 3600, j) for j, w in big.items() if (lim := limit[j]) is not None and w > 2 * lim)
    print(json.dumps({
        "jobs": args.jobs, "seed": args.seed, "load": args.load, "policy": args.policy, "set": changes,
        "log_checkpoints": args.log_checkpoints,
        "avg_jct_h": m["jct_s"]["avg"] / 3600,
        "longest_wait_32plus_h": max(big.values()) / 3600 if big else None,
        "waited_past_2x_limit": {"gangs": len(past), "longest_h": past[-1][0] if past else None},
        "preemptions_per_job_max": m["preemptions_per_job"]["max"], "preemptions": m["preemptions"],
        "lost_to_preemption_fraction": m["lost_to_preemption_fraction"],
        "share_error_worst": m["share_error"]["worst"], "cpu_s": round(cpu, 1),
        "log_sha256": hashlib.sha256(log.getvalue()).hexdigest()[:12],
    }))


if __name__ == "__main__":
    main()
