"""`corral sim` and `corral sim gen`: argparse wiring for the simulator.

`register(subparsers)` adds the `sim` command to any argparse parser (the
`corral` CLI and `python -m orchestrator.sim` both use it); handlers are
`async def handler(args) -> int` stored with `set_defaults(handler=...)`.
The simulation itself is synchronous CPU work: the handlers just call it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from orchestrator.sim.baselines import POLICY_NAMES, parse_policies
from orchestrator.sim.cluster import ClusterSpecError, dump_cluster, load_cluster, setup_events
from orchestrator.sim.engine import Scenario, SimConfig, SimulationError
from orchestrator.sim.gen import GenConfig, generate, standard_cluster
from orchestrator.sim.replay import from_log
from orchestrator.sim.runs import headline, run_policies
from orchestrator.sim.specs import sim_jobs
from orchestrator.sim.trace import TraceError, load_trace, write_outages, write_trace

OK = 0
FAILED = 1
INVALID = 2

SIM_HELP = """\
Replay a workload trace against the production scheduler core (evolve/decide) on a
virtual clock, under one or more policies, and report scheduling quality: JCT,
queueing delay, GPU allocation, fair share per queue, preemption cost.

Trace CSV header: job_id,submit_time,duration,num_gpus,queue
  optional columns: priority,preemptible,gpu_model,topology,time_limit (seconds).
Outages CSV header: node_id,time,duration (empty duration: the node never returns).
Cluster YAML: nodes, gpus_per_node, gpu_model, topology levels with sizes, queues
  (name, weight, guaranteed_gpus, limit_gpus, parent); see orchestrator/sim/cluster.py.

Writes into --out: events-<policy>.jsonl (the log, one event per line, foldable by any
corral reader: `corral explain --log FILE JOB`, `corral replay --log FILE --at SEQ`),
metrics.json, table.txt and PNG figures.
"""

GEN_HELP = """\
Generate a synthetic trace: Poisson arrivals with a daily cycle, heavy-tailed durations
(bigger gangs run longer), mostly 1-GPU jobs with most GPU-time in 8-128 GPU gangs, teams
with different loads, spread so that the cluster carries the requested offered load while
the jobs arrive. Deterministic for a seed.
"""


def register(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "sim", help="simulate a workload trace under scheduling policies (virtual clock)",
        description=SIM_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", metavar="FILE", help="jobs CSV (see above)")
    p.add_argument("--outages", metavar="FILE", help="node outages CSV")
    p.add_argument("--cluster", metavar="SPEC", help="cluster spec YAML (optional with --from-log)")
    p.add_argument("--from-log", metavar="FILE", dest="from_log",
                   help="re-run the JobSubmitted events of an event-log file (its cluster too, unless --cluster): "
                        "a simulation's events-<policy>.jsonl, or a cluster's log exported with "
                        "`corral tail --no-follow --json > FILE`")
    p.add_argument("--policy", default="corral", metavar="LIST",
                   help=f"comma-separated policies or 'all' ({', '.join(POLICY_NAMES)}); default %(default)s")
    p.add_argument("--out", metavar="DIR", type=Path, default=Path("sim-out"),
                   help="output directory (default %(default)s)")
    p.add_argument("--checkpoint-interval", metavar="S", type=float, default=1800.0, dest="checkpoint_interval",
                   help="seconds of work between checkpoints; 0: checkpoint on the preemption signal (default %(default)s)")
    p.add_argument("--restart-overhead", metavar="S", type=float, default=120.0, dest="restart_overhead",
                   help="seconds a restarted attempt spends before making progress (default %(default)s)")
    p.add_argument("--no-logs", action="store_true", help="do not write the event logs (faster)")
    p.add_argument("--no-figures", action="store_true", help="do not draw PNG figures")
    p.add_argument("--strict", action="store_true", help="check the safety invariants at every instant (slow)")
    p.add_argument("--json", action="store_true", help="print one JSON object with the key figures instead of the table")
    p.set_defaults(handler=run_handler)
    sub = p.add_subparsers(dest="sim_command", metavar="SUBCOMMAND")
    g = sub.add_parser("gen", help="generate a synthetic trace", description=GEN_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    g.add_argument("--out", metavar="FILE", type=Path, required=True, help="trace CSV to write")
    g.add_argument("--cluster", metavar="SPEC", help="cluster spec YAML to size the load for")
    g.add_argument("--nodes", type=int, default=352, help="without --cluster: nodes (default %(default)s)")
    g.add_argument("--gpus-per-node", type=int, default=8, dest="gpus_per_node", help="default %(default)s")
    g.add_argument("--queues", type=int, default=11, help="without --cluster: teams (default %(default)s)")
    g.add_argument("--cluster-out", metavar="FILE", type=Path, dest="cluster_out",
                   help="write the cluster spec used (handy without --cluster)")
    g.add_argument("--jobs", type=int, default=20_000, help="default %(default)s")
    g.add_argument("--load", type=float, default=0.9, help="offered load, fraction of the GPUs (default %(default)s)")
    g.add_argument("--seed", type=int, default=1, help="default %(default)s")
    g.add_argument("--node-mtbf-days", type=float, default=0.0, dest="node_mtbf_days",
                   help="mean days between outages per node; 0: none (default %(default)s)")
    g.add_argument("--outages-out", metavar="FILE", type=Path, dest="outages_out",
                   help="outages CSV to write (with --node-mtbf-days)")
    g.set_defaults(handler=gen_handler)
    return p


def _error(msg: str) -> int:
    print(f"corral sim: error: {msg}", file=sys.stderr)
    return INVALID


def scenario_of(args: argparse.Namespace) -> Scenario:
    """The scenario the arguments describe; TraceError / ClusterSpecError / ValueError on bad input."""
    cluster = load_cluster(args.cluster) if args.cluster else None
    if args.from_log:
        logged = from_log(args.from_log, cluster)
        if logged.skipped:
            print(f"corral sim: {len(logged.skipped)} job(s) of the log have no known duration and are left out",
                  file=sys.stderr)
        return logged.scenario
    if not args.trace or cluster is None:
        raise ValueError("give --trace FILE and --cluster SPEC (or --from-log FILE)")
    trace = load_trace(args.trace, args.outages)
    nodes = {e.node_id for e in setup_events(cluster) if hasattr(e, "node_id")}
    bad = [f"{args.outages}:{o.line}: node {o.node_id!r} is not in the cluster" for o in trace.outages
           if o.node_id not in nodes]
    if bad:
        raise TraceError(bad)
    return Scenario(tuple(setup_events(cluster)), tuple(sim_jobs(trace.jobs, cluster, trace.source)), trace.outages)


async def run_handler(args: argparse.Namespace) -> int:
    try:
        policies = parse_policies(args.policy)
        if args.checkpoint_interval < 0 or args.restart_overhead < 0:
            raise ValueError("--checkpoint-interval and --restart-overhead must be >= 0")
        scenario = scenario_of(args)
    except (TraceError, ClusterSpecError, ValueError) as e:
        return _error(str(e))
    config = SimConfig(checkpoint_interval_s=args.checkpoint_interval, restart_overhead_s=args.restart_overhead,
                       strict=args.strict)
    quiet = args.json

    def progress(line: str) -> None:
        if not quiet:
            print(line, file=sys.stderr, flush=True)

    try:
        report = run_policies(scenario, policies, config, args.out, write_logs=not args.no_logs,
                              figures=not args.no_figures, progress=progress)
    except SimulationError as e:
        print(f"corral sim: simulation failed: {e}", file=sys.stderr)
        return FAILED
    if args.json:
        print(json.dumps(headline(report)))
    else:
        print(report.table)
        print(f"\nwrote {', '.join(str(f) for f in report.files)}")
    return OK


async def gen_handler(args: argparse.Namespace) -> int:
    try:
        cluster = load_cluster(args.cluster) if args.cluster else standard_cluster(
            args.nodes, args.gpus_per_node, args.queues)
        if args.jobs < 1 or args.load <= 0:
            raise ValueError("--jobs must be >= 1 and --load > 0")
        trace = generate(cluster, GenConfig(jobs=args.jobs, load=args.load, seed=args.seed,
                                            node_mtbf_days=args.node_mtbf_days))
    except (ClusterSpecError, ValueError) as e:
        return _error(str(e))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as f:
        write_trace(trace.jobs, f)
    wrote = [str(args.out)]
    if args.outages_out is not None:
        with args.outages_out.open("w", newline="") as f:
            write_outages(trace.outages, f)
        wrote.append(str(args.outages_out))
    if args.cluster_out is not None:
        args.cluster_out.write_text(dump_cluster(cluster))
        wrote.append(str(args.cluster_out))
    gpu_s = sum(j.num_gpus * j.duration for j in trace.jobs)
    span = trace.jobs[-1].submit_time - trace.jobs[0].submit_time
    print(f"{len(trace.jobs)} jobs over {span / 86400:.2f} days, {gpu_s / 3600:.0f} GPU-hours asked for "
          f"({cluster.total_gpus} GPUs), {len(trace.outages)} outages; wrote {', '.join(wrote)}")
    return OK
