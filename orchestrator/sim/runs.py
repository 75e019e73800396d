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
from pathlib import Path
from typing import Any, NamedTuple

from orchestrator.sim import plots
from orchestrator.sim.engine import Scenario, SimConfig, SimResult, simulate
from orchestrator.sim.metrics import big_gang_waits, summarize
from orchestrator.sim.table import side_by_side


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
        out["big_gangs_waiting_longer_under_corral"] = sum(1 for j in both if cw[j] > bw[j] + 1e-6)
    out["jain_corral"] = get("corral", "jain_index")
    return out


def run_policies(scenario: Scenario, policies: Sequence[str], config: SimConfig | None = None,
                 out_dir: Path | None = None, *, write_logs: bool = True, figures: bool = True,
                 progress: Callable[[str], None] | None = None) -> Report:
    """Simulate `scenario` under each policy; write logs, metrics, table and figures into `out_dir` if given."""
    config = config if config is not None else SimConfig()
    metrics: dict[str, dict[str, Any]] = {}
    waits: dict[str, dict[str, float]] = {}
    jcts: dict[str, list[float]] = {}
    files: list[Path] = []
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    for name in policies:
        if out_dir is not None and write_logs:
            path = out_dir / f"events-{name}.jsonl"
            with path.open("wb") as f:
                result = simulate(scenario, name, config, log=f)
            files.append(path)
        else:
            result = simulate(scenario, name, config)
        metrics[name] = summarize(result)
        waits[name] = big_gang_waits(result)
        jcts[name] = _jcts(result)
        if progress is not None:
            m = metrics[name]
            progress(f"{name}: {m['completed']} jobs completed, avg JCT {m['jct_s']['avg'] / 3600:.2f} h, "
                     f"{m['sim']['wall_s']:.1f} s ({m['sim']['jobs_per_s']:.0f} jobs/s)")
    comparison = compare(metrics, waits)
    table = side_by_side(metrics)
    if out_dir is not None:
        (out_dir / "metrics.json").write_text(json.dumps({"policies": metrics, "comparison": comparison},
                                                         indent=1, default=_json_default))
        (out_dir / "table.txt").write_text(table + "\n")
        files += [out_dir / "metrics.json", out_dir / "table.txt"]
        if figures:
            files += [
                plots.jct_cdf(jcts, out_dir / "jct_cdf.png"),
                plots.allocation(metrics, out_dir / "allocation.png"),
                plots.queue_shares(metrics, out_dir / "queue_shares.png"),
                plots.share_vs_fair(metrics, out_dir / "share_vs_fair.png"),
            ]
    return Report(metrics, comparison, table, tuple(files))


def _json_default(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    raise TypeError(f"not JSON serializable: {type(v).__name__}")


def headline(report: Report) -> dict[str, Any]:
    """The key figures as one flat JSON-ready object (what `--json` and the benchmark print last)."""
    out: dict[str, Any] = {}
    for name, m in report.metrics.items():
        out[name] = {
            "avg_jct_h": _r(m["jct_s"]["avg"] / 3600),
            "p99_jct_h": _r(m["jct_s"]["p99"] / 3600),
            "avg_queueing_h": _r(m["queueing_delay_s"]["avg"] / 3600),
            "mean_alloc": _r(m["gpu_allocation"]["mean"], 4),
            "jain": _r(m["jain_index"], 4),
            "worst_queue_ratio": _r(min((r for r in m["queues"]["ratio"] if r is not None), default=math.nan), 4),
            "preemptions": m["preemptions"],
            "gpu_h_lost_preemption": _r(m["gpu_hours_lost_to_preemption"], 1),
            "longest_wait_32plus_h": None if m["longest_wait_32plus_s"] is None else _r(m["longest_wait_32plus_s"] / 3600),
            "jobs_per_s": _r(m["sim"]["jobs_per_s"], 1),
        }
    out["comparison"] = {k: _r(v, 4) if isinstance(v, float) else v for k, v in report.comparison.items()}
    return out


def _r(v: float, digits: int = 3) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v, digits)
