"""PNG figures of simulated runs (matplotlib, Agg backend: no display needed).

Small on purpose (a few hundred points per line, modest DPI) so they can be
committed next to the benchmark results.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

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


def jct_cdf(jcts: Mapping[str, Sequence[float]], path: Path) -> Path:
    """JCT CDF per policy, hours on a log axis."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, values in jcts.items():
        x, y = _cdf([max(v, 1.0) / 3600.0 for v in values])
        ax.plot(x, y, label=name, linewidth=1.6)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours, log scale)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("JCT CDF")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def allocation(metrics: Mapping[str, Mapping[str, Any]], path: Path) -> Path:
    """GPU allocation (fraction of schedulable GPUs held) over time, per policy."""
    fig, ax = plt.subplots(figsize=(8, 3.8))
    for name, m in metrics.items():
        s = m["gpu_allocation"]["series"]
        ax.plot([t / DAY_S for t in s["t"]], [100 * f for f in s["fraction"]],
                label=f"{name} (mean {100 * m['gpu_allocation']['mean']:.1f}%)", linewidth=1.2)
    ax.set_xlabel("time (days)")
    ax.set_ylabel("GPUs allocated (%)")
    ax.set_ylim(0, 105)
    ax.set_title("GPU allocation over time")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower center", fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
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
