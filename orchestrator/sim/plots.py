"""PNG figures of simulated runs (matplotlib, Agg backend: no display needed).

Small on purpose (a few hundred points per line, modest DPI) so they can be
committed next to the benchmark results.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

DPI = 80
DAY_S = 86_400.0
#: Points per CDF line (quantiles), enough to look smooth.
CDF_POINTS = 400


def _cdf(values: Sequence[float]) -> tuple[list[float], list[float]]:
    v = sorted(values)
    if not v:
        return [], []
    n = len(v)
    step = max(1, n // CDF_POINTS)
    idx = [*range(0, n, step), n - 1]
    return [v[i] for i in idx], [(i + 1) / n for i in idx]


#: Per policy, in order: a dash pattern and a marker, so curves that coincide still show each (the later
#: one is drawn thinner, on top of the earlier) and read apart in grey.
LINESTYLES: tuple[Any, ...] = ("-", (0, (6, 2)), (0, (2, 2)), (0, (6, 2, 1, 2)), (0, (1, 1)), (0, (10, 3)))
MARKERS = ("o", "s", "^", "D", "v", "x")
#: Markers per CDF line: sparse, at a different place on each line.
CDF_MARKS = 8


def _style(i: int, widest: float) -> dict[str, Any]:
    """The i-th policy's dashes and width: each a little thinner than the one before (it is drawn on top)."""
    return {"linestyle": LINESTYLES[i % len(LINESTYLES)], "linewidth": widest * max(1.0 - 0.15 * i, 0.4)}


def same_as(curves: Mapping[str, tuple[Sequence[float], Sequence[float]]]) -> dict[str, str]:
    """Each name whose (x, y) curve equals an earlier one's -> that earlier name (it would hide it).

    Equal to 9 significant digits: two policies making the same decisions sum their series in another order.
    """
    first: dict[tuple[tuple[float, ...], ...], str] = {}
    out: dict[str, str] = {}
    for name, (x, y) in curves.items():
        key = tuple(float(f"{v:.9g}") for v in x), tuple(float(f"{v:.9g}") for v in y)
        if key in first:
            out[name] = first[key]
        else:
            first[key] = name
    return out


def _label(name: str, twins: Mapping[str, str], extra: str = "") -> str:
    return f"{name}{extra}" + (f" (same curve as {twins[name]})" if name in twins else "")


def jct_cdf_figure(jcts: Mapping[str, Sequence[float]]) -> Figure:
    """JCT CDF per policy, hours on a log axis; a policy with another's curve says so in the legend."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    cdfs = {name: _cdf([max(v, 1.0) / 3600.0 for v in values]) for name, values in jcts.items()}
    twins = same_as(cdfs)
    for i, (name, (x, y)) in enumerate(cdfs.items()):
        step = max(1, len(x) // CDF_MARKS)
        ax.plot(x, y, label=_label(name, twins), marker=MARKERS[i % len(MARKERS)], markersize=4,
                fillstyle="none", markevery=(i * step // len(cdfs), step), **_style(i, 2.4))
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours, log scale)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("JCT CDF")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    return fig


def jct_cdf(jcts: Mapping[str, Sequence[float]], path: Path) -> Path:
    return _save(jct_cdf_figure(jcts), path)


def allocation_figure(metrics: Mapping[str, Mapping[str, Any]]) -> Figure:
    """GPU allocation (fraction of schedulable GPUs held) over time, per policy.

    The lines fill the plot from 0 to 100%: the legend goes beside it, not on the data.
    """
    fig, ax = plt.subplots(figsize=(8.6, 3.6))
    series = {name: m["gpu_allocation"]["series"] for name, m in metrics.items()}
    twins = same_as({name: (s["t"], s["fraction"]) for name, s in series.items()})
    for i, (name, s) in enumerate(series.items()):
        mean = f" (mean {100 * metrics[name]['gpu_allocation']['mean']:.1f}%)"
        ax.plot([t / DAY_S for t in s["t"]], [100 * f for f in s["fraction"]], label=_label(name, twins, mean),
                **_style(i, 1.5))
    ax.set_xlabel("time (days)")
    ax.set_ylabel("GPUs allocated (%)")
    ax.set_ylim(0, 105)
    ax.set_title("GPU allocation over time")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def allocation(metrics: Mapping[str, Mapping[str, Any]], path: Path) -> Path:
    return _save(allocation_figure(metrics), path, dpi=72)  # jagged dashed lines: a lower resolution keeps it small


def _save(fig: Figure, path: Path, dpi: int = DPI) -> Path:
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def queue_shares(metrics: Mapping[str, Mapping[str, Any]], path: Path) -> Path:
    """Per policy, each queue's share of the GPUs over time (stacked), with Jain's index in the title."""
    n = len(metrics)
    fig, axes = plt.subplots(n, 1, figsize=(8, 1.8 * n + 0.6), sharex=True, squeeze=False)
    for ax, (name, m) in zip(axes[:, 0], metrics.items(), strict=True):
        q = m["queues"]
        t = [x / DAY_S for x in q["series"]["t"]]
        names = q["names"]
        colors = [plt.get_cmap("tab20")(k % 20) for k in range(len(names))]
        ax.stackplot(t, *[[100 * v for v in q["series"]["share"][k]] for k in names], labels=names, colors=colors,
                     linewidth=0)
        ax.set_ylim(0, 100)
        ax.set_ylabel("% of GPUs")
        ax.set_title(f"{name}: queue shares (Jain's index {m['jain_index']:.3f})", fontsize=9)
    axes[-1, 0].set_xlabel("time (days)")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=min(len(labels), 6), fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / (1.8 * n + 0.6)))
    fig.savefig(path, dpi=72)  # many filled polygons: a lower resolution keeps the file small
    plt.close(fig)
    return path


def share_vs_fair(metrics: Mapping[str, Mapping[str, Any]], path: Path) -> Path:
    """Per queue and policy: GPU-seconds received / fair-share GPU-seconds (1.0 = exactly fair)."""
    names = next(iter(metrics.values()))["queues"]["names"]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    width = 0.8 / max(len(metrics), 1)
    for i, (name, m) in enumerate(metrics.items()):
        ratios = [r if r is not None else 0.0 for r in m["queues"]["ratio"]]
        ax.bar([k + i * width for k in range(len(ratios))], ratios, width=width, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(names))], names, rotation=30, fontsize=7)
    ax.set_ylabel("received / fair share")
    ax.set_title("Share vs fair share per queue (whole run)")
    ax.legend(fontsize=7, ncol=len(metrics))
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def against_load(loads: Sequence[float], series: Mapping[str, Sequence[float | None]], ylabel: str,
                 path: Path, *, log: bool = False) -> Path:
    """One figure of a load sweep: `ylabel` against the offered load, one line per policy (a gap where a load
    has no value); a policy with another's line says so in the legend. `log`: a logarithmic y axis, unless a
    value is not above 0."""
    fig, ax = plt.subplots(figsize=(7.6, 3.8))
    points = {name: (list(loads), [math.nan if v is None else v for v in values]) for name, values in series.items()}
    twins = same_as(points)
    for i, (name, (x, y)) in enumerate(points.items()):
        ax.plot(x, y, label=_label(name, twins), marker=MARKERS[i % len(MARKERS)], markersize=5, fillstyle="none",
                **_style(i, 2.0))
    ax.set_title(f"{ylabel} against offered load")
    if log and all(v > 0 for _, y in points.values() for v in y if not math.isnan(v)):
        ax.set_yscale("log")
        ylabel = f"{ylabel}, log scale"
    ax.set_xticks(list(loads))
    ax.set_xlabel("offered load (fraction of the GPUs while jobs arrive)")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    return _save(fig, path)
