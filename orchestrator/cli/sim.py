"""`corral sim` and `corral sim gen`: the parsers, and handlers that import the simulator only when run.

Every `corral` start builds every command's parser (`corral --help`, `corral jobs`), so this module
imports nothing of the simulator library (orchestrator.sim), the core it drives or matplotlib: the
handlers import `orchestrator.cli.simrun`, which does the work, when `corral sim` actually runs.
`main(argv)` is the command alone (`python -m orchestrator.sim`, the tests).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from orchestrator.cli.timespec import seconds_arg


class SimHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Fills "{policies}" in an option's help with the simulator's policy names, when the help is shown
    (`corral sim --help`): building the parser, which every `corral` start does, must not import the library."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = super()._get_help_string(action)
        if text is not None and "{policies}" in text:
            from orchestrator.sim.baselines import POLICY_NAMES

            text = text.replace("{policies}", ", ".join(POLICY_NAMES))
        return text



SIM_HELP = """\
Replay a workload trace against the production scheduler core (evolve/decide) on a
virtual clock, under one or more policies, and report scheduling quality: JCT,
queueing delay, GPU allocation, fair share per queue, preemption cost.

Trace CSV: a header naming job_id,submit_time,duration,num_gpus,queue (any order), optionally
  priority (higher first, may preempt lower; default 0), preemptible (default true),
  gpu_model, topology (a level: leaf = prefer one leaf, leaf:require = only inside one; none),
  time_limit (the user's estimate backfill plans with). Times in seconds.
Outages CSV header: node_id,time,duration (empty duration: the node never returns).
Cluster YAML: nodes, gpus_per_node, gpu_model, topology levels with sizes, queues
  (name, weight, guaranteed_gpus, limit_gpus, parent). Without `queues:` every queue name
  of the trace is a queue of its own (weight 1, no guarantee, no limit), as on a real
  cluster with no queue defined. Jobs a queue's limit_gpus (or the cluster) can never hold
  are trace errors; jobs the scheduler rejects at run time (--from-log) are counted as rejected.

Writes into --out: events-<policy>.jsonl (the log, one event per line, foldable by any
corral reader: `corral explain --log FILE JOB`, `corral replay --log FILE --at +3d`),
metrics.json, table.txt and PNG figures; the logs and figures an earlier run left there
and this one does not rewrite are removed, other files are left alone.
Load sweep (--load 0.5,0.8,1.0,1.2): every policy at each offered load -- the GPU-seconds the
  jobs would run while they arrive, had each started on arrival, over the GPUs x that window.
  Only the arrival rate changes, never the cluster: --generate makes its trace at each load (same
  seed, same jobs); a --trace or --from-log workload has its arrival times scaled about the first
  arrival to each load (node outages keep their times; a load the jobs cannot reach however closely
  they arrive is an error). Into --out: load-<L>/ per load with what a single run writes, and
  metrics.json (each load's figures, each policy's figures over the loads), table.txt and figures
  of avg JCT, total wait and share error against load (sweep_*.png).
Datasets (trace columns datasets "name:GB;..." and locality prefer|require, or `sim gen --datasets K`):
  each node stages a gang's datasets before its ranks start, at --staging-gbps, into a cache of
  --cache-gb (LRU); staging counts in JCT and gets its own rows. --locality-compare runs the policy
  with and without placement's preference for nodes that hold the datasets.
Examples, the columns and the table's rows: the README, section "Simulating a workload".
"""

GEN_HELP = """\
Generate a synthetic trace: Poisson arrivals with a daily cycle, heavy-tailed durations
(bigger gangs run longer), mostly 1-GPU jobs with most GPU-time in 8-128 GPU gangs, teams
with different loads, spread so that the cluster carries the requested offered load while
the jobs arrive. Too few jobs for the cluster cannot carry that load at all: they are
spread by their total work instead, and a note says so. Deterministic for a seed.
"""


def register(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "sim", help="simulate a workload trace under scheduling policies (virtual clock)",
        description=SIM_HELP, formatter_class=SimHelpFormatter)
    p.add_argument("--trace", metavar="FILE", help="jobs CSV (see above)")
    p.add_argument("--outages", metavar="FILE", help="node outages CSV")
    p.add_argument("--cluster", metavar="SPEC", help="cluster spec YAML (optional with --from-log)")
    p.add_argument("--from-log", metavar="FILE", dest="from_log",
                   help="re-run the JobSubmitted events of an event-log file (its cluster too, unless --cluster): "
                        "a simulation's events-<policy>.jsonl, or a cluster's log exported with "
                        "`corral tail --no-follow --json > FILE`")
    p.add_argument("--from-cluster", action="store_true", dest="from_cluster",
                   help="re-run the running cluster's whole log, read from NATS (the global --nats; with the "
                        "global --archive PATH also what retention dropped from the stream), written to "
                        "OUT/cluster-log.jsonl (line N is log position N) and read as --from-log")
    p.add_argument("--policy", default="corral", metavar="LIST",
                   help="comma-separated policies ({policies}), or 'all' alone for every one; default %(default)s")
    p.add_argument("--out", metavar="DIR", type=Path, default=Path("sim-out"),
                   help="output directory, created if needed; a rerun replaces what it writes there and removes "
                        "the logs and figures of an earlier run it does not rewrite (default %(default)s)")
    p.add_argument("--checkpoint-interval", metavar="S", type=seconds_arg, default=1800.0, dest="checkpoint_interval",
                   help="seconds of work between checkpoints; 0: checkpoint on the preemption signal (default %(default)s)")
    p.add_argument("--restart-overhead", metavar="S", type=seconds_arg, default=120.0, dest="restart_overhead",
                   help="seconds a restarted attempt spends before making progress (default %(default)s)")
    p.add_argument("--log-checkpoints", action=argparse.BooleanOptionalAction, default=True, dest="log_checkpoints",
                   help="the simulated agents log every periodic checkpoint (Checkpointed), as real agents do, so "
                        "victim choice sees what a stop would lose (the default); --no-log-checkpoints logs one "
                        "only when a job is stopped, as round 2's simulator did")
    p.add_argument("--generate", metavar="JOBS", type=int,
                   help="instead of --trace: a generated trace of JOBS jobs (as `sim gen` makes it, --seed) for "
                        "--cluster SPEC, or without it `sim gen`'s standard cluster (352 x 8 GPUs, 11 teams); "
                        "at `sim gen`'s default load, or at each --load")
    p.add_argument("--seed", type=int, help="with --generate: the trace's seed (default 1)")
    p.add_argument("--load", metavar="LIST",
                   help="a load sweep: comma-separated offered loads (fractions of the GPUs while the jobs arrive), "
                        "e.g. 0.5,0.8,1.0,1.2; every policy runs at each (see above)")
    p.add_argument("--no-logs", action="store_true", help="do not write the event logs (faster)")
    p.add_argument("--no-figures", action="store_true", help="do not draw PNG figures")
    p.add_argument("--strict", action="store_true", help="check the safety invariants at every instant (slow)")
    p.add_argument("--json", action="store_true", help="print one JSON object with the key figures instead of the table")
    p.add_argument("--staging-gbps", type=float, default=1.0, dest="staging_gbps", metavar="GBPS",
                   help="each node's dataset staging bandwidth, GB/s (default %(default)s)")
    p.add_argument("--cache-gb", type=float, default=1000.0, dest="cache_gb", metavar="GB",
                   help="each node's dataset cache size, GB; least recently used unused datasets are evicted; "
                        "0: unbounded (default %(default)s)")
    p.add_argument("--no-locality", action="store_true", dest="no_locality",
                   help="placement ignores which nodes hold a job's datasets (the warm-node preference off)")
    p.add_argument("--locality-compare", action="store_true", dest="locality_compare",
                   help="run the first --policy with and without the warm-node preference and print both, with "
                        "the JCT and staging figures side by side")
    p.set_defaults(handler=run_handler)
    sub = p.add_subparsers(dest="sim_command", metavar="SUBCOMMAND")
    g = sub.add_parser("gen", help="generate a synthetic trace", description=GEN_HELP,
                       formatter_class=SimHelpFormatter)
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
    g.add_argument("--gpu-faults", type=int, default=0, dest="gpu_faults", metavar="N",
                   help="N GPU faults (one GPU of one node each) at random times; rows of --outages-out with a gpu "
                        "column (default %(default)s)")
    g.add_argument("--gpu-fault-hours", type=float, default=4.0, dest="gpu_fault_hours", metavar="H",
                   help="median hours a faulty GPU stays out of service (default %(default)s)")
    g.add_argument("--datasets", type=int, default=0, metavar="K",
                   help="jobs train on datasets drawn from a shared pool of K (popular ones more often, so caches "
                        "are reused); 0: none (default %(default)s)")
    g.add_argument("--dataset-gb", type=float, default=100.0, dest="dataset_gb", metavar="GB",
                   help="median size of a pool dataset in GB (default %(default)s)")
    g.add_argument("--dataset-share", type=float, default=1.0, dest="dataset_share", metavar="P",
                   help="share of the jobs that train on a dataset (default %(default)s)")
    g.add_argument("--locality", choices=("prefer", "require"), default="prefer",
                   help="the jobs' dataset locality (default %(default)s)")
    g.add_argument("--outages-out", metavar="FILE", type=Path, dest="outages_out",
                   help="outages CSV to write (required with --node-mtbf-days: the trace holds only jobs)")
    g.set_defaults(handler=gen_handler)
    return p


async def run_handler(args: argparse.Namespace) -> int:
    from orchestrator.cli import simrun

    if args.from_cluster:
        from orchestrator.cli.archive import export_log
        from orchestrator.cli.errors import USAGE, CliError

        given = [f for f, v in (("--from-log", args.from_log), ("--trace", args.trace), ("--generate", args.generate))
                 if v]
        if given:
            raise CliError(f"--from-cluster is the workload: give it without {' and '.join(given)}", USAGE)
        args.from_log = str(await export_log(args, args.out / "cluster-log.jsonl"))
    return simrun.run(args)


async def gen_handler(args: argparse.Namespace) -> int:
    from orchestrator.cli import simrun

    return simrun.gen(args)


def main(argv: list[str] | None = None) -> int:
    """`corral sim ARGV` without the rest of the CLI; the exit code (argparse's usage errors exit 2)."""
    from orchestrator.cli import Parser

    parser = Parser(prog="corral")
    register(parser.add_subparsers(dest="command", metavar="COMMAND", required=True))
    args = parser.parse_args(["sim", *(sys.argv[1:] if argv is None else argv)])
    code: int = asyncio.run(args.handler(args))
    return code
