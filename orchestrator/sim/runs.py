"""Run one scenario under several policies and write what `corral sim` promises.

Into the output directory: `events-<policy>.jsonl` (the log of each run, in
the real log format), `metrics.json` (every policy's figures plus the
comparisons), `table.txt` (the side-by-side table) and the PNG figures.
Policies run one after another in this process: the machine's cores are
shared, and each run is deterministic on its own.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

from orchestrator.sim.baselines import POLICY_NAMES, policies_for
from orchestrator.sim.engine import Scenario, SimConfig, SimResult, Simulation, simulate
from orchestrator.sim.metrics import big_gang_waits, summarize, waits_longer
from orchestrator.sim.table import json_figures, side_by_side

#: The figures a run draws into the output directory.
FIGURES = ("jct_cdf.png", "allocation.png", "queue_shares.png", "share_vs_fair.png")


class Report(NamedTuple):
    metrics: dict[str, dict[str, Any]]
    comparison: dict[str, Any]
    table: str
    files: tuple[Path, ...]


def _jcts(result: SimResult) -> list[float]:
    tl = result.timeline
    return [tl.end[j] - tl.submit[j] for j, s in tl.status.items() if s == "completed"]


def compare(metrics: dict[str, dict[str, Any]], waits: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Corral against the baselines, on the figures the benchmark targets (absent policies: None)."""
    def get(name: str, *path: str) -> Any:
        m: Any = metrics.get(name)
        for p in path:
            if m is None:
                return None
            m = m[p]
        return m

    out: dict[str, Any] = {}
    c_jct, f_jct = get("corral", "jct_s", "avg"), get("fifo", "jct_s", "avg")
    out["avg_jct_fifo_over_corral"] = f_jct / c_jct if c_jct and f_jct is not None else None
    c_alloc, b_alloc = get("corral", "gpu_allocation", "mean"), get("fifo-backfill", "gpu_allocation", "mean")
    out["alloc_corral_minus_fifo_backfill"] = c_alloc - b_alloc if c_alloc is not None and b_alloc is not None else None
    c_wait, b_wait = get("corral", "longest_wait_32plus_s"), get("fifo-backfill", "longest_wait_32plus_s")
    out["longest_wait_32plus_corral_minus_fifo_backfill_s"] = (
        c_wait - b_wait if c_wait is not None and b_wait is not None else None
    )
    if "corral" in waits and "fifo-backfill" in waits:
        cw, bw = waits["corral"], waits["fifo-backfill"]
        both = [j for j in cw if j in bw]
        out["big_gangs_compared"] = len(both)
        out["big_gangs_waiting_longer_under_corral"] = len(waits_longer(cw, bw))
    out["jain_corral"] = get("corral", "jain_index")
    return out


def run_policies(scenario: Scenario, policies: Sequence[str], config: SimConfig | None = None,
                 out_dir: Path | None = None, *, write_logs: bool = True, figures: bool = True,
                 progress: Callable[[str], None] | None = None,
                 advance: Callable[[str, int], None] | None = None, prefer_warm: bool = True) -> Report:
    """Simulate `scenario` under each policy; write logs, metrics, table and figures into `out_dir` if given.

    `progress` gets a line per finished policy; `advance(policy, jobs_finished)` is called while a
    policy runs, each time more of its jobs have finished (a progress bar's feed). `prefer_warm` False runs
    each policy with placement's warm-node preference off (`Policies.prefer_warm`, issue #33).
    """
    config = config if config is not None else SimConfig()
    metrics: dict[str, dict[str, Any]] = {}
    waits: dict[str, dict[str, float]] = {}
    jcts: dict[str, list[float]] = {}
    files: list[Path] = []
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        _remove_stale(out_dir, policies, write_logs=write_logs, figures=figures)
    for name in policies:
        tick = _ticker(name, advance) if advance is not None else None
        what_if = None if prefer_warm else replace(policies_for(name), prefer_warm=False)
        if out_dir is not None and write_logs:
            path = out_dir / f"events-{name}.jsonl"
            with path.open("wb") as f:
                result = simulate(scenario, name, config, log=f, on_instant=tick, policies=what_if)
            files.append(path)
        else:
            result = simulate(scenario, name, config, on_instant=tick, policies=what_if)
        metrics[name] = summarize(result)
        waits[name] = big_gang_waits(result)
        jcts[name] = _jcts(result)
        if progress is not None:
            progress(progress_line(metrics[name]))
    comparison = compare(metrics, waits)
    table = side_by_side(metrics)
    if out_dir is not None:
        (out_dir / "metrics.json").write_text(json.dumps(json_ready({"policies": metrics, "comparison": comparison}),
                                                         indent=1, allow_nan=False))
        (out_dir / "table.txt").write_text(table + "\n")
        files += [out_dir / "metrics.json", out_dir / "table.txt"]
        if figures:
            # matplotlib is the `sim` extra, and slow to import: only a run that draws pays for it.
            from orchestrator.sim import plots

            jct_cdf, allocation, queue_shares, share_vs_fair = (out_dir / f for f in FIGURES)
            files += [
                plots.jct_cdf(jcts, jct_cdf),
                plots.allocation(metrics, allocation),
                plots.queue_shares(metrics, queue_shares),
                plots.share_vs_fair(metrics, share_vs_fair),
            ]
    return Report(metrics, comparison, table, tuple(files))


def _ticker(policy: str, advance: Callable[[str, int], None]) -> Callable[[Simulation], None]:
    """An `on_instant` hook that calls `advance` only when the count of finished jobs moved (most instants
    finish none)."""
    seen = 0

    def tick(sim: Simulation) -> None:
        nonlocal seen
        done = len(sim.timeline.end)
        if done != seen:
            seen = done
            advance(policy, done)

    return tick


def _remove_stale(out_dir: Path, policies: Sequence[str], *, write_logs: bool, figures: bool) -> None:
    """Remove what an earlier run wrote here and this one will not rewrite (the logs of other policies, figures
    under --no-figures): left beside the new metrics.json they would pass for this run's. Nothing else is touched."""
    written = set(policies) if write_logs else set()
    stale = [f"events-{p}.jsonl" for p in POLICY_NAMES if p not in written]
    stale += [] if figures else list(FIGURES)
    for name in stale:
        (out_dir / name).unlink(missing_ok=True)


def progress_line(m: dict[str, Any]) -> str:
    """"corral: 2 jobs completed, 1 rejected, avg JCT 0.51 h, 0.0 s (2409 jobs/s)" (no JCT when none completed)."""
    counts = [f"{m['completed']} jobs completed"] + [f"{m[k]} {k}" for k in ("failed", "rejected") if m[k]]
    jct = m["jct_s"]["avg"]
    counts.append(f"avg JCT {jct / 3600:.2f} h" if math.isfinite(jct) else "no JCT (no job completed)")
    return f"{m['policy']}: {', '.join(counts)}, {m['sim']['wall_s']:.1f} s ({m['sim']['jobs_per_s']:.0f} jobs/s)"


def json_ready(v: Any) -> Any:
    """`v` with every nan or infinity as None: JSON has no NaN, and strict readers (jq, browsers) refuse it."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: json_ready(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_ready(x) for x in v]
    return v


def headline(report: Report) -> dict[str, Any]:
    """The key figures as one flat JSON-ready object: every row of the table as a number (`--json`, the benchmark)."""
    out: dict[str, Any] = {name: json_figures(m) for name, m in report.metrics.items()}
    out["comparison"] = {k: _r(v, 4) if isinstance(v, float) else v for k, v in report.comparison.items()}
    return out


def _r(v: float, digits: int = 3) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v, digits)
