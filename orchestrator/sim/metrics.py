"""Scheduling-quality figures of one simulated run, as plain JSON-ready values.

Definitions (so two runs compare like for like):

* JCT: submit to JobCompleted, completed jobs only. Queueing delay: submit to
  the first GangReserved, jobs that started.
* Makespan: first submit to the last job's end.
* GPU allocation: GPUs held by gangs / GPUs on schedulable nodes,
  time-weighted. `mean` covers the arrival window (first to last submit),
  where the offered load is present; `mean_whole_run` adds the drain at the
  end, which is mostly the tail of the longest jobs.
* Fair share: weighted max-min of the schedulable GPUs over the queues'
  demand (held + pending GPUs), at every instant (see fairness.py). A queue's
  ratio is its GPU-seconds received / its fair-share GPU-seconds; Jain's
  index is taken over the ratios of queues that had any fair share.
* GPU-hours lost: GPU time that did not turn into saved progress because of a
  preemption (or node failure, or GPU fault): work since the last checkpoint
  plus restart overheads. GPU faults of the outage trace also count the
  GPU-hours their GPUs were out of service.
* Total wait: every moment after submission a job did not hold GPUs, waits
  after a preemption or requeue included (completed jobs: JCT - time held);
  the queueing delay above counts only submit -> first start.
* Share error (issue #20): per queue, over the instants it has pending work
  and a fair share, the time-weighted |GPUs held - fair share| / fair share;
  the mean over queues and the worst queue. Jain's index over whole-run
  ratios hides a queue starved at every peak and served in the lulls.
* Preemptions per job: the max and p99 over all jobs (0 for jobs never
  preempted). GPU-hours lost to preemption as a fraction of the GPU-hours
  delivered (GPU time held by gangs).
* Longest wait of a >= 32-GPU gang: the largest queueing delay among them.
* Priority jobs: those above the trace's lowest priority (none if all jobs
  have one priority). Their queueing delay is what priorities and preemption
  buy, and what a policy without them does not.
* Staging (issue #33; only for runs whose jobs have datasets): seconds from
  a gang's placement until its last node holds its last dataset, per
  attempt; the GPU-hours gangs held while staging (idle GPUs; inside JCT);
  the share of (node, dataset) asks the node's cache already held; bytes
  moved and cache evictions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from orchestrator.sim.engine import SimResult
from orchestrator.sim.fairness import jain, water_fill

BIG_GANG_GPUS = 32


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile (p in 0..100) of sorted values; nan when empty."""
    if not sorted_values:
        return math.nan
    k = (len(sorted_values) - 1) * p / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def _stats(values: list[float], *, full: bool = True) -> dict[str, float]:
    v = sorted(values)
    out = {"avg": sum(v) / len(v) if v else math.nan, "median": percentile(v, 50), "p95": percentile(v, 95)}
    if full:
        out["p99"] = percentile(v, 99)
    else:
        del out["median"]
    return out


class _Buckets:
    """Time-weighted averages of piecewise-constant series over equal time buckets (for plots)."""

    def __init__(self, start: float, end: float, n: int, width: int) -> None:
        self.start = start
        self.n = n
        self.size = max(end - start, 1e-9) / n
        self.sums = [[0.0] * width for _ in range(n)]

    def add(self, a: float, b: float, values: Sequence[float]) -> None:
        while a < b:
            i = min(self.n - 1, int((a - self.start) / self.size))
            edge = min(b, self.start + (i + 1) * self.size) if i < self.n - 1 else b
            w = edge - a
            if w <= 0:
                break
            row = self.sums[i]
            for k, v in enumerate(values):
                row[k] += v * w
            a = edge

    def averages(self) -> list[list[float]]:
        return [[s / self.size for s in row] for row in self.sums]

    def times(self) -> list[float]:
        return [self.start + (i + 0.5) * self.size for i in range(self.n)]


def summarize(result: SimResult, *, buckets: int = 200) -> dict[str, Any]:
    tl, state, stats = result.timeline, result.state, result.stats
    submits = tl.submit
    completed = [j for j, s in tl.status.items() if s == "completed"]
    jct = [tl.end[j] - submits[j] for j in completed]
    waited = {j: tl.first_start[j] - submits[j] for j in tl.first_start}  # queueing delay, per started job
    delay = list(waited.values())
    t0 = min(submits.values(), default=0.0)
    t_last_submit = max(submits.values(), default=0.0)
    t_end = max([*tl.end.values(), t_last_submit])
    big = big_gang_waits(result)
    lowest = min(tl.priority.values(), default=0)
    urgent = [j for j, p in tl.priority.items() if p > lowest]
    urgent_delay = [waited[j] for j in urgent if j in waited]
    worst = max(big, key=lambda j: (big[j], j), default=None)

    names = tl.queues
    nq = len(names)
    weights = [state.queues[q].weight if q in state.queues else 1.0 for q in names]
    limits: list[float | None] = [
        float(lim) if q in state.queues and (lim := state.queues[q].limit_gpus) is not None else None for q in names
    ]
    got = [0.0] * nq
    fair = [0.0] * nq
    off = [0.0] * nq  # |held - fair| while backlogged
    owed = [0.0] * nq  # fair share while backlogged
    alloc_busy = cap_busy = alloc_all = cap_all = 0.0
    series = _Buckets(t0, t_end, buckets, 1 + 2 * nq)
    times = tl.t
    for i in range(len(times)):
        a = times[i]
        b = times[i + 1] if i + 1 < len(times) else t_end
        if b <= a or b <= t0:
            continue
        a = max(a, t0)
        dt = b - a
        alloc = list(tl.alloc_at[i]) + [0] * (nq - len(tl.alloc_at[i]))
        pend = list(tl.pending_at[i]) + [0] * (nq - len(tl.pending_at[i]))
        cap = float(tl.capacity_at[i])
        total = float(sum(alloc))
        share = water_fill([x + y for x, y in zip(alloc, pend, strict=True)], weights, cap, limits)
        for k in range(nq):
            got[k] += alloc[k] * dt
            fair[k] += share[k] * dt
            if pend[k] > 0 and share[k] > 0:
                off[k] += abs(alloc[k] - share[k]) * dt
                owed[k] += share[k] * dt
        alloc_all += total * dt
        cap_all += cap * dt
        busy = max(0.0, min(b, t_last_submit) - a)
        alloc_busy += total * busy
        cap_busy += cap * busy
        norm = cap if cap > 0 else 1.0
        series.add(a, b, [total / norm, *(x / norm for x in alloc), *(x / norm for x in share)])
    ratios = [got[k] / fair[k] for k in range(nq) if fair[k] > 0]
    share_error = [off[k] / owed[k] if owed[k] > 0 else None for k in range(nq)]
    errors = [e for e in share_error if e is not None]
    total_wait = [tl.end[j] - submits[j] - tl.held_s.get(j, 0.0) for j in completed]
    preempted = sorted(float(tl.preempted.get(j, 0)) for j in submits)
    avg = series.averages()
    lost = {"preemption": 0.0, "failure": 0.0, "gpu_fault": 0.0}
    for w in result.work.values():
        for cause, v in w.lost.items():
            lost[cause] = lost.get(cause, 0.0) + v
    return {
        "policy": result.policy,
        "jobs": len(submits),
        "completed": len(completed),
        "failed": sum(1 for s in tl.status.values() if s == "failed"),
        "rejected": sum(1 for s in tl.status.values() if s == "rejected"),
        "unfinished": stats.unfinished,
        "jct_s": _stats(jct),
        "queueing_delay_s": _stats(delay, full=False),
        "total_wait_s": _stats(total_wait, full=False),
        "priority_jobs": len(urgent),
        "priority_queueing_delay_s": _stats(urgent_delay, full=False),
        "makespan_s": t_end - t0,
        "gpu_allocation": {
            "mean": alloc_busy / cap_busy if cap_busy else math.nan,
            "mean_whole_run": alloc_all / cap_all if cap_all else math.nan,
            "series": {"t": series.times(), "fraction": [row[0] for row in avg]},
        },
        "queues": {
            "names": names,
            "weights": weights,
            "share": [g / cap_all if cap_all else 0.0 for g in got],
            "fair_share": [f / cap_all if cap_all else 0.0 for f in fair],
            "ratio": [got[k] / fair[k] if fair[k] > 0 else None for k in range(nq)],
            "share_error": share_error,
            "series": {
                "t": series.times(),
                "share": {q: [row[1 + k] for row in avg] for k, q in enumerate(names)},
                "fair": {q: [row[1 + nq + k] for row in avg] for k, q in enumerate(names)},
            },
        },
        "jain_index": jain(ratios),
        "share_error": {
            "mean": sum(errors) / len(errors) if errors else None,
            "worst": max(errors) if errors else None,
        },
        "preemptions": tl.preemptions,
        "preemptions_per_job": {"max": preempted[-1] if preempted else 0.0, "p99": percentile(preempted, 99)},
        "gpu_hours_delivered": alloc_all / 3600.0,
        "lost_to_preemption_fraction": lost["preemption"] / alloc_all if alloc_all else None,
        "jobs_preempted": len(tl.preempted),
        "requeues": tl.requeues,
        "gpu_hours_lost_to_preemption": lost["preemption"] / 3600.0,
        "gpu_hours_lost_to_failures": lost["failure"] / 3600.0,
        "gpu_faults": stats.gpu_faults,
        "gpu_hours_lost_to_gpu_faults": lost["gpu_fault"] / 3600.0,
        "gpu_hours_out_of_service": stats.gpu_fault_down_s / 3600.0,
        "longest_wait_32plus_s": big[worst] if worst is not None else None,
        "longest_wait_32plus_job": worst,
        "time_limit_kills": stats.time_limit_kills,
        "sim": {
            "events": stats.events,
            "decides": stats.decides,
            "admission_skips": stats.admission_skips,
            "wall_s": stats.wall_s,
            "jobs_per_s": len(submits) / stats.wall_s if stats.wall_s > 0 else math.nan,
            "voids": stats.voids,
        },
        **({"staging": staging_figures(result)} if result.staging is not None else {}),
    }


def staging_figures(result: SimResult) -> dict[str, Any]:
    """The run's staging costs (module docstring), JSON-ready; staging seconds per job, averaged."""
    st = result.staging
    assert st is not None
    per_job = list(st.per_job.values())
    return {
        "attempts": st.attempts,
        "avg_per_attempt_s": st.seconds / st.attempts if st.attempts else 0.0,
        "per_job_s": _stats(per_job, full=False),
        "gpu_hours_idle": st.gpu_seconds / 3600.0,
        "cache_hit_rate": st.hits / st.items if st.items else None,
        "tb_staged": st.bytes_staged / 1e12,
        "evictions": st.evictions,
    }


def big_gang_waits(result: SimResult) -> dict[str, float]:
    """Queueing delay of every >= 32-GPU gang that started, by job id (for per-job comparisons)."""
    tl = result.timeline
    return {j: tl.first_start[j] - tl.submit[j] for j in tl.first_start if tl.gpus[j] >= BIG_GANG_GPUS}


def waits_longer(waits: dict[str, float], baseline: dict[str, float]) -> list[float]:
    """By how much each gang waited longer than under `baseline`, for the gangs that did (1 us slack)."""
    return [w - baseline[j] for j, w in waits.items() if j in baseline and w > baseline[j] + 1e-6]
