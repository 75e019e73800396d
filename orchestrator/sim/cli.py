"""`corral sim` and `corral sim gen`: argparse wiring for the simulator.

`register(subparsers)` adds the `sim` command to any argparse parser (the
`corral` CLI and `python -m orchestrator.sim` both use it); handlers are
`async def handler(args) -> int` stored with `set_defaults(handler=...)`.
The simulation itself is synchronous CPU work: the handlers just call it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.cli.errors import FAILURE, NOT_FOUND, OK, USAGE
from orchestrator.cli.output import human_duration
from orchestrator.sim.baselines import POLICY_NAMES, parse_policies
from orchestrator.sim.cluster import (
    ClusterSpec,
    ClusterSpecError,
    cluster_warnings,
    dump_cluster,
    load_cluster,
    setup_events,
)
from orchestrator.sim.engine import Scenario, SimConfig, SimulationError
from orchestrator.sim.gen import GenConfig, generate, standard_cluster, window_load
from orchestrator.sim.replay import LoggedScenario, from_log
from orchestrator.sim.runs import headline, run_policies
from orchestrator.sim.specs import sim_jobs, unfit_jobs
from orchestrator.sim.trace import Trace, TraceError, load_trace, write_outages, write_trace

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
        description=SIM_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", metavar="FILE", help="jobs CSV (see above)")
    p.add_argument("--outages", metavar="FILE", help="node outages CSV")
    p.add_argument("--cluster", metavar="SPEC", help="cluster spec YAML (optional with --from-log)")
    p.add_argument("--from-log", metavar="FILE", dest="from_log",
                   help="re-run the JobSubmitted events of an event-log file (its cluster too, unless --cluster): "
                        "a simulation's events-<policy>.jsonl, or a cluster's log exported with "
                        "`corral tail --no-follow --json > FILE`")
    p.add_argument("--policy", default="corral", metavar="LIST",
                   help=f"comma-separated policies ({', '.join(POLICY_NAMES)}), or 'all' alone for every one; "
                        "default %(default)s")
    p.add_argument("--out", metavar="DIR", type=Path, default=Path("sim-out"),
                   help="output directory, created if needed; a rerun replaces what it writes there and removes "
                        "the logs and figures of an earlier run it does not rewrite (default %(default)s)")
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
                   help="outages CSV to write (required with --node-mtbf-days: the trace holds only jobs)")
    g.set_defaults(handler=gen_handler)
    return p


def _error(msg: str, code: int = USAGE) -> int:
    print(f"corral sim: error: {msg}", file=sys.stderr)
    return code


def _warn(msg: str) -> None:
    print(f"corral sim: warning: {msg}", file=sys.stderr)


def _missing(*paths: tuple[str, str | Path | None]) -> str | None:
    """The first input file that does not exist, as "--flag FILE: no such file" (exit 4, as for `--log`)."""
    for flag, path in paths:
        if path is not None and not Path(path).exists():
            return f"{flag} {path}: no such file"
    return None


def scenario_of(args: argparse.Namespace) -> Scenario:
    """The scenario the arguments describe; TraceError / ClusterSpecError / ValueError on bad input."""
    if args.trace and args.from_log:
        raise ValueError("give --trace FILE or --from-log FILE, not both")
    cluster = load_cluster(args.cluster) if args.cluster else None
    for w in cluster_warnings(cluster) if cluster is not None else []:
        _warn(f"{args.cluster}: {w}")
    if args.from_log:
        return _logged(args.from_log, cluster)
    if not args.trace or cluster is None:
        raise ValueError("give --trace FILE and --cluster SPEC (or --from-log FILE)")
    return _traced(load_trace(args.trace, args.outages), cluster, args.outages)


def _traced(trace: Trace, cluster: ClusterSpec, outages: str | None) -> Scenario:
    nodes = {e.node_id for e in setup_events(cluster) if hasattr(e, "node_id")}
    bad = [f"{outages}:{o.line}: node {o.node_id!r} is not in the cluster" for o in trace.outages
           if o.node_id not in nodes]
    if bad:
        raise TraceError(bad)
    return Scenario(tuple(setup_events(cluster)), tuple(sim_jobs(trace.jobs, cluster, trace.source)), trace.outages)


def _logged(path: str, cluster: ClusterSpec | None) -> Scenario:
    """The log's jobs; with a cluster spec, checked against it as a trace's are (the log's own cluster ran them)."""
    logged = from_log(path, cluster)
    _tell_left_out(path, logged)
    if cluster is not None:
        bad = unfit_jobs(logged.scenario.jobs, cluster, path)
        if bad:
            raise TraceError(bad)
    return logged.scenario


def _tell_left_out(path: str, logged: LoggedScenario) -> None:
    """Lines and jobs of the log the re-run does without: said on stderr, never silently."""
    if logged.unreadable:
        lines = ", ".join(str(n) for n in logged.unreadable[:5]) + (", ..." if len(logged.unreadable) > 5 else "")
        _warn(f"{path}: {len(logged.unreadable)} line(s) are not events this version reads (corrupt JSON or a "
              f"newer event type), left out of the re-run: line {lines}")
    if logged.skipped:
        _warn(f"{path}: {len(logged.skipped)} job(s) of the log have no known duration and are left out")


def _out_dir(path: Path) -> None:
    """Create --out; ValueError (a usage error) when it cannot be a directory."""
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out {path}: is a file, not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--out {path}: cannot create the directory: {e.strerror or e}") from None


def _missing_extra(args: argparse.Namespace) -> str | None:
    """The install hint when the figures are wanted and matplotlib (the `sim` extra) is not installed."""
    if args.no_figures or importlib.util.find_spec("matplotlib") is not None:
        return None
    return "the figures need matplotlib, which is not installed: pip install 'corral[sim]' (or pass --no-figures)"


async def run_handler(args: argparse.Namespace) -> int:
    if hint := _missing_extra(args):
        return _error(hint)
    missing = _missing(("--trace", args.trace), ("--outages", args.outages), ("--cluster", args.cluster),
                       ("--from-log", args.from_log))
    if missing:
        return _error(missing, NOT_FOUND)
    try:
        policies = parse_policies(args.policy)
        if args.checkpoint_interval < 0 or args.restart_overhead < 0:
            raise ValueError("--checkpoint-interval and --restart-overhead must be >= 0")
        scenario = scenario_of(args)
        _out_dir(args.out)
    except (TraceError, ClusterSpecError, ValueError) as e:
        return _error(str(e))
    config = SimConfig(checkpoint_interval_s=args.checkpoint_interval, restart_overhead_s=args.restart_overhead,
                       strict=args.strict)
    quiet = args.json
    bar = None if quiet or not sys.stderr.isatty() else ProgressBar(policies, len(scenario.jobs))

    def progress(line: str) -> None:
        if bar is not None:
            bar.finished(line)
        elif not quiet:
            print(line, file=sys.stderr, flush=True)

    try:
        with bar if bar is not None else contextlib.nullcontext():
            report = run_policies(scenario, policies, config, args.out, write_logs=not args.no_logs,
                                  figures=not args.no_figures, progress=progress,
                                  advance=bar.advance if bar is not None else None)
    except SimulationError as e:
        print(f"corral sim: simulation failed: {e}", file=sys.stderr)
        return FAILURE
    if args.json:
        print(json.dumps(headline(report), allow_nan=False))
    else:
        print(report.table)
        print(f"\nwrote {', '.join(str(f) for f in report.files)}")
    return OK


class ProgressBar:
    """A rich progress bar on stderr (a terminal only: piped stderr gets the plain lines): one row per
    policy, jobs finished of all, jobs/s; each policy's summary line prints above the bars when it ends."""

    def __init__(self, policies: Sequence[str], jobs: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            TextColumn("{task.description:>13}"), BarColumn(), MofNCompleteColumn(), TextColumn("jobs"),
            TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
            console=Console(stderr=True), transient=True)
        self.tasks = {p: self.progress.add_task(p, total=jobs, start=False, rate="") for p in policies}
        self._started: dict[str, float] = {}  # policy -> when its first job finished (time.monotonic)

    def __enter__(self) -> ProgressBar:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def advance(self, policy: str, done: int) -> None:
        task = self.tasks[policy]
        now = time.monotonic()
        if policy not in self._started:
            self._started[policy] = now
            self.progress.start_task(task)
        elapsed = now - self._started[policy]
        rate = f"{done / elapsed:,.0f} jobs/s" if elapsed > 0 else ""
        self.progress.update(task, completed=done, rate=rate)

    def finished(self, line: str) -> None:
        self.progress.console.print(line, highlight=False, markup=False)


def _gen_problems(args: argparse.Namespace) -> list[str]:
    """What `sim gen` cannot make a trace of (each would crash, or write nothing useful)."""
    out = []
    if not args.cluster:
        out += [f"--{flag} must be >= 1, got {v}" for flag, v in
                (("nodes", args.nodes), ("gpus-per-node", args.gpus_per_node), ("queues", args.queues)) if v < 1]
    if args.jobs < 1:
        out.append(f"--jobs must be >= 1, got {args.jobs}")
    if not args.load > 0:
        out.append(f"--load must be > 0, got {args.load}")
    if args.node_mtbf_days < 0:
        out.append(f"--node-mtbf-days must be >= 0, got {args.node_mtbf_days}")
    elif args.node_mtbf_days > 0 and args.outages_out is None:
        out.append("--node-mtbf-days needs --outages-out FILE: the trace CSV holds only jobs, the outages go "
                   "to their own file (then `corral sim --outages FILE`)")
    return out


async def gen_handler(args: argparse.Namespace) -> int:
    if args.cluster and (missing := _missing(("--cluster", args.cluster))):
        return _error(missing, NOT_FOUND)
    try:
        problems = _gen_problems(args)
        if problems:
            raise ValueError("; ".join(problems))
        cluster = load_cluster(args.cluster) if args.cluster else standard_cluster(
            args.nodes, args.gpus_per_node, args.queues)
        trace = generate(cluster, GenConfig(jobs=args.jobs, load=args.load, seed=args.seed,
                                            node_mtbf_days=args.node_mtbf_days))
    except (ClusterSpecError, ValueError) as e:
        return _error(str(e))
    try:
        wrote = _write_gen(args, cluster, trace)
    except FileExistsError as e:  # mkdir of the parent: it is a file
        return _error(f"cannot write into {e.filename}: it is a file, not a directory")
    except NotADirectoryError as e:
        return _error(f"cannot write {e.filename}: a directory on its path is a file")
    except OSError as e:
        return _error(f"cannot write {e.filename}: {e.strerror or e}")
    gpu_s = sum(j.num_gpus * j.duration for j in trace.jobs)
    span = trace.jobs[-1].submit_time - trace.jobs[0].submit_time
    load = window_load(trace, cluster.total_gpus)
    print(f"{len(trace.jobs)} jobs over {human_duration(span)}, {gpu_s / 3600:.0f} GPU-hours asked for "
          f"({cluster.total_gpus} GPUs, {100 * load:.0f}% busy while they arrive), {len(trace.outages)} outages; "
          f"wrote {', '.join(wrote)}")
    if len(trace.jobs) > 1 and abs(load - args.load) > 0.05 * args.load:
        print(f"note: {len(trace.jobs)} jobs are too few to keep {cluster.total_gpus} GPUs {100 * args.load:.0f}% "
              f"busy while they arrive; they are spread so that their total work is that load over the span "
              f"instead. More --jobs, or a smaller cluster (--nodes), give the usual spread.", file=sys.stderr)
    return OK


def _write_gen(args: argparse.Namespace, cluster: ClusterSpec, trace: Trace) -> list[str]:
    """Write the trace (and outages, cluster spec) where asked; the paths written."""
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
    return wrote
