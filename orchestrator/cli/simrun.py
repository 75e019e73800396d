"""What `corral sim` and `corral sim gen` do: read the inputs, run the simulator, print and write the results.

Imported only when one of them runs (orchestrator/cli/sim.py holds their parsers): this module pulls in
the simulator library and, through it, the scheduler core. The simulation is synchronous CPU work.
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

from orchestrator.cli.errors import FAILURE, NOT_FOUND, OK, USAGE
from orchestrator.cli.output import human_duration
from orchestrator.sim.baselines import parse_policies
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


def run(args: argparse.Namespace) -> int:
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


def gen(args: argparse.Namespace) -> int:
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
