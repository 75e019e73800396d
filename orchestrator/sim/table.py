"""The side-by-side text table of several policies' metrics (what `corral sim` prints)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

Row = tuple[str, Callable[[Mapping[str, Any]], float | int | None], str]

HOUR = 3600.0

ROWS: tuple[Row, ...] = (
    ("jobs completed", lambda m: m["completed"], "{:.0f}"),
    ("avg JCT (h)", lambda m: m["jct_s"]["avg"] / HOUR, "{:.2f}"),
    ("median JCT (h)", lambda m: m["jct_s"]["median"] / HOUR, "{:.2f}"),
    ("p95 JCT (h)", lambda m: m["jct_s"]["p95"] / HOUR, "{:.1f}"),
    ("p99 JCT (h)", lambda m: m["jct_s"]["p99"] / HOUR, "{:.1f}"),
    ("avg queueing delay (h)", lambda m: m["queueing_delay_s"]["avg"] / HOUR, "{:.2f}"),
    ("p95 queueing delay (h)", lambda m: m["queueing_delay_s"]["p95"] / HOUR, "{:.2f}"),
    ("makespan (d)", lambda m: m["makespan_s"] / 86400.0, "{:.2f}"),
    ("mean GPU allocation (%)", lambda m: 100 * m["gpu_allocation"]["mean"], "{:.1f}"),
    ("  incl. drain (%)", lambda m: 100 * m["gpu_allocation"]["mean_whole_run"], "{:.1f}"),
    ("Jain's index (queues)", lambda m: m["jain_index"], "{:.3f}"),
    ("worst queue: received / fair", lambda m: min((r for r in m["queues"]["ratio"] if r is not None), default=None),
     "{:.3f}"),
    ("preemptions", lambda m: m["preemptions"], "{:.0f}"),
    ("GPU-h lost to preemption", lambda m: m["gpu_hours_lost_to_preemption"], "{:.0f}"),
    ("longest wait >=32-GPU gang (h)",
     lambda m: None if m["longest_wait_32plus_s"] is None else m["longest_wait_32plus_s"] / HOUR, "{:.1f}"),
    ("time-limit kills", lambda m: m["time_limit_kills"], "{:.0f}"),
    ("unfinished jobs", lambda m: m["unfinished"], "{:.0f}"),
    ("sim wall time (s)", lambda m: m["sim"]["wall_s"], "{:.1f}"),
    ("jobs simulated / s", lambda m: m["sim"]["jobs_per_s"], "{:.0f}"),
)


def _cell(value: float | int | None, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return fmt.format(value)


def side_by_side(metrics: Mapping[str, Mapping[str, Any]]) -> str:
    names = list(metrics)
    label_w = max(len(r[0]) for r in ROWS)
    cells = [[_cell(get(metrics[n]), fmt) for n in names] for _, get, fmt in ROWS]
    widths = [max(len(n), *(len(row[i]) for row in cells)) for i, n in enumerate(names)]
    lines = ["  ".join([f"{'metric':<{label_w}}", *(f"{n:>{w}}" for n, w in zip(names, widths, strict=True))])]
    lines.append("-" * len(lines[0]))
    for (label, _, _), row in zip(ROWS, cells, strict=True):
        lines.append("  ".join([f"{label:<{label_w}}", *(f"{c:>{w}}" for c, w in zip(row, widths, strict=True))]))
    return "\n".join(lines)
