"""Run times learned from the log's own history (issue #20 point 5; Helios' QSSF idea).

The fold records how long each completed job held its GPUs (all attempts: a
preempted job's earlier attempts count, the wait between them does not) under
three keys: the job's (queue, submitted_by, name), its (queue, GPU count) and
its queue alone. Only jobs
that completed count: a failed or cancelled run says little about a full one.
Per key the state keeps the newest SAMPLES_KEPT run times, and at most KEYS_KEPT
keys (the least recently updated leave first, deterministically by log order),
so a long-lived cluster's state and snapshot stay bounded.

The estimate (the policy `Policies.estimate`, `learned_estimate` by default) is
the median of the most specific key's samples -- the job's own key, else its
queue's jobs of its size, else its queue's -- with its source (which key, how
many runs). Backfill reads it when no time limit says when a running gang
ends: a reservation behind such gangs names an estimated start
(reservations.py) instead of "when running jobs end".

The fold reads it too: a pending job's place in its queue's line is its
remaining claim (`claim_of`: GPUs x run time - GPU-seconds attained), fixed
when it joins the line, from its time limit or else the estimate of that
moment (issue #29: shortest claim first inside a queue, without a sort per
cycle; a trace whose jobs carry neither a time limit nor a user orders each
queue by its (queue, GPU count) history alone).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from orchestrator.core.model.state import HOLDING, ClusterState, Job

#: Run times kept per key (the median of these is the estimate).
SAMPLES_KEPT = 8
#: Keys kept; past this the least recently updated one is dropped.
KEYS_KEPT = 4096
_SEP = "\x1f"


class Estimate(NamedTuple):
    """A learned run time (seconds a job holds its GPUs in all) and where it comes from."""

    seconds: float
    #: "job" (same queue, user and name), "gpus" (same queue and GPU count) or "queue" (same queue).
    source: str
    #: Runs it is the median of.
    samples: int
    #: The key's readable form: "name 'train' of alice in queue a" / "queue a".
    about: str

    def describe(self) -> str:
        runs = "1 run" if self.samples == 1 else f"{self.samples} runs"
        return f"~{self.seconds:.0f} s, median of {runs} of {self.about}"


def job_key(queue: str, user: str, name: str) -> str:
    return _SEP.join(("job", queue, user, name))


def gpus_key(queue: str, gpus: int) -> str:
    return _SEP.join(("gpus", queue, str(gpus)))


def queue_key(queue: str) -> str:
    return _SEP.join(("queue", queue))


def run_seconds(job: Job, at: float) -> float:
    """Seconds `job` held GPUs over all its attempts, if it ends at `at` (a CPU-only gang: its last attempt)."""
    earlier = job.attained_s / job.gpus if job.gpus > 0 else 0.0
    return earlier + max(0.0, at - job.reserved_at)


def record(durations: dict[str, tuple[float, ...]], job: Job, at: float) -> None:
    """The fold's part: remember how long a job that completed at `at` ran (in place; bounded)."""
    seconds = run_seconds(job, at)
    if not math.isfinite(seconds):
        return
    keys = (job_key(job.queue, job.submitted_by, job.spec.name), gpus_key(job.queue, job.spec.total_gpus),
            queue_key(job.queue))
    for key in keys:
        kept = durations.pop(key, ())  # re-inserted last: the dict's order is the update order
        durations[key] = (*kept[-(SAMPLES_KEPT - 1):], seconds)
    while len(durations) > KEYS_KEPT:
        del durations[next(iter(durations))]


def learned_estimate(state: ClusterState, job: Job, queue: str) -> Estimate | None:
    """The median run time of the newest completed runs like `job` (its own key, else its size's in `queue`, else
    `queue`'s), or None."""
    durations = state.durations
    name, user = job.spec.name, job.submitted_by
    runs = durations.get(job_key(queue, user, name))
    if runs:
        who = f" of {user}" if user else ""
        return Estimate(_median(runs), "job", len(runs), f"name {name!r}{who} in queue {queue}")
    gpus = job.spec.total_gpus
    runs = durations.get(gpus_key(queue, gpus))
    if runs:
        return Estimate(_median(runs), "gpus", len(runs), f"{gpus}-GPU jobs in queue {queue}")
    runs = durations.get(queue_key(queue))
    if runs:
        return Estimate(_median(runs), "queue", len(runs), f"queue {queue}")
    return None


#: Where a pending job's claim comes from besides a learned estimate's source: its time limit, or nothing yet.
LIMIT, UNKNOWN = "limit", ""


def claim_of(state: ClusterState, job: Job, queue: str) -> tuple[float, str]:
    """GPU-seconds `job` still claims, and the claim's source (LIMIT, an `Estimate.source`, or UNKNOWN).

    Its GPUs x its run time -- the time limit if it has one, else the run time
    learned from the log -- less the GPU-seconds its earlier attempts held
    (never below 0). With nothing known the claim is 0: such a job keeps its
    arrival order ahead of estimated ones (a cold cluster is FIFO inside a
    queue) rather than starving behind jobs that joined the line after it.
    """
    limit = job.spec.time_limit_s
    if limit is not None:
        seconds, source = limit, LIMIT
    else:
        est = learned_estimate(state, job, queue)
        if est is None:
            return 0.0, UNKNOWN
        seconds, source = est.seconds, est.source
    return max(0.0, job.spec.total_gpus * seconds - job.attained_s), source


def _median(xs: tuple[float, ...]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def estimated_end(estimate: Estimate, job: Job, now: float) -> float | None:
    """When a gang holding GPUs (or placed at `now`) is expected to end by `estimate`: never before `now`.

    None: a gang with no run of its own that has already held its GPUs longer than its queue's median. That
    median is other jobs' run time, and this one has shown it is not like them: "ends now", told again every
    cycle, would promise the jobs waiting behind it a start at once, forever. (A job's own history overrun
    still says "now": the same job usually ended by then.)
    """
    if job.status not in HOLDING:
        return now + estimate.seconds
    end = job.reserved_at + estimate.seconds - (job.attained_s / job.gpus if job.gpus > 0 else 0.0)
    if end < now and estimate.source != "job":  # the queue's jobs (of its size or all), not its own
        return None
    return max(now, end)
