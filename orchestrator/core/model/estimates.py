"""Run times learned from the log's own history (issue #20 point 5; Helios' QSSF idea).

The fold records how long each completed job held its GPUs (all attempts: a
preempted job's earlier attempts count, the wait between them does not) under
four keys: the job's (queue, submitted_by, name), its (queue, submitted_by, GPU
count), its (queue, GPU count) and its queue alone. Only jobs
that completed count: a failed or cancelled run says little about a full one.
Per key the state keeps the newest SAMPLES_KEPT run times, and at most KEYS_KEPT
keys (the least recently updated leave first, deterministically by log order),
so a long-lived cluster's state and snapshot stay bounded.

What corral *tells* (the policy `Policies.estimate`, `told_estimate` by default:
`corral job`, `corral explain`, a reservation's expected start) is a run time
learned only from runs like the job (#41): the median of the same user's runs
of the same name (at least MIN_SAME_NAME of them), else of the same user's runs
of the same GPU count in the queue (at least MIN_SAME_SIZE). Anything less --
one run, other users' jobs, the queue's tiny test jobs -- is "not known", not a
number: a queue's `sleep 0` runs made every new job "~0 s", and a start
"expected" at a moment already past. A gang that has held its GPUs longer than
its estimate has shown the estimate wrong for it: its end is not known
(`told_end`), never "now". `expected_start` is the one function `corral job`
and `corral explain` tell a reservation's start by, from the state as it is
now (never a moment already past).

Backfill's reservation names an estimated start (reservations.py) from it
instead of "when running jobs end".

The fold reads `learned_estimate` (any history is better than none for an
order, which nobody reads as a promise): a pending job's place in its queue's
line is its remaining claim (`claim_of`: GPUs x run time - GPU-seconds
attained), fixed when it joins the line, from its time limit or else the
learned estimate of that moment (issue #29: shortest claim first inside a queue, without a sort per
cycle; a trace whose jobs carry neither a time limit nor a user orders each
queue by its (queue, GPU count) history alone).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

from orchestrator.core.model.running import ends_at
from orchestrator.core.model.state import FREE, HOLDING, RESERVING, ClusterState, Job
from orchestrator.core.model.usage import resolve_queue

#: Run times kept per key (the median of these is the estimate).
SAMPLES_KEPT = 8
#: Completed runs of the same user and name a told estimate needs; of the same user and GPU count (in the queue).
MIN_SAME_NAME = 2
MIN_SAME_SIZE = 3
#: Keys kept; past this the least recently updated one is dropped.
KEYS_KEPT = 4096
_SEP = "\x1f"


class Estimate(NamedTuple):
    """A learned run time (seconds a job holds its GPUs in all) and where it comes from."""

    seconds: float
    #: "job" (same queue, user and name), "user_gpus" (same queue, user and GPU count), "gpus" (same queue and
    #: GPU count) or "queue" (same queue).
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


def user_gpus_key(queue: str, user: str, gpus: int) -> str:
    return _SEP.join(("user_gpus", queue, user, str(gpus)))


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
    gpus = job.spec.total_gpus
    keys = (job_key(job.queue, job.submitted_by, job.spec.name), user_gpus_key(job.queue, job.submitted_by, gpus),
            gpus_key(job.queue, gpus), queue_key(job.queue))
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


def told_estimate(state: ClusterState, job: Job, queue: str) -> Estimate | None:
    """The run time corral tells of `job` (module docstring): the median of at least MIN_SAME_NAME runs of its
    name by its user in `queue`, else of at least MIN_SAME_SIZE runs of its user's jobs of its GPU count there;
    None (not known) with fewer."""
    durations = state.durations
    name, user, gpus = job.spec.name, job.submitted_by, job.spec.total_gpus
    runs = durations.get(job_key(queue, user, name), ())
    who = f" of {user}" if user else ""
    if len(runs) >= MIN_SAME_NAME:
        return Estimate(_median(runs), "job", len(runs), f"name {name!r}{who} in queue {queue}")
    runs = durations.get(user_gpus_key(queue, user, gpus), ())
    if len(runs) >= MIN_SAME_SIZE:
        return Estimate(_median(runs), "user_gpus", len(runs), f"{gpus}-GPU jobs{who} in queue {queue}")
    return None


def told_end(estimate: Estimate, job: Job, now: float) -> float | None:
    """When a gang holding GPUs is expected to let them go by `estimate`; None (not known) once it has held them
    longer than that: the estimate is wrong for it, and "now" told again every minute would be a promise
    broken every minute. A job not placed: `now` plus the estimate."""
    if job.status not in HOLDING:
        return now + estimate.seconds
    end = job.reserved_at + estimate.seconds - (job.attained_s / job.gpus if job.gpus > 0 else 0.0)
    return end if end >= now else None


class Start(NamedTuple):
    """When a pending job is expected to start (`at`, None: not known) and why, for a person."""

    at: float | None
    why: str


def expected_start(state: ClusterState, job: Job, now: float, margin_s: float = 0.0,
                   estimate: Callable[[ClusterState, Job, str], Estimate | None] | None = None) -> Start | None:
    """When the reservation `job` holds should start, from the state as it is at `now`; None: it holds none.

    The gangs it waits for are those on the GPUs the log told it holds (`Waiting.hold_ranks`), or those the
    scheduler named (`Waiting.behind`) when their ends had no time limit. Each ends by its time limit, else by
    its told estimate; the start is the latest of those, never before `now`. A gang with neither, or one that
    has outrun its estimate, makes the start not known. `corral job` and `corral explain` both tell it.
    """
    w = job.waiting
    if job.status != "pending" or w is None or w.code != RESERVING:
        return None
    estimate = estimate or told_estimate
    gangs: dict[str, None] = dict.fromkeys(w.behind)
    for rp in w.hold_ranks:
        owners = state.owners.get(rp.node_id, ())
        gangs.update((owners[g], None) for g in rp.gpus if g < len(owners) and owners[g] != FREE)
    if not gangs:
        return Start(None, "not known: the scheduler told no gang it waits for") if not w.hold_ranks else \
            Start(now, "any moment: the GPUs it holds are free")
    start, last, ended = now, "", 0
    for jid in gangs:
        other = state.jobs.get(jid)
        if other is None or other.status not in HOLDING:
            ended += 1  # (its GPUs are back)
            continue
        end = ends_at(other, margin_s)
        how = "by its time limit"
        if not math.isfinite(end):
            est = estimate(state, other, other.queue)
            told = told_end(est, other, now) if est is not None else None
            if told is None:
                why = "has outrun its estimate" if est is not None else "has neither a time limit nor a run-time " \
                      "estimate (too few completed runs like it)"
                return Start(None, f"not known: job {jid}, whose GPUs it waits for, {why}")
            end, how = told, f"by its estimate, {est.describe()}" if est is not None else how
        if end >= start:
            start, last = end, f"when job {jid} ends {how}"
        elif not last:
            last = f"any moment: job {jid}, whose GPUs it waits for, is past its time limit"
    if not last and ended and not w.hold_ranks:
        # The gangs the scheduler named have ended, and it has not told what the job waits for since.
        return Start(None, "not known: the gangs it waited for have ended; it starts when the scheduler next "
                           "finds room")
    return Start(start, last or "any moment: the gangs it waits for have ended")


def line_place(state: ClusterState, job: Job) -> str | None:
    """A reservation holder's place in its queue's line as the state is now: "first in line" for exactly one
    holder of each queue -- the oldest reservation, looked at first in every cycle (`ClusterState.holders`) --
    "next in line after J" for the others; None for a job holding no reservation. (A place written into the
    scheduler's message went stale: two holders of one queue both said "first in line".)"""
    w = job.waiting
    if job.status != "pending" or w is None or w.code != RESERVING:
        return None
    queue = resolve_queue(state, job.spec.queue)
    before = ""
    for jid in state.holders:
        if jid == job.job_id:
            return f"next in line after {before}" if before else "first in line"
        other = state.jobs.get(jid)
        if other is not None and other.status == "pending" and other.waiting is not None \
                and other.waiting.code == RESERVING and resolve_queue(state, other.spec.queue) == queue:
            before = jid
    return "first in line"  # (not a holder the fold knows: a log cut short)


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
