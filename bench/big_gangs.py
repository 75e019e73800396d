"""Big-gang waits of corral against fifo-backfill over several seeds (issue #7, target 4).

The longest wait of a >= 32-GPU gang is the largest of ~1,264 waits, and any
change of decisions moves it by an hour or two either way; one seed's table
row (`bench/sim.py`) cannot tell a rule change from noise. This runs corral
and fifo-backfill on the same generated trace per seed and compares every big
gang with itself: longest, mean and p95 wait, how many gangs wait longer under
corral (and by more than an hour), their summed excess, and JCT / Jain beside
them. `--set` changes corral's `Policies` for a what-if (numbers only, e.g.
`--set reservations=3 --set starving_after_s=7200`).

    .venv/bin/python bench/big_gangs.py [--seeds 1,2,3] [--jobs 20000] [--set FIELD=NUMBER ...]

Prints a table, and as the LAST line one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sim import machine, scenario  # bench/sim.py: the same trace and cluster

from orchestrator.policies import DEFAULT_POLICIES, Policies
from orchestrator.sim.baselines import policies_for
from orchestrator.sim.engine import SimConfig, simulate
from orchestrator.sim.metrics import big_gang_waits, percentile, summarize, waits_longer

HOUR = 3600.0


def parse_sets(items: list[str]) -> dict[str, float]:
    numeric = {f.name for f in fields(Policies) if isinstance(getattr(DEFAULT_POLICIES, f.name), (int, float))}
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or name not in numeric:
            raise SystemExit(f"--set {item!r}: want FIELD=NUMBER, FIELD one of {', '.join(sorted(numeric))}")
        try:
            out[name] = type(getattr(DEFAULT_POLICIES, name))(float(value))
        except ValueError:
            raise SystemExit(f"--set {item!r}: {value!r} is not a number") from None
    return out


def run(seed: int, jobs: int, policy: str, overrides: dict[str, float]) -> tuple[dict[str, Any], dict[str, float]]:
    result = simulate(scenario(jobs, seed, 0.9), policy, SimConfig(),  # bench/sim.py's defaults: 1,800 s, 120 s
                      policies=replace(policies_for(policy), **overrides))
    return summarize(result, buckets=10), big_gang_waits(result)


def compare(corral: dict[str, float], fifo_backfill: dict[str, float]) -> dict[str, Any]:
    def stats(w: dict[str, float]) -> dict[str, float]:
        v = sorted(w.values())
        return {"longest_h": v[-1] / HOUR, "mean_h": sum(v) / len(v) / HOUR, "p95_h": percentile(v, 95) / HOUR}

    longer = waits_longer(corral, fifo_backfill)
    return {"corral": stats(corral), "fifo_backfill": stats(fifo_backfill),
            "compared": sum(1 for j in corral if j in fifo_backfill),
            "longer": len(longer), "longer_by_1h": sum(1 for d in longer if d > HOUR),
            "excess_h": sum(longer) / HOUR}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="1,2,3", help="comma-separated trace seeds (default 1,2,3)")
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--set", action="append", default=[], metavar="FIELD=NUMBER", dest="sets",
                   help="change one numeric field of corral's Policies (repeatable)")
    args = p.parse_args()
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        raise SystemExit(f"--seeds {args.seeds!r}: want integers, e.g. 1,2,3") from None
    overrides = parse_sets(args.sets)
    rows: dict[int, dict[str, Any]] = {}
    for seed in seeds:
        m_c, w_c = run(seed, args.jobs, "corral", overrides)
        m_f, w_f = run(seed, args.jobs, "fifo-backfill", {})  # the baseline never changes
        row = compare(w_c, w_f)
        for name, m in (("corral", m_c), ("fifo_backfill", m_f)):
            row[name] |= {"avg_jct_h": m["jct_s"]["avg"] / HOUR, "jain": m["jain_index"],
                          "preemptions": m["preemptions"]}
        rows[seed] = row
        c, f = row["corral"], row["fifo_backfill"]
        print(f"seed {seed}: longest {c['longest_h']:.2f} h vs {f['longest_h']:.2f} h "
              f"({'met' if c['longest_h'] <= f['longest_h'] else 'NOT met'}); mean {c['mean_h']:.2f} vs "
              f"{f['mean_h']:.2f} h; p95 {c['p95_h']:.2f} vs {f['p95_h']:.2f} h; {row['longer']} of "
              f"{row['compared']} big gangs wait longer under corral, {row['longer_by_1h']} by > 1 h, "
              f"{row['excess_h']:.0f} h in all; JCT {c['avg_jct_h']:.3f} vs {f['avg_jct_h']:.3f} h; "
              f"Jain {c['jain']:.3f} vs {f['jain']:.3f}", flush=True)
    print(json.dumps({"mode": "big_gangs", "jobs": args.jobs, "overrides": overrides, "machine": machine(),
                      "seeds": rows,
                      "longest_met_on": [s for s, r in rows.items()
                                         if r["corral"]["longest_h"] <= r["fifo_backfill"]["longest_h"]]}))


if __name__ == "__main__":
    main()
