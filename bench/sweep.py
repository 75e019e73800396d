"""The load sweep of issue #20: the standard trace at several offered loads, every policy at each.

The trace is bench/sim.py's (20,000 jobs, seed 1, on 352 nodes x 8 GPUs shared
by 11 teams), generated at each load (`GenConfig(load=L)`: the same jobs, their
arrivals spread to the load). Per load it prints the side-by-side table and
issue #20's acceptance 2, each check MET or NOT MET with the measured values;
then the sweep table; and as the LAST line one JSON object with the figures.

    .venv/bin/python bench/sweep.py [--loads 0.5,0.8,1.0,1.2] [--policies corral,fifo,...] [--jobs N]
                                    [--figures DIR] [--logs DIR]

The checks need their baselines: corral against las, fifo, drf and fifo-backfill
(a check whose baseline did not run says n/a).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.sim import GPUS_PER_NODE, NODES, QUEUES, machine, scenario
from orchestrator.sim.baselines import POLICY_NAMES, parse_policies
from orchestrator.sim.engine import SimConfig
from orchestrator.sim.sweep import SWEEP_FIGURES, LoadRun, load_name, parse_loads, run_sweep

#: Acceptance 2's bounds: corral's GPU-hours lost to preemption over those delivered, its preemptions of one job,
#: and its avg JCT against FIFO's from this load on.
LOST_SHARE, MAX_PREEMPTIONS, FIFO_FACTOR, FIFO_FROM_LOAD = 0.03, 3, 0.5, 0.8
#: Slack for "no worse than": two policies making the same decisions sum their figures in another order.
EPS = 1e-9


class Check(NamedTuple):
    name: str
    #: True / False, or None when a baseline it needs did not run (or a figure has no value).
    met: bool | None
    measured: str


def _get(metrics: Mapping[str, Mapping[str, Any]], policy: str, *path: str) -> Any:
    v: Any = metrics.get(policy)
    for p in path:
        if v is None:
            return None
        v = v[p]
    return v


def _at_most(name: str, c: float | None, bound: float | None, measured: str) -> Check:
    met = None if c is None or bound is None else c <= bound + EPS
    return Check(name, met, measured)


def _h(v: float | None) -> str:
    return "-" if v is None else f"{v / 3600:.2f} h"


def _f(v: float | None, fmt: str = "{:.3f}") -> str:
    return "-" if v is None else fmt.format(v)


def checks(run: LoadRun) -> list[Check]:
    """Issue #20 acceptance 2 at one load, corral's default policy against the baselines."""
    m = run.report.metrics
    out: list[Check] = []
    c_jct, las_jct, fifo_jct = (_get(m, p, "jct_s", "avg") for p in ("corral", "las", "fifo"))
    out.append(_at_most("avg JCT corral <= las", c_jct, las_jct, f"corral {_h(c_jct)}, las {_h(las_jct)}"))
    if run.load >= FIFO_FROM_LOAD:
        bound = FIFO_FACTOR * fifo_jct if fifo_jct is not None else None
        out.append(_at_most(f"avg JCT corral <= {FIFO_FACTOR:g} x fifo", c_jct, bound,
                            f"corral {_h(c_jct)}, fifo {_h(fifo_jct)}"
                            + (f" (ratio {c_jct / fifo_jct:.3f})" if c_jct is not None and fifo_jct else "")))
    for which in ("mean", "worst"):
        c, d = _get(m, "corral", "share_error", which), _get(m, "drf", "share_error", which)
        out.append(_at_most(f"share error ({which} queue) corral <= drf", c, d, f"corral {_f(c)}, drf {_f(d)}"))
    lost = _get(m, "corral", "lost_to_preemption_fraction")
    lost_h, delivered = _get(m, "corral", "gpu_hours_lost_to_preemption"), _get(m, "corral", "gpu_hours_delivered")
    out.append(_at_most(f"GPU-h lost to preemption <= {LOST_SHARE:.0%} of delivered", lost, LOST_SHARE,
                        f"{_f(lost_h, '{:.0f}')} of {_f(delivered, '{:.0f}')} GPU-h ({_f(lost, '{:.2%}')})"))
    most = _get(m, "corral", "preemptions_per_job", "max")
    out.append(_at_most(f"preemptions per job <= {MAX_PREEMPTIONS}", most, MAX_PREEMPTIONS,
                        f"max {_f(most, '{:.0f}')}, p99 {_f(_get(m, 'corral', 'preemptions_per_job', 'p99'), '{:.1f}')}"))
    c_wait, b_wait = (_get(m, p, "longest_wait_32plus_s") for p in ("corral", "fifo-backfill"))
    out.append(_at_most("longest >=32-GPU gang wait corral <= fifo-backfill", c_wait, b_wait,
                        f"corral {_h(c_wait)}, fifo-backfill {_h(b_wait)}"))
    c_alloc, b_alloc = (_get(m, p, "gpu_allocation", "mean") for p in ("corral", "fifo-backfill"))
    met = None if c_alloc is None or b_alloc is None else c_alloc >= b_alloc - EPS
    out.append(Check("mean allocation corral >= fifo-backfill", met,
                     f"corral {_f(c_alloc, '{:.2%}')}, fifo-backfill {_f(b_alloc, '{:.2%}')}"))
    return out


def verdict(met: bool | None) -> str:
    return {True: "MET", False: "NOT MET", None: "n/a"}[met]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--loads", default="0.5,0.8,1.0,1.2", help="offered loads, comma-separated (default %(default)s)")
    p.add_argument("--policies", default=",".join(POLICY_NAMES), help="policies to run at each load (default all)")
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--checkpoint-interval", type=float, default=1800.0, dest="checkpoint_interval")
    p.add_argument("--restart-overhead", type=float, default=120.0, dest="restart_overhead")
    p.add_argument("--figures", metavar="DIR", help="write the sweep's PNGs, each load's, metrics.json and table.txt")
    p.add_argument("--logs", metavar="DIR", help="write every run's event log there (load-<L>/events-<policy>.jsonl)")
    args = p.parse_args()
    try:
        loads = parse_loads(args.loads)
        policies = parse_policies(args.policies)
    except ValueError as e:
        p.error(str(e))
    config = SimConfig(checkpoint_interval_s=args.checkpoint_interval, restart_overhead_s=args.restart_overhead)
    scenarios = {load: scenario(args.jobs, args.seed, load) for load in loads}
    with tempfile.TemporaryDirectory(prefix="corral-sweep-") as tmp:
        out_dir = Path(args.logs) if args.logs else Path(tmp)
        swept = run_sweep(scenarios, policies, config, out_dir, write_logs=bool(args.logs),
                          figures=bool(args.figures), progress=lambda s: print(s, flush=True))
        if args.figures:
            _copy_figures(out_dir, Path(args.figures), loads)
    results: dict[str, Any] = {}
    for run in swept.runs:
        name = load_name(run.load)
        print(f"\n== load {name} (offered {run.offered:.3f}) ==")
        print(run.report.table)
        print()
        found = checks(run)
        for c in found:
            print(f"load {name}: {c.name}: {verdict(c.met)} ({c.measured})")
        results[name] = {c.name: c.met for c in found}
    print("\n== sweep ==")
    print(swept.table)
    every = [met for r in results.values() for met in r.values()]
    print(f"\nacceptance 2: {sum(1 for m in every if m)} of {len(every)} checks MET, "
          f"{sum(1 for m in every if m is False)} NOT MET, {sum(1 for m in every if m is None)} n/a")
    print(json.dumps({"mode": "sweep", "jobs": args.jobs, "nodes": NODES, "gpus": NODES * GPUS_PER_NODE,
                      "queues": QUEUES, "seed": args.seed, "machine": machine(), **swept.figures,
                      "acceptance_2": results}, allow_nan=False))


def _copy_figures(src: Path, dest: Path, loads: list[float]) -> None:
    """The sweep's PNGs, metrics.json and table.txt, and each load's PNGs, metrics.json and table.txt (not logs)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in [n for n, *_ in SWEEP_FIGURES] + ["metrics.json", "table.txt"]:
        shutil.copyfile(src / name, dest / name)
    for load in loads:
        sub = f"load-{load_name(load)}"
        (dest / sub).mkdir(exist_ok=True)
        for f in [*(src / sub).glob("*.png"), src / sub / "metrics.json", src / sub / "table.txt"]:
            shutil.copyfile(f, dest / sub / f.name)


if __name__ == "__main__":
    main()
