"""The key figures of several policies' runs: the side-by-side text table `corral sim` prints, and the same
figures as numbers for `--json` -- one list of rows, so the two never tell different things."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

HOUR = 3600.0


class Row(NamedTuple):
    label: str
    #: The figure's name in `--json`, in its unit (hours, days, a fraction, a count).
    key: str
    value: Callable[[Mapping[str, Any]], float | int | None]
    fmt: str
    #: The table shows value x scale (a fraction as a percentage).
    scale: float = 1.0
    #: Decimals kept in `--json`.
    digits: int = 3


def _worst_ratio(m: Mapping[str, Any]) -> float | None:
    return min((r for r in m["queues"]["ratio"] if r is not None), default=None)


def _hours(v: float | None) -> float | None:
    return None if v is None else v / HOUR


ROWS: tuple[Row, ...] = (
    Row("jobs completed", "completed", lambda m: m["completed"], "{:.0f}"),
    Row("jobs failed", "failed", lambda m: m["failed"], "{:.0f}"),
    Row("jobs rejected", "rejected", lambda m: m["rejected"], "{:.0f}"),
    Row("unfinished jobs", "unfinished", lambda m: m["unfinished"], "{:.0f}"),
    Row("avg JCT (h)", "avg_jct_h", lambda m: _hours(m["jct_s"]["avg"]), "{:.2f}"),
    Row("median JCT (h)", "median_jct_h", lambda m: _hours(m["jct_s"]["median"]), "{:.2f}"),
    Row("p95 JCT (h)", "p95_jct_h", lambda m: _hours(m["jct_s"]["p95"]), "{:.1f}"),
    Row("p99 JCT (h)", "p99_jct_h", lambda m: _hours(m["jct_s"]["p99"]), "{:.1f}"),
    Row("avg queueing delay (h)", "avg_queueing_h", lambda m: _hours(m["queueing_delay_s"]["avg"]), "{:.2f}"),
    Row("p95 queueing delay (h)", "p95_queueing_h", lambda m: _hours(m["queueing_delay_s"]["p95"]), "{:.2f}"),
    Row("avg total wait (h)", "avg_total_wait_h", lambda m: _hours(m["total_wait_s"]["avg"]), "{:.2f}"),
    Row("p95 total wait (h)", "p95_total_wait_h", lambda m: _hours(m["total_wait_s"]["p95"]), "{:.2f}"),
    Row("  priority jobs, avg (h)", "avg_queueing_priority_h",
        lambda m: _hours(m["priority_queueing_delay_s"]["avg"]), "{:.2f}"),
    Row("  priority jobs, p95 (h)", "p95_queueing_priority_h",
        lambda m: _hours(m["priority_queueing_delay_s"]["p95"]), "{:.2f}"),
    Row("makespan (d)", "makespan_d", lambda m: m["makespan_s"] / 86400.0, "{:.2f}", digits=4),
    Row("mean GPU allocation (%)", "mean_alloc", lambda m: m["gpu_allocation"]["mean"], "{:.1f}", 100, 4),
    Row("  incl. drain (%)", "mean_alloc_incl_drain", lambda m: m["gpu_allocation"]["mean_whole_run"], "{:.1f}",
        100, 4),
    Row("Jain's index (queues)", "jain", lambda m: m["jain_index"], "{:.3f}", digits=4),
    Row("worst queue: received / fair", "worst_queue_ratio", _worst_ratio, "{:.3f}", digits=4),
    Row("share error, mean queue", "share_error_mean", lambda m: m["share_error"]["mean"], "{:.3f}", digits=4),
    Row("share error, worst queue", "share_error_worst", lambda m: m["share_error"]["worst"], "{:.3f}", digits=4),
    Row("preemptions", "preemptions", lambda m: m["preemptions"], "{:.0f}"),
    Row("preemptions per job, max", "preemptions_per_job_max", lambda m: m["preemptions_per_job"]["max"], "{:.0f}"),
    Row("preemptions per job, p99", "preemptions_per_job_p99", lambda m: m["preemptions_per_job"]["p99"], "{:.1f}",
        digits=2),
    Row("GPU-h lost to preemption", "gpu_h_lost_preemption", lambda m: m["gpu_hours_lost_to_preemption"], "{:.0f}",
        digits=1),
    Row("  of GPU-h delivered (%)", "lost_preemption_fraction", lambda m: m["lost_to_preemption_fraction"], "{:.2f}",
        100, 5),
    Row("GPU faults", "gpu_faults", lambda m: m["gpu_faults"], "{:.0f}"),
    Row("GPU-h lost to GPU faults", "gpu_h_lost_gpu_faults", lambda m: m["gpu_hours_lost_to_gpu_faults"], "{:.0f}",
        digits=1),
    Row("  GPU-h out of service", "gpu_h_out_of_service", lambda m: m["gpu_hours_out_of_service"], "{:.0f}",
        digits=1),
    Row("longest wait >=32-GPU gang (h)", "longest_wait_32plus_h", lambda m: _hours(m["longest_wait_32plus_s"]),
        "{:.1f}"),
    Row("time-limit kills", "time_limit_kills", lambda m: m["time_limit_kills"], "{:.0f}"),
    Row("sim wall time (s)", "sim_wall_s", lambda m: m["sim"]["wall_s"], "{:.1f}", digits=2),
    Row("jobs simulated / s", "jobs_per_s", lambda m: m["sim"]["jobs_per_s"], "{:.0f}", digits=1),
)


#: Rows of runs whose jobs have datasets (metrics.staging_figures); absent from runs without.
STAGING_ROWS: tuple[Row, ...] = (
    Row("avg staging per attempt (min)", "avg_staging_min", lambda m: m["staging"]["avg_per_attempt_s"] / 60.0,
        "{:.1f}", digits=2),
    Row("GPU-h idle while staging", "gpu_h_staging", lambda m: m["staging"]["gpu_hours_idle"], "{:.0f}", digits=1),
    Row("dataset cache hit rate (%)", "cache_hit_rate", lambda m: m["staging"]["cache_hit_rate"], "{:.1f}", 100, 4),
    Row("TB staged", "tb_staged", lambda m: m["staging"]["tb_staged"], "{:.2f}", digits=3),
    Row("cache evictions", "cache_evictions", lambda m: m["staging"]["evictions"], "{:.0f}"),
)


def rows_of(metrics: Mapping[str, Mapping[str, Any]]) -> tuple[Row, ...]:
    """The rows for these runs: the staging rows only when every run staged datasets."""
    staged = bool(metrics) and all("staging" in m for m in metrics.values())
    return ROWS + STAGING_ROWS if staged else ROWS


def _finite(value: float | int | None) -> float | int | None:
    """None for what has no value (no job completed: no JCT), so neither the table nor JSON shows nan."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return None
    return value


def _cell(value: float | int | None, row: Row) -> str:
    v = _finite(value)
    return "-" if v is None else row.fmt.format(v * row.scale)


def json_figures(m: Mapping[str, Any]) -> dict[str, float | int | None]:
    """One run's rows as JSON-ready numbers: counts as ints, the rest rounded, None where the table shows -."""
    out: dict[str, float | int | None] = {}
    for row in ROWS + (STAGING_ROWS if "staging" in m else ()):
        v = _finite(row.value(m))
        out[row.key] = round(v, row.digits) if isinstance(v, float) else v
    return out


def side_by_side(metrics: Mapping[str, Mapping[str, Any]]) -> str:
    names = list(metrics)
    rows = rows_of(metrics)
    label_w = max(len(r.label) for r in rows)
    cells = [[_cell(row.value(metrics[n]), row) for n in names] for row in rows]
    widths = [max(len(n), *(len(row[i]) for row in cells)) for i, n in enumerate(names)]
    lines = ["  ".join([f"{'metric':<{label_w}}", *(f"{n:>{w}}" for n, w in zip(names, widths, strict=True))])]
    lines.append("-" * len(lines[0]))
    for row, line in zip(rows, cells, strict=True):
        lines.append("  ".join([f"{row.label:<{label_w}}", *(f"{c:>{w}}" for c, w in zip(line, widths, strict=True))]))
    return "\n".join(lines)
