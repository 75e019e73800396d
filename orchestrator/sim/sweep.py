"""A load sweep (#20): one workload at several offered loads, every policy at each, and the figures against load.

The offered load is `gen.window_load`'s: the GPU-seconds the jobs would run
inside their arrival window if each started on arrival, over the cluster's
GPUs x the window. A sweep changes the arrival rate, never the cluster: the
jobs (sizes, durations, queues) and the cluster (topology, guarantees, limits)
stay what they are, so the runs differ only in how fast the work comes.
(Scaling the cluster instead would change which gangs fit where and what a
guarantee is worth: another experiment.)

* A generated trace is generated at each load (`GenConfig(load=L)`): the same
  seed gives the same jobs, on the same arrival pattern stretched to the load.
* A given workload (a trace file, a log) has its arrival times scaled about
  the first arrival by the factor that gives it load L (`at_load`). Node
  outages keep their times: hardware does not fail faster when work comes
  faster. A workload whose jobs are long against its arrival window cannot
  reach every load however closely its jobs arrive: that is an error, with
  the most it can carry. Its daily cycle is scaled with it, where the
  generator keeps a day a day long: a generated trace swept from a file
  does not run exactly as the same seed generated at each load.

Into the output directory: `load-<L>/` per load, with what a single run
writes (`runs.run_policies`); `metrics.json` with every load's key figures and
each policy's figures as lists over the loads; `table.txt` (each load's table,
then the sweep's); and the figures against load (`SWEEP_FIGURES`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from orchestrator.sim.baselines import POLICY_NAMES
from orchestrator.sim.engine import Scenario, SimConfig
from orchestrator.sim.gen import arrival_load
from orchestrator.sim.runs import FIGURES, Report, headline, json_ready, run_policies
from orchestrator.sim.table import ROWS, Row, json_figures
from schemas.events import NodeRegistered

#: The figures drawn against load, one line per policy: file name, the figure's key (table.ROWS), y label, and
#: whether its axis is logarithmic (hours: FIFO's waits are tens of times the others').
SWEEP_FIGURES: tuple[tuple[str, str, str, bool], ...] = (
    ("sweep_avg_jct.png", "avg_jct_h", "avg JCT (h)", True),
    ("sweep_total_wait.png", "avg_total_wait_h", "avg total wait (h)", True),
    ("sweep_share_error.png", "share_error_mean", "share error, mean queue", False),
)
#: The sweep table's columns: a short header and the figure's key in table.ROWS (its format and scale).
SWEEP_COLUMNS: tuple[tuple[str, str], ...] = (
    ("avg JCT h", "avg_jct_h"),
    ("p95 JCT h", "p95_jct_h"),
    ("avg wait h", "avg_total_wait_h"),
    ("share err mean", "share_error_mean"),
    ("share err worst", "share_error_worst"),
    ("alloc %", "mean_alloc"),
    ("max preempt/job", "preemptions_per_job_max"),
    ("lost %", "lost_preemption_fraction"),
    ("longest >=32 wait h", "longest_wait_32plus_h"),
)
#: Loads a sweep accepts: above 0, and not beyond what any cluster could be asked to carry.
MAX_LOAD = 100.0
#: Relative distance from the asked load below which the scale factor search stops.
SCALE_TOLERANCE = 1e-6


class LoadRun(NamedTuple):
    #: The load asked for.
    load: float
    #: The load the run's workload offers, measured (`gen.window_load`).
    offered: float
    report: Report


class SweepReport(NamedTuple):
    runs: tuple[LoadRun, ...]
    table: str
    #: What metrics.json holds (and `--json` prints): see `sweep_figures`.
    figures: dict[str, Any]
    files: tuple[Path, ...]


def parse_loads(text: str) -> list[float]:
    """"0.5,0.8,1,1.2" -> [0.5, 0.8, 1.0, 1.2], in the order given; ValueError naming what is wrong."""
    parts = [p.strip() for p in text.split(",")]
    if not any(parts):
        raise ValueError("--load needs one or more offered loads, e.g. --load 0.5,0.8,1.0,1.2")
    loads: list[float] = []
    for part in parts:
        if not part:
            raise ValueError(f"--load: an empty item in {text!r} (give loads like 0.5,0.8,1.0,1.2)")
        try:
            v = float(part)
        except ValueError:
            raise ValueError(f"--load: {part!r} is not a number (give loads like 0.5,0.8,1.0,1.2)") from None
        if not math.isfinite(v) or v <= 0 or v > MAX_LOAD:
            raise ValueError(f"--load: each load must be a number > 0 and <= {MAX_LOAD:g} (a fraction of the "
                             f"cluster's GPUs), got {part!r}")
        if v in loads:
            raise ValueError(f"--load: {part} is given twice")
        loads.append(v)
    return loads


def load_name(load: float) -> str:
    """How a load is written in file names and JSON keys: 0.8 -> "0.8", 1.0 -> "1"."""
    return f"{load:g}"


def run_label(load: float, policy: str) -> str:
    """"0.8 corral": a run of a sweep, as progress lines and bars name it."""
    return f"{load_name(load)} {policy}"


def scenario_gpus(scenario: Scenario) -> int:
    """GPUs the scenario's cluster registers before the first job."""
    return sum(len(e.inventory.gpus) for e in scenario.setup if isinstance(e, NodeRegistered))


def offered_load(scenario: Scenario) -> float:
    """The load the scenario's jobs offer its cluster while they arrive (`gen.window_load`)."""
    return arrival_load([(j.submit_time, j.duration, j.gpus) for j in scenario.jobs], scenario_gpus(scenario))


def at_load(scenario: Scenario, load: float) -> Scenario:
    """The scenario with its arrival times scaled about the first arrival so that it offers `load`.

    Arrival times are kept to the millisecond, as generated traces' are. ValueError when no scale reaches the
    load (module docstring), or the jobs all arrive at one instant (no arrival rate to scale).
    """
    jobs, gpus = scenario.jobs, scenario_gpus(scenario)
    if not jobs or gpus <= 0:
        raise ValueError("a sweep needs jobs and a cluster with GPUs")
    t0 = min(j.submit_time for j in jobs)
    rel = [(j.submit_time - t0, j.duration, j.gpus) for j in jobs]
    span = max(r for r, _, _ in rel)
    if span <= 0:
        raise ValueError("the jobs all arrive at one instant: there is no arrival rate to scale to a load")

    def load_at(k: float) -> float:
        return arrival_load([(k * r, d, g) for r, d, g in rel], gpus)

    # Squeezed until the shortest job outlasts the window, every job runs to the window's end: the most the
    # arrivals can offer. Below that, the load falls as the window stretches (k grows), so bisect on k.
    shortest = min((d for _, d, _ in rel if d > 0), default=0.0)
    k_lo = shortest / span
    most = load_at(k_lo) if k_lo > 0 else 0.0
    if load >= most * (1 - SCALE_TOLERANCE):
        raise ValueError(f"load {load_name(load)} is out of reach for these jobs on {gpus} GPUs: however closely "
                         f"they arrive, their arrival window carries at most {most:.3g} (now {load_at(1.0):.3g})")
    if abs(load_at(1.0) - load) <= SCALE_TOLERANCE * load:
        return scenario
    k_hi = 1.0
    while load_at(k_hi) > load:
        k_lo, k_hi = k_hi, 2 * k_hi
    k = k_hi
    for _ in range(200):
        k = math.sqrt(k_lo * k_hi)
        got = load_at(k)
        if abs(got - load) <= SCALE_TOLERANCE * load:
            break
        k_lo, k_hi = (k, k_hi) if got > load else (k_lo, k)
    scaled = tuple(j._replace(submit_time=round(t0 + k * r, 3)) for j, (r, _, _) in zip(jobs, rel, strict=True))
    return scenario._replace(jobs=scaled)


def run_sweep(scenarios: Mapping[float, Scenario], policies: Sequence[str], config: SimConfig | None = None,
              out_dir: Path | None = None, *, write_logs: bool = True, figures: bool = True,
              progress: Callable[[str], None] | None = None,
              advance: Callable[[str, int], None] | None = None, prefer_warm: bool = True) -> SweepReport:
    """Every policy on the scenario of each load (in the mapping's order); results written into `out_dir` if given.

    `progress`, `advance` and `prefer_warm` are `run_policies`', its runs named by `run_label`.
    """
    runs: list[LoadRun] = []
    files: list[Path] = []
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        _remove_stale(out_dir, [load_name(load) for load in scenarios], figures=figures)
    for load, scenario in scenarios.items():
        report = run_policies(scenario, policies, config, out_dir / f"load-{load_name(load)}" if out_dir else None,
                              write_logs=write_logs, figures=figures, progress=_told(load, progress),
                              advance=_advanced(load, advance), prefer_warm=prefer_warm)
        runs.append(LoadRun(load, offered_load(scenario), report))
        files += report.files
    figs = sweep_figures(runs)
    table = sweep_table(runs)
    if out_dir is not None:
        (out_dir / "metrics.json").write_text(json.dumps(json_ready(figs), indent=1, allow_nan=False))
        tables = [f"load {load_name(r.load)} (offered {r.offered:.3f})\n{r.report.table}" for r in runs]
        (out_dir / "table.txt").write_text("\n\n".join([*tables, table]) + "\n")
        files += [out_dir / "metrics.json", out_dir / "table.txt"]
        if figures:
            # matplotlib is the `sim` extra, and slow to import: only a run that draws pays for it.
            from orchestrator.sim import plots

            loads = figs["loads"]
            for name, key, label, log in SWEEP_FIGURES:
                series = {p: f[key] for p, f in figs["sweep"].items()}
                files.append(plots.against_load(loads, series, label, out_dir / name, log=log))
    return SweepReport(tuple(runs), table, figs, tuple(files))


def _told(load: float, progress: Callable[[str], None] | None) -> Callable[[str], None] | None:
    """`progress` with each line prefixed by its load."""
    if progress is None:
        return None
    tell = progress
    return lambda line: tell(f"load {load_name(load)}: {line}")


def _advanced(load: float, advance: Callable[[str, int], None] | None) -> Callable[[str, int], None] | None:
    """`advance` with each policy named by its run's label."""
    if advance is None:
        return None
    feed = advance
    return lambda policy, done: feed(run_label(load, policy), done)


def sweep_figures(runs: Sequence[LoadRun]) -> dict[str, Any]:
    """Loads asked and offered, each load's key figures (`runs.headline`, as a single run's `--json`), and per
    policy each figure (table.ROWS' keys) as a list over the loads, None where a load lacks the policy."""
    per_load = {load_name(r.load): headline(r.report) for r in runs}
    policies = list(dict.fromkeys(p for r in runs for p in r.report.metrics))
    by_load = [{p: json_figures(m) for p, m in r.report.metrics.items()} for r in runs]
    return {
        "loads": [r.load for r in runs],
        "offered": [round(r.offered, 4) for r in runs],
        "per_load": per_load,
        "sweep": {p: {row.key: [f[p][row.key] if p in f else None for f in by_load] for row in ROWS}
                  for p in policies},
    }


def _row(key: str) -> Row:
    return next(r for r in ROWS if r.key == key)


def sweep_table(runs: Sequence[LoadRun]) -> str:
    """One line per load and policy: load asked and offered, then SWEEP_COLUMNS, as the side-by-side table shows
    them."""
    header = ["load", "offered", "policy", *(h for h, _ in SWEEP_COLUMNS)]
    rows = [[load_name(r.load), f"{r.offered:.3f}", p,
             *(_cell(_row(key), m) for _, key in SWEEP_COLUMNS)]
            for r in runs for p, m in r.report.metrics.items()]
    return _aligned(header, rows)


def _cell(row: Row, m: Mapping[str, Any]) -> str:
    v = json_figures(m)[row.key]
    return "-" if v is None else row.fmt.format(v * row.scale)


def _aligned(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Left-aligned first three columns (load, offered, policy), numbers right-aligned."""
    body = [list(r) for r in rows]
    widths = [max(len(header[i]), *(len(r[i]) for r in body)) if body else len(header[i]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i < 3 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    top = line(header)
    return "\n".join([top, "-" * len(top), *(line(r) for r in body)])


def _remove_stale(out_dir: Path, loads: Sequence[str], *, figures: bool) -> None:
    """Remove what an earlier run wrote here and this sweep will not rewrite, so nothing passes for its output:
    a single run's logs and figures at the top, the sweep figures under --no-figures, the runs of loads this
    sweep does not have (only the files a run writes; a load's directory goes when that leaves it empty)."""
    ours = [f"events-{p}.jsonl" for p in POLICY_NAMES] + list(FIGURES)
    stale = [out_dir / name for name in ours]
    stale += [] if figures else [out_dir / name for name, *_ in SWEEP_FIGURES]
    kept = {f"load-{name}" for name in loads}
    old = [d for d in out_dir.glob("load-*") if d.is_dir() and d.name not in kept]
    stale += [d / name for d in old for name in [*ours, "metrics.json", "table.txt"]]
    for path in stale:
        path.unlink(missing_ok=True)
    for d in old:
        if not any(d.iterdir()):
            d.rmdir()
