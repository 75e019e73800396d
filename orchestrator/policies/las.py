"""Least attained service (Tiresias-like): the jobs that have had the least GPU time go first.

Attained service is the GPU-seconds a job has held GPUs (`state.attained_service`;
the fold keeps what earlier attempts got). As in Tiresias's discretised LAS,
it is read in levels, so jobs of one level keep their arrival order instead
of overtaking each other second by second: below LEVELS_GPU_S[0] a job is in
level 0, and so on.

Preemption: a pending job may preempt a running, preemptible gang of a
*higher* level (more service) that has run at least the cluster's
min_runtime_s, most-served first; a victim of another queue is still never
taken below its guarantee (victims.find_victims).

Anti-thrash. Let P (level p) preempt V (level v > p). While V waits its
service does not change, so its level stays v. V can take its GPUs back only
when P's level exceeds v, i.e. after P has been served at least
LEVELS_GPU_S[v] - its attained service, and ran min_runtime_s: preemptions
between two jobs are time slices bounded below, never a loop within one
instant. (Tiresias's starvation relief -- promoting a job that waited too
long -- is not modelled.)
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Mapping
from typing import Any

from orchestrator.core.model.plan import QueueLoad
from orchestrator.core.model.state import Job
from orchestrator.policies.fairshare import JobKey
from orchestrator.policies.victims import Candidate, PreemptionAsk, PreemptionRule

#: Level boundaries in GPU-seconds: 1 GPU-hour, 32 GPU-hours.
LEVELS_GPU_S: tuple[float, ...] = (3_600.0, 32 * 3_600.0)


def level(attained_gpu_s: float) -> int:
    return bisect_right(LEVELS_GPU_S, attained_gpu_s)


def least_attained_first(job: Job) -> JobKey:
    """Pending jobs: lower level first, then arrival order."""
    return (level(job.attained_s), job.submitted_at, job.job_id)


def why_preemptible_las(ask: PreemptionAsk, c: Candidate, loads: Mapping[str, QueueLoad]) -> str | None:
    del loads
    if not c.preemptible or c.gpus <= 0 or ask.now - c.started_at < ask.min_runtime_s:
        return None
    return "least attained service" if level(c.attained) > level(ask.attained) else None


def most_attained_first(ask: PreemptionAsk) -> Callable[[Candidate], tuple[Any, ...]]:
    del ask

    def key(c: Candidate) -> tuple[Any, ...]:
        return (-c.attained, -c.started_at, c.job_id)

    return key


LEAST_ATTAINED_SERVICE = PreemptionRule(why_preemptible_las, most_attained_first)
