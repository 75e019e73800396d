"""The load sweep of issues #20 and #29: the standard trace at several offered loads, every policy at each.

The trace is bench/sim.py's (20,000 jobs, seed 1, on 352 nodes x 8 GPUs shared
by 11 teams), generated at each load (`GenConfig(load=L)`: the same jobs, their
arrivals spread to the load). Per load it prints the side-by-side table and
issue #29's acceptance, each check MET or NOT MET with the measured values;
then the sweep table; and as the LAST line one JSON object with the figures.

    nice -n 10 .venv/bin/python bench/sweep.py [--loads 0.5,0.8,1.0,1.2] [--policies corral,fifo,...]
                                               [--jobs N] [--seed S] [--isolated] [--figures DIR] [--logs DIR]

`--isolated`: issue #29's acceptance 3 -- each team's limit is its guarantee (an
equal split of the whole cluster), and no job carries a time limit (nor a
user: a generated trace has none), so corral's order inside a queue comes from
the run times it learns from the log alone. The checks need their baselines:
corral against las, drf and fifo-backfill (fifo when isolated); a check whose
baseline did not run says n/a. Published baselines of earlier runs need not
be run again: the baselines' decisions did not change with #29 (their order
inside a queue is `fairshare.arrival_order_key`).
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
from orchestrator.sim.cluster import setup_events
from orchestrator.sim.engine import Scenario, SimConfig
from orchestrator.sim.gen import GenConfig, generate, standard_cluster
from orchestrator.sim.specs import sim_jobs
from orchestrator.sim.sweep import SWEEP_FIGURES, LoadRun, load_name, parse_loads, run_sweep

#: Issue #29's bounds: GPU-hours lost to preemption over those delivered, preemptions of one job, the
#: slack on DRF's worst-queue share error, corral's avg JCT against LAS's at load 1.0, and -- on the
#: isolated trace (--isolated) -- against FIFO's.
LOST_SHARE, MAX_PREEMPTIONS, SHARE_SLACK, LAS_FACTOR, LAS_AT_LOAD, FIFO_FACTOR = 0.02, 3, 0.05, 1.15, 1.0, 0.8
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


def _times(bound: float | None, factor: float) -> float | None:
    return None if bound is None else factor * bound


def checks(run: LoadRun, *, isolated: bool = False) -> list[Check]:
    """Issue #29's acceptance at one load, corral's default policy against the baselines.

    1 on the standard trace (every load): avg JCT <= DRF's and <= fifo-backfill's, the longest
    >= 32-GPU gang wait <= fifo-backfill's, <= 3 preemptions per job, <= 2% of GPU-hours lost,
    worst-queue share error <= DRF's + 0.05; 2 at load 1.0: avg JCT <= 1.15x LAS's. On the
    isolated trace (3): avg JCT <= 0.8x FIFO's. Sim speed (4) is in the table (jobs/s).
    """
    m = run.report.metrics
    out: list[Check] = []
    c_jct = _get(m, "corral", "jct_s", "avg")
    if isolated:
        fifo = _get(m, "fifo", "jct_s", "avg")
        out.append(_at_most(f"avg JCT corral <= {FIFO_FACTOR:g} x fifo (isolated)", c_jct, _times(fifo, FIFO_FACTOR),
                            f"corral {_h(c_jct)}, fifo {_h(fifo)}"
                            + (f" (ratio {c_jct / fifo:.3f})" if c_jct is not None and fifo else "")))
        return out
    for base in ("drf", "fifo-backfill"):
        b = _get(m, base, "jct_s", "avg")
        out.append(_at_most(f"avg JCT corral <= {base}", c_jct, b, f"corral {_h(c_jct)}, {base} {_h(b)}"))
    if abs(run.load - LAS_AT_LOAD) < 1e-9:
        las = _get(m, "las", "jct_s", "avg")
        out.append(_at_most(f"avg JCT corral <= {LAS_FACTOR:g} x las", c_jct, _times(las, LAS_FACTOR),
                            f"corral {_h(c_jct)}, las {_h(las)}"
                            + (f" (ratio {c_jct / las:.3f})" if c_jct is not None and las else "")))
    c_wait, b_wait = (_get(m, p, "longest_wait_32plus_s") for p in ("corral", "fifo-backfill"))
    out.append(_at_most("longest >=32-GPU gang wait corral <= fifo-backfill", c_wait, b_wait,
                        f"corral {_h(c_wait)}, fifo-backfill {_h(b_wait)}"))
    most = _get(m, "corral", "preemptions_per_job", "max")
    out.append(_at_most(f"preemptions per job <= {MAX_PREEMPTIONS}", most, MAX_PREEMPTIONS,
                        f"max {_f(most, '{:.0f}')}, p99 {_f(_get(m, 'corral', 'preemptions_per_job', 'p99'), '{:.1f}')}"))
    lost = _get(m, "corral", "lost_to_preemption_fraction")
    lost_h, delivered = _get(m, "corral", "gpu_hours_lost_to_preemption"), _get(m, "corral", "gpu_hours_delivered")
    out.append(_at_most(f"GPU-h lost to preemption <= {LOST_SHARE:.0%} of delivered", lost, LOST_SHARE,
                        f"{_f(lost_h, '{:.0f}')} of {_f(delivered, '{:.0f}')} GPU-h ({_f(lost, '{:.2%}')})"))
    c, d = _get(m, "corral", "share_error", "worst"), _get(m, "drf", "share_error", "worst")
    out.append(_at_most(f"share error (worst queue) corral <= drf + {SHARE_SLACK:g}", c,
                        None if d is None else d + SHARE_SLACK, f"corral {_f(c)}, drf {_f(d)}"))
    return out


def isolated_scenario(jobs: int, seed: int, load: float) -> Scenario:
    """The standard trace on a cluster whose teams are isolated (limit = guarantee = an equal split), without
    time limits: issue #29's acceptance 3."""
    base = standard_cluster(NODES, GPUS_PER_NODE, QUEUES, guarantee_share=1.0)
    cluster = base._replace(queues=tuple(q._replace(limit_gpus=q.guaranteed_gpus) for q in base.queues))
    trace = generate(cluster, GenConfig(jobs=jobs, seed=seed, load=load))
    anonymous = tuple(j._replace(time_limit=None) for j in trace.jobs)
    return Scenario(tuple(setup_events(cluster)), tuple(sim_jobs(anonymous, cluster)), trace.outages)


def verdict(met: bool | None) -> str:
    return {True: "MET", False: "NOT MET", None: "n/a"}[met]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--loads", default="0.5,0.8,1.0,1.2", help="offered loads, comma-separated (default %(default)s)")
    p.add_argument("--policies", default=",".join(POLICY_NAMES), help="policies to run at each load (default all)")
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--isolated", action="store_true", help="issue #29 acceptance 3: limit = guarantee, no time limits")
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
    make = isolated_scenario if args.isolated else scenario
    scenarios = {load: make(args.jobs, args.seed, load) for load in loads}
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
        found = checks(run, isolated=args.isolated)
        for c in found:
            print(f"load {name}: {c.name}: {verdict(c.met)} ({c.measured})")
        results[name] = {c.name: c.met for c in found}
    print("\n== sweep ==")
    print(swept.table)
    every = [met for r in results.values() for met in r.values()]
    print(f"\nacceptance (#29): {sum(1 for m in every if m)} of {len(every)} checks MET, "
          f"{sum(1 for m in every if m is False)} NOT MET, {sum(1 for m in every if m is None)} n/a")
    print(json.dumps({"mode": "sweep", "jobs": args.jobs, "nodes": NODES, "gpus": NODES * GPUS_PER_NODE,
                      "queues": QUEUES, "seed": args.seed, "isolated": args.isolated, "machine": machine(),
                      **swept.figures, "acceptance": results}, allow_nan=False))


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
