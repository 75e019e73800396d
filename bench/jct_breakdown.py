"""Where one policy's average JCT differs from another's: per-job breakdown by gang size and run time.

    nice -n 15 .venv/bin/python bench/jct_breakdown.py --jobs 5000 --seed 1 --load 1.2 \\
        --a las --b corral --set-b starvation_bound_factor=1.0 --log-checkpoints

Each job's JCT (end - submit) splits into its first wait (first start - submit), its run time
(what the trace says it needs) and the rest (waits after a stop, lost work, restarts). Printed per
class (GPUs x run time): jobs, the share of the total JCT difference (b - a) each class carries,
and the classes' means under a and b. Simulated time; hours. The last line is the same as one JSON
object (per class: jobs, share, a's and b's mean JCT, first wait and rest).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.sim import scenario
from orchestrator.sim.baselines import POLICY_NAMES, policies_for
from orchestrator.sim.engine import SimConfig, SimResult, simulate


def run(name: str, sets: list[str], ckpt: bool, jobs: int, seed: int, load: float) -> SimResult:
    pol = policies_for(name)
    pol = dataclasses.replace(pol, **{k: float(v) for k, _, v in (s.partition("=") for s in sets)})  # type: ignore[arg-type]
    return simulate(scenario(jobs, seed, load), name, SimConfig(log_checkpoints=ckpt), policies=pol)


def size_class(g: int) -> str:
    return "1" if g <= 1 else "2-8" if g <= 8 else "9-31" if g <= 31 else "32+"


def time_class(s: float) -> str:
    h = s / 3600
    return "<0.25h" if h < 0.25 else "0.25-1h" if h < 1 else "1-4h" if h < 4 else "4-16h" if h < 16 else ">=16h"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=5000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--load", type=float, default=1.2)
    p.add_argument("--a", choices=POLICY_NAMES, default="las")
    p.add_argument("--b", choices=POLICY_NAMES, default="corral")
    p.add_argument("--set-a", action="append", default=[])
    p.add_argument("--set-b", action="append", default=[])
    p.add_argument("--log-checkpoints", action="store_true", help="for corral (the baselines read none)")
    args = p.parse_args()
    ra = run(args.a, args.set_a, args.log_checkpoints and args.a == "corral", args.jobs, args.seed, args.load)
    rb = run(args.b, args.set_b, args.log_checkpoints and args.b == "corral", args.jobs, args.seed, args.load)
    rows: dict[tuple[str, str], list[list[float]]] = {}
    for jid, w in rb.work.items():
        ta, tb = ra.timeline, rb.timeline
        if jid not in ta.end or jid not in tb.end or jid not in ta.first_start or jid not in tb.first_start:
            continue
        vals = []
        for t in (ta, tb):
            jct = t.end[jid] - t.submit[jid]
            first = t.first_start[jid] - t.submit[jid]
            vals += [jct, first, jct - first - w.duration]
        rows.setdefault((size_class(w.gpus), time_class(w.duration)), []).append(vals)
    n = sum(len(v) for v in rows.values())
    total = sum(r[3] - r[0] for v in rows.values() for r in v)
    print(f"{n} jobs; avg JCT a={sum(r[0] for v in rows.values() for r in v) / n / 3600:.3f} h "
          f"b={sum(r[3] for v in rows.values() for r in v) / n / 3600:.3f} h; diff b-a {total / n / 3600:+.3f} h/job")
    print(f"{'gpus':>5} {'run':>8} {'jobs':>5} {'share':>6}  {'a jct':>6} {'b jct':>6}  {'a wait1':>7} {'b wait1':>7}"
          f"  {'a rest':>6} {'b rest':>6}")
    classes: dict[str, dict[str, float]] = {}
    for key in sorted(rows, key=lambda k: -abs(sum(r[3] - r[0] for r in rows[k]))):
        v = rows[key]
        m = [sum(r[i] for r in v) / len(v) / 3600 for i in range(6)]
        share = sum(r[3] - r[0] for r in v) / total if total else 0.0
        print(f"{key[0]:>5} {key[1]:>8} {len(v):>5} {share:>6.1%}  {m[0]:6.2f} {m[3]:6.2f}  {m[1]:7.2f} {m[4]:7.2f}"
              f"  {m[2]:6.2f} {m[5]:6.2f}")
        classes[f"{key[0]} GPUs, {key[1]}"] = {"jobs": len(v), "share_of_diff": round(share, 4),
                                               **{n: round(x, 3) for n, x in zip(
                                                   ("a_jct_h", "a_first_wait_h", "a_rest_h", "b_jct_h",
                                                    "b_first_wait_h", "b_rest_h"), m, strict=True)}}
    print(json.dumps({"jobs": n, "a": args.a, "b": args.b, "diff_h_per_job": round(total / n / 3600, 4) if n else None,
                      "classes": classes}))


if __name__ == "__main__":
    main()
