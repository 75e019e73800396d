"""The named policies: corral's defaults and four baselines over the same core, by name.

The simulator compares them (`corral sim --policy`) and the live scheduler runs any one of them
(`corral scheduler --policy NAME`): the same records in both, so a simulated policy is the one
that would run.

Every baseline is a `Policies` record -- the production `decide` runs
unchanged, only the functions in the record differ -- so a difference in the
results is a difference of policy, not of implementation:

* corral        -- DEFAULT_POLICIES: weighted fair share across queues (owed
                   guarantees first), priority then the smallest remaining
                   claim inside one (issue #29), gang/topology best fit,
                   backfill reservations for the two longest-waiting blocked
                   queue heads (gangs of 9+ GPUs only past the starvation
                   bound or below their queue's guarantee), preemption for priority, for reclaiming
                   guarantees and for gangs past the starvation bound (relative to
                   their run time; victims that just saved, the longest remaining
                   first: issue #42); across queues the fair-share order leans
                   toward queues whose head is short (`share_tilt`).
* fifo          -- one line across all queues in submit order (priority
                   ignored); the first gang that does not fit holds every
                   free GPU, so nothing behind it starts (no backfill, no
                   preemption).
* fifo-backfill -- Slurm-like: the same one line; the first blocked gang holds
                   the GPUs it will start on and later jobs use them only if
                   their time limit ends first, other free GPUs go to whoever
                   fits (EASY backfill, no preemption).
* drf           -- queues in order of the GPUs they hold per weight (DRF with
                   one resource), priority then arrival inside one, greedy,
                   no reservation, no preemption.
* las           -- least attained service, Tiresias-like
                   (orchestrator/policies/las.py): one line across queues,
                   jobs by level of attained GPU-seconds (read from the fold)
                   then arrival; a job preempts running gangs of a higher
                   level that ran min_runtime_s; greedy, no reservation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace

from orchestrator.core.model.capacity import FreeIndex
from orchestrator.core.model.plan import Hold, QueueLoad
from orchestrator.core.model.state import Job
from orchestrator.policies import DEFAULT_POLICIES, Ending, Policies
from orchestrator.policies.backfill import FitsFn, PlaceFn
from orchestrator.policies.fairshare import JobKey, QueueKey, arrival_order_key
from orchestrator.policies.las import LEAST_ATTAINED_SERVICE, least_attained_first
from orchestrator.policies.placement import GangRequest, LinksOf
from schemas.events import RankPlacement

POLICY_NAMES = ("corral", "fifo", "fifo-backfill", "drf", "las")


def submit_order(job: Job) -> JobKey:
    """Strict arrival order: a FIFO scheduler has no priorities."""
    return (job.submitted_at, job.job_id)


def one_line(load: QueueLoad) -> QueueKey:
    """Every queue ranks the same, so the heads merge by their job keys into one line."""
    del load
    return (0, 0.0, "")


def dominant_share(load: QueueLoad) -> QueueKey:
    """DRF with one resource: the queue holding the fewest GPUs per weight goes first."""
    return (0, load.gpus / max(load.weight, 1e-9), load.name)


def hold_everything(
    req: GangRequest, index: FreeIndex, ending: Iterable[Ending], fits: FitsFn, place: PlaceFn, links_of: LinksOf
) -> Hold:
    """Strict FIFO: the first blocked gang holds every free GPU, with no end time, so no job behind it starts."""
    del ending, fits, place, links_of
    ranks = tuple(
        RankPlacement(rank=i, node_id=node, gpus=gpus)
        for i, (node, gpus) in enumerate((n, g) for n, g in index.free.items() if g)
    )
    return Hold(job_id=req.job_id, until=math.inf, ranks=ranks)


def no_reservation(
    req: GangRequest, index: FreeIndex, ending: Iterable[Ending], fits: FitsFn, place: PlaceFn, links_of: LinksOf
) -> Hold | None:
    """Greedy schedulers keep nothing for a blocked gang."""
    del req, index, ending, fits, place, links_of
    return None


#: What the baselines share: no aging of queue heads, one reservation (if any) for the first
#: blocked gang in the policy's own order -- not corral's longest-waiting pair -- and, inside a
#: queue, priority then arrival: corral's fold orders its lines by claim (issue #29), and a
#: baseline that read them would no longer be the scheduler it is named after; nor do they
#: take #29's starvation bound, its earmarked-first step or its young-gang rule.
BASELINE = replace(DEFAULT_POLICIES, job_key=arrival_order_key, starving_after_s=math.inf, reservation_order=None,
                   reservations=1, reserve_after_s=0.0, starvation_bound_s=math.inf, starvation_bound_factor=0.0,
                   starvation_longest_first_s=0.0, share_tilt=0.0, share_tilt_above_mean=0, earmarked_first=False)


def policies_for(name: str) -> Policies:
    """The `Policies` record of a policy name (POLICY_NAMES)."""
    if name == "corral":
        return DEFAULT_POLICIES
    if name == "fifo":
        # One blocked head per queue is enough: behind the first, everything is held.
        return replace(BASELINE, job_key=submit_order, queue_key=one_line, backfill=hold_everything,
                       preemption_searches=0, heads_per_queue=1)
    if name == "fifo-backfill":
        return replace(BASELINE, job_key=submit_order, queue_key=one_line, preemption_searches=0)
    if name == "drf":
        return replace(BASELINE, queue_key=dominant_share, backfill=no_reservation, preemption_searches=0)
    if name == "las":
        return replace(BASELINE, job_key=least_attained_first, queue_key=one_line,
                       backfill=no_reservation, preemption=LEAST_ATTAINED_SERVICE)
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICY_NAMES)}")


def parse_policies(text: str) -> list[str]:
    """"corral,fifo" -> names, each known, in order, without repeats; "all" (alone) -> every policy."""
    if text.strip() == "all":
        return list(POLICY_NAMES)
    names = [n.strip() for n in text.split(",") if n.strip()]
    if "all" in names:
        raise ValueError(f"'all' stands alone (every policy); got {text.strip()!r}")
    unknown = [n for n in names if n not in POLICY_NAMES]
    if unknown or not names:
        raise ValueError(f"unknown policy {', '.join(unknown) or '(none)'}; known: {', '.join(POLICY_NAMES)}, "
                         "or 'all' alone")
    return list(dict.fromkeys(names))
