"""What `corral sim` and `corral sim gen` do: read the inputs, run the simulator, print and write the results.

Imported only when one of them runs (orchestrator/cli/sim.py holds their parsers): this module pulls in
the simulator library and, through it, the scheduler core. The simulation is synchronous CPU work.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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
from orchestrator.sim.gen import LOAD_TOLERANCE, GenConfig, generate, standard_cluster, window_load
from orchestrator.sim.replay import LoggedScenario, from_log
from orchestrator.sim.runs import headline, json_ready, run_policies
from orchestrator.sim.specs import sim_jobs, unfit_jobs
from orchestrator.sim.sweep import SweepReport, at_load, load_name, offered_load, parse_loads, run_label, run_sweep
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
    cluster = _cluster(args)
    if args.from_log:
        return _logged(args.from_log, cluster)
    if not args.trace or cluster is None:
        raise ValueError("give --trace FILE and --cluster SPEC (or --from-log FILE, or --generate JOBS)")
    return _traced(load_trace(args.trace, args.outages), cluster, args.outages)


def _cluster(args: argparse.Namespace) -> ClusterSpec | None:
    """--cluster's spec (None without it), its warnings said on stderr."""
    cluster = load_cluster(args.cluster) if args.cluster else None
    for w in cluster_warnings(cluster) if cluster is not None else []:
        _warn(f"{args.cluster}: {w}")
    return cluster


def single_scenario(args: argparse.Namespace) -> Scenario:
    """A single run's scenario: generated at `sim gen`'s default load (--generate), or what scenario_of reads."""
    if args.generate is None:
        return _given(args)
    return _generated(_gen_cluster(args), args, GenConfig().load)


def sweep_scenarios(args: argparse.Namespace, loads: Sequence[float]) -> dict[float, Scenario]:
    """The scenario of each load (orchestrator/sim/sweep.py): generated at the load (--generate), or the
    workload of --trace / --from-log with its arrivals scaled to it. Every load is made before any runs, so a
    load out of the workload's reach is told at once."""
    if args.generate is not None:
        cluster = _gen_cluster(args)
        made = {load: _generated(cluster, args, load) for load in loads}
        for load, scenario in made.items():
            if abs((offered := offered_load(scenario)) - load) > LOAD_TOLERANCE * load:
                _warn(f"load {load_name(load)}: {args.generate} jobs offer {offered:.3f}: too few to keep "
                      f"{cluster.total_gpus} GPUs that busy while they arrive (more --generate jobs, or a smaller "
                      "--cluster)")
        return made
    base = _given(args)
    return {load: at_load(base, load) for load in loads}


def _given(args: argparse.Namespace) -> Scenario:
    """The workload of --trace or --from-log (scenario_of); --seed is for --generate only."""
    if args.seed is not None:
        raise ValueError("--seed goes with --generate JOBS (a trace file or a log has its arrivals already)")
    return scenario_of(args)


def _gen_cluster(args: argparse.Namespace) -> ClusterSpec:
    """The cluster --generate makes its trace for: --cluster's, or `sim gen`'s standard one."""
    given = [flag for flag, v in (("--trace", args.trace), ("--from-log", args.from_log), ("--outages", args.outages))
             if v]
    if given:
        raise ValueError(f"--generate makes the workload: give it without {' and '.join(given)}")
    if args.generate < 1:
        raise ValueError(f"--generate needs at least 1 job, got {args.generate}")
    return _cluster(args) or standard_cluster()


def _generated(cluster: ClusterSpec, args: argparse.Namespace, load: float) -> Scenario:
    return _traced(generate(cluster, GenConfig(jobs=args.generate, load=load, seed=1 if args.seed is None else args.seed)), cluster, None)


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
    """Lines and jobs of the log the re-run does without: said on stderr, never silently (and which policy
    decided the log, where its elections name one: the run to compare the others with)."""
    if logged.decided_by:
        print(f"corral sim: {path}: decided live by policy {', '.join(logged.decided_by)} "
              "(`corral scheduler --policy`)", file=sys.stderr)
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
        loads = parse_loads(args.load) if args.load is not None else None
        if args.checkpoint_interval < 0 or args.restart_overhead < 0:
            raise ValueError("--checkpoint-interval and --restart-overhead must be >= 0")
        if not (args.staging_gbps > 0 and math.isfinite(args.staging_gbps)) or not (
                args.cache_gb >= 0 and math.isfinite(args.cache_gb)):
            raise ValueError(f"--staging-gbps must be > 0 and --cache-gb >= 0, got {args.staging_gbps} and "
                             f"{args.cache_gb}")
        if args.locality_compare and (loads is not None or args.no_locality):
            raise ValueError("--locality-compare runs one load with and without locality: give it without "
                             + ("--load" if loads is not None else "--no-locality"))
        scenarios = sweep_scenarios(args, loads) if loads is not None else {}
        scenario = single_scenario(args) if loads is None else next(iter(scenarios.values()))
        _out_dir(args.out)
    except (TraceError, ClusterSpecError, ValueError) as e:
        return _error(str(e))
    config = SimConfig(checkpoint_interval_s=args.checkpoint_interval, restart_overhead_s=args.restart_overhead,
                       log_checkpoints=args.log_checkpoints, strict=args.strict, staging_gbps=args.staging_gbps, cache_gb=args.cache_gb)
    if args.locality_compare:
        return _compare_locality(scenario, policies[0], config, args)
    quiet = args.json
    runs = [run_label(load, p) for load in scenarios for p in policies] if loads is not None else policies
    bar = None if quiet or not sys.stderr.isatty() else ProgressBar(runs, len(scenario.jobs))

    def progress(line: str) -> None:
        if bar is not None:
            bar.finished(line)
        elif not quiet:
            print(line, file=sys.stderr, flush=True)

    options: dict[str, Any] = {"write_logs": not args.no_logs, "figures": not args.no_figures, "progress": progress,
                               "advance": bar.advance if bar is not None else None, "prefer_warm": not args.no_locality}
    try:
        with bar if bar is not None else contextlib.nullcontext():
            if loads is None:
                report = run_policies(scenario, policies, config, args.out, **options)
            else:
                swept = run_sweep(scenarios, policies, config, args.out, **options)
    except SimulationError as e:
        print(f"corral sim: simulation failed: {e}", file=sys.stderr)
        return FAILURE
    if loads is not None:
        _print_sweep(swept, args)
    elif args.json:
        print(json.dumps(headline(report), allow_nan=False))
    else:
        print(report.table)
        print(f"\nwrote {', '.join(str(f) for f in report.files)}")
    return OK


def _compare_locality(scenario: Scenario, policy: str, config: SimConfig, args: argparse.Namespace) -> int:
    """`--locality-compare`: the policy with and without the warm-node preference (orchestrator/sim/locality.py)."""
    from orchestrator.sim.locality import compare_locality

    if not any(j.spec.dataset_list for j in scenario.jobs):
        _warn("no job of the workload has datasets: both runs are alike (trace column datasets, or "
              "`sim gen --datasets K`)")
    try:
        cmp = compare_locality(scenario, policy, config)
    except SimulationError as e:
        print(f"corral sim: simulation failed: {e}", file=sys.stderr)
        return FAILURE
    figures = cmp.figures()
    (args.out / "locality.json").write_text(json.dumps(json_ready(figures), indent=1, allow_nan=False))
    if args.json:
        print(json.dumps(json_ready(figures), allow_nan=False))
    else:
        print(cmp.table())
        print(f"\nwrote {args.out / 'locality.json'}")
    return OK


def _print_sweep(swept: SweepReport, args: argparse.Namespace) -> None:
    """Each load's table, then the sweep's (or the one JSON object of --json)."""
    if args.json:
        print(json.dumps(json_ready(swept.figures), allow_nan=False))
        return
    for r in swept.runs:
        print(f"load {load_name(r.load)} (offered {r.offered:.3f})")
        print(r.report.table)
        print()
    print("sweep")
    print(swept.table)
    top = [f for f in swept.files if f.parent == args.out]
    print(f"\nwrote {', '.join(str(f) for f in top)}, and each load's run in "
          f"{', '.join(str(args.out / f'load-{load_name(r.load)}') for r in swept.runs)}")


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
    if args.datasets < 0 or not (args.dataset_gb > 0 and math.isfinite(args.dataset_gb)) or not (
            0 <= args.dataset_share <= 1):
        out.append(f"--datasets must be >= 0, --dataset-gb > 0 and --dataset-share between 0 and 1, got "
                   f"{args.datasets}, {args.dataset_gb} and {args.dataset_share}")
    if args.gpu_faults < 0 or not args.gpu_fault_hours > 0:
        out.append(f"--gpu-faults must be >= 0 and --gpu-fault-hours > 0, got {args.gpu_faults} and "
                   f"{args.gpu_fault_hours}")
    elif args.gpu_faults > 0 and args.outages_out is None:
        out.append("--gpu-faults needs --outages-out FILE: GPU faults are rows of the outages CSV (with a gpu column)")
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
                                            node_mtbf_days=args.node_mtbf_days, gpu_faults=args.gpu_faults,
                                            gpu_fault_hours=args.gpu_fault_hours, datasets=args.datasets,
                                            dataset_gb=args.dataset_gb, dataset_share=args.dataset_share,
                                            locality=args.locality))
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
