"""The figures stay readable: coinciding curves are all visible and named, the legend is off the data."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.legend import Legend
from matplotlib.lines import Line2D

from orchestrator.sim import plots


def allocation_metrics(shapes: dict[str, float]) -> dict[str, dict[str, Any]]:
    """Per policy a wave of allocation over three days (phase given), as metrics.json holds it."""
    out = {}
    for name, phase in shapes.items():
        t = [i * 600.0 for i in range(432)]
        frac = [0.5 + 0.5 * math.sin(x / 20_000 + phase) for x in t]
        out[name] = {"gpu_allocation": {"series": {"t": t, "fraction": frac}, "mean": sum(frac) / len(frac)}}
    return out


def legend_of(ax: Axes) -> Legend:
    legend = ax.get_legend()
    assert legend is not None
    return legend


def test_same_as_finds_a_curve_drawn_twice() -> None:
    a = ([1.0, 2.0], [0.5, 1.0])
    noisy = ([1.0, 2.0 + 1e-12], [0.5, 1.0])  # the same decisions, summed in another order
    assert plots.same_as({"corral": a, "fifo-backfill": noisy, "fifo": ([1.0, 3.0], [0.5, 1.0]),
                          "las": a}) == {"fifo-backfill": "corral", "las": "corral"}


def test_identical_jct_curves_are_each_visible_and_said_to_coincide() -> None:
    jcts = {"fifo-backfill": [60.0 * i for i in range(1, 200)], "corral": [60.0 * i for i in range(1, 200)],
            "fifo": [120.0 * i for i in range(1, 200)]}
    fig = plots.jct_cdf_figure(jcts)
    ax = fig.axes[0]
    lines: list[Line2D] = ax.get_lines()
    labels = [t.get_text() for t in legend_of(ax).get_texts()]
    assert labels == ["fifo-backfill", "corral (same curve as fifo-backfill)", "fifo"]
    under, over = lines[0], lines[1]
    assert under.get_linestyle() != over.get_linestyle() and under.get_marker() != over.get_marker()
    assert over.get_linewidth() < under.get_linewidth()  # the one on top is thinner: both show
    assert under.get_markevery() != over.get_markevery()  # markers at different places on the same curve


def test_the_allocation_legend_is_beside_the_data(tmp_path: Path) -> None:
    metrics = allocation_metrics({"corral": 0.0, "fifo": 1.0, "fifo-backfill": 0.0, "drf": 2.0, "las": 3.0})
    fig = plots.allocation_figure(metrics)
    fig.canvas.draw()
    ax = fig.axes[0]
    legend = legend_of(ax).get_window_extent()
    assert legend.x0 >= ax.get_window_extent().x1, "the legend covers the plot"
    assert legend.x1 <= fig.bbox.x1, "the legend is cut off"
    twin = legend_of(ax).get_texts()[2].get_text()
    assert twin.startswith("fifo-backfill (mean ") and twin.endswith("%) (same curve as corral)"), twin
    path = plots.allocation(metrics, tmp_path / "allocation.png")
    assert path.stat().st_size < 100_000  # small enough to commit
