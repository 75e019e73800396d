"""The starvation bound (issue #29): how long a big gang may wait before it may stop others to start.

Inside a queue the line is shortest claim first (estimates.claim_of), so a
big gang -- a large claim -- is overtaken by every smaller job that arrives
while it waits; on a loaded cluster it would wait for a lull. The bound: a
pending gang of BIG_GANG_GPUS or more GPUs that has waited
`Policies.starvation_bound_s` (T) is starving. Starving gangs are judged
before every other head, oldest first (after the preemptors whose GPUs are
earmarked), and when they do not fit they may stop the cheapest running
gangs of queues at or above their guarantee (`Policies.starvation_rule`,
policies/victims.py: protection doubling with each stop, no job stopped more
than STARVATION_STOPS_MAX times). So a big gang's wait is about T plus its
victims' grace, whatever the load (measured in bench/RESULTS.md).

The fold keeps the big pending gangs apart, sorted by how long they waited
(`ClusterState.big_pending`), so a cycle reads only those past the bound.

A relative bound (issue #42, `Policies.starvation_bound_factor` > 0, the default): a gang
whose run time is known (its line claim, `Job.claim`: GPUs x time limit, else x
the learned run time) starves after factor x that run time, at least
`Policies.starvation_bound_floor_s` and at most T; a gang of unknown run time after
T. A fixed T cannot be short for a short gang and long for a long one: at light load
a 64-GPU gang of 20 minutes waited 13-33 h for a lull that fifo-backfill's
reservation gave it in a few hours (bench/RESULTS.md).
"""

from __future__ import annotations

import math

from orchestrator.core.cycle import Cycle
from orchestrator.core.model.state import BIG_GANG_GPUS, FREE, ClusterState, Job
from orchestrator.core.model.usage import resolve_queue


def starving_from(job: Job, bound_s: float, factor: float = 0.0, floor_s: float = 0.0) -> float | None:
    """When `job` starts starving under the bound `bound_s` (its wait since joining the line + T), or None
    if it never does (too small a gang, or no bound). `factor` > 0: the relative bound (module docstring)."""
    if job.spec.total_gpus < BIG_GANG_GPUS or not math.isfinite(bound_s):
        return None
    return job.waiting_since + bound_for(job, bound_s, factor, floor_s)


def bound_for(job: Job, bound_s: float, factor: float, floor_s: float) -> float:
    """A big gang's bound: T, or with `factor` > 0 and a known claim, factor x its run time within [floor, T]."""
    if factor <= 0.0 or not job.claim_from or job.spec.total_gpus <= 0:
        return bound_s
    return min(bound_s, max(floor_s, factor * job.claim / job.spec.total_gpus))


def is_starving(c: Cycle, job: Job) -> bool:
    pol = c.policies
    at = starving_from(job, pol.starvation_bound_s, pol.starvation_bound_factor, pol.starvation_bound_floor_s)
    return at is not None and c.now >= at


def starving_gangs(c: Cycle, busy: set[str]) -> list[tuple[Job, str]]:
    """The pending gangs past the bound, oldest first (by waiting since, then id), with their queues.

    The fold keeps them sorted so (`ClusterState.big_pending`): a cycle reads the prefix past the
    bound. A preemptor whose GPUs are earmarked waits on its victims, not on the bound: it is
    judged before these (`earmarked`).
    """
    state, pol = c.state, c.policies
    bound, factor, floor_s = pol.starvation_bound_s, pol.starvation_bound_factor, pol.starvation_bound_floor_s
    out: list[tuple[Job, str]] = []
    if not math.isfinite(bound):
        return out
    # Relative: no gang starves before the floor; past it each gang by its own bound.
    first = min(bound, floor_s) if factor > 0.0 else bound
    for since, jid in state.big_pending:
        if since + first > c.now:
            break
        job = state.jobs[jid]
        if jid in busy or job.earmark or job.status != "pending":
            continue
        if factor > 0.0 and since + bound_for(job, bound, factor, floor_s) > c.now:
            continue
        out.append((job, resolve_queue(state, job.spec.queue)))
    return out


def earmarked(state: ClusterState, busy: set[str]) -> list[tuple[Job, str]]:
    """The pending preemptors holding earmarked GPUs, by waiting since then id, with their queues.

    They are judged before anyone else: each starts on its earmark as soon as its victims are
    gone. In a line ordered by claim a big preemptor may sit deep behind small jobs that a cycle
    never reaches (issue #29: without this, allocation fell to 59%).
    """
    ids: dict[str, None] = {}
    for marks in state.earmarks.values():
        for owner in marks:
            if owner != FREE:
                ids[owner] = None
    jobs = [j for jid in ids if jid not in busy and (j := state.jobs.get(jid)) is not None and j.status == "pending"]
    jobs.sort(key=lambda j: (j.waiting_since, j.job_id))
    return [(j, resolve_queue(state, j.spec.queue)) for j in jobs]
