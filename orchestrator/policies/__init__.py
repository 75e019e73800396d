"""Scheduling policies: plain typed functions in one frozen record, not a string registry.

`decide` calls only what is in `Policies`; a test or an operator swaps one
function by building another record (`dataclasses.replace(DEFAULT_POLICIES,
place=my_place)`), and mypy checks the signature.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from orchestrator.core.model.capacity import FreeIndex
from orchestrator.core.model.estimates import Estimate, told_estimate
from orchestrator.core.model.facts import ClusterFacts
from orchestrator.core.model.plan import Hold, QueueLoad
from orchestrator.core.model.state import ClusterState, Job
from orchestrator.policies.backfill import Ending, earliest_start, longest_waiting
from orchestrator.policies.fairshare import JobKey, QueueKey, fair_share_key
from orchestrator.policies.placement import GangRequest, LinksOf, Placement, fits, place_gang, request_of
from orchestrator.policies.reject import unfit_reasons
from orchestrator.policies.victims import (
    PRIORITY_AND_RECLAIM,
    STARVATION,
    Candidate,
    PreemptionAsk,
    PreemptionRule,
    find_victims,
)

FitsFn = Callable[[GangRequest, FreeIndex], bool]
PlaceFn = Callable[[GangRequest, FreeIndex, LinksOf], Placement | None]
VictimsFn = Callable[
    [
        PreemptionAsk,
        Sequence[Candidate],
        FreeIndex,
        Mapping[str, QueueLoad],
        FitsFn,
        Callable[[Sequence[Candidate]], bool],
        PreemptionRule,
    ],
    list[Candidate] | None,
]
BackfillFn = Callable[[GangRequest, FreeIndex, Iterable[Ending], FitsFn, PlaceFn, LinksOf], Hold | None]


@dataclass(frozen=True, slots=True)
class Policies:
    #: Gang + topology placement: all ranks or None.
    place: PlaceFn = place_gang
    #: Capacity-only feasibility (same answer as `place` is not None, cheaper).
    fits: FitsFn = fits
    request: Callable[[Job], GangRequest] = request_of
    #: Order inside a queue. None declares the fold's line order (`fairshare.job_order_key`: higher
    #: priority, smallest remaining claim, longest waiting, job id), which `ClusterState.lines` keeps sorted, so a
    #: cycle reads those lines as they are; a key function, even one ordering alike, sorts the
    #: pending jobs once per cycle (core/lines.py).
    job_key: Callable[[Job], JobKey] | None = None
    queue_key: Callable[[QueueLoad], QueueKey] = fair_share_key
    victims: VictimsFn = find_victims
    #: Who may preempt whom and in which order victims go (priority and guarantee reclaim by default).
    preemption: PreemptionRule = PRIORITY_AND_RECLAIM
    backfill: BackfillFn = earliest_start
    #: Who gets a free backfill reservation out of turn. A key (default `backfill.longest_waiting`):
    #: among the queue heads blocked by capacity that have waited longer than
    #: `reservation_aging_s` (bounded aging), the first in that order -- after the heads before
    #: it in that order that fit now, which start first (as in EASY backfill). Every other
    #: reservation goes to the first gang the fair-share loop finds blocked by capacity, and a
    #: held reservation is charged to its queue's share (core/reservations.py), so reservations follow fair
    #: share on a full cluster. None: fair-share order only.
    reservation_order: Callable[[Job], JobKey] | None = longest_waiting
    #: Bounded aging of reservations: a blocked gang pending longer than this may take a free
    #: reservation before the fair-share order (math.inf: never; 0: always, which is global
    #: FIFO on a full cluster -- bench/RESULTS.md). Only gangs larger than the smallest blocked
    #: head age: a gang the smallest jobs cannot overtake gains nothing from a reservation.
    reservation_aging_s: float = 4 * 3600.0
    #: Blocked gangs that hold a backfill reservation at once (Slurm's backfill plans many;
    #: EASY backfill is 1). Each later one is planned around the earlier ones' GPUs; a job
    #: uses held GPUs only if it ends before every reservation starts.
    reservations: int = 2
    #: A blocked gang of BIG_GANG_GPUS (9) or more holds a backfill reservation only once it has
    #: waited this long (issue #29: no reservations for young gangs -- their held GPUs idle while
    #: shorter claims could use them -- so, by default, only big gangs past the starvation bound
    #: that found no victims hold one; and those of a queue holding less than its guarantee, at
    #: once: core/heads.py). Smaller gangs keep theirs: on a full cluster their
    #: reservations are how fair share decides who gets each GPU that comes back (issue #20).
    #: 0: any blocked gang may hold one (before #29).
    reserve_after_s: float = 36 * 3600.0
    #: Aging: a queue head pending longer than this goes before the fair-share order, oldest
    #: first (off by default: under overload every head starves and the order becomes FIFO).
    starving_after_s: float = math.inf
    #: The starvation bound (issue #29, core/starving.py): a pending gang of BIG_GANG_GPUS (9) or more
    #: GPUs that has waited this long is judged before everyone but the preemptors with earmarked
    #: GPUs, oldest first, and may stop the cheapest running gangs of queues at or above their
    #: guarantee (`starvation_rule`). math.inf: off. The default is chosen from the sweep
    #: (bench/RESULTS.md, issue #29): shorter bounds trade average JCT for the big gangs' wait.
    starvation_bound_s: float = 36 * 3600.0
    #: The relative starvation bound (issue #42, core/starving.py; 0: off, every big gang's bound is
    #: `starvation_bound_s`): a big gang whose run time is known (its line claim) starves after this
    #: many times its run time, at least `starvation_bound_floor_s`, at most `starvation_bound_s`; it
    #: may then also hold a backfill reservation (`reserve_after_s` stays the most a gang waits for one).
    #: 1.0 by default since round 3: with checkpoints visible to victim choice it meets the big-gang
    #: wait bound at every point of the sweep and keeps the GPU-hours lost under 2% (bench/RESULTS.md).
    starvation_bound_factor: float = 1.0
    starvation_bound_floor_s: float = 3600.0
    #: Least attained service inside a queue (issue #42, policies/in_queue_service.py, core/service_preemption.py;
    #: 0: off): a pending job that is not starving may stop running jobs of its own queue of a higher
    #: service level (4 / 64 GPU-hours), no higher priority, each holding at most max(8, its GPUs) GPUs,
    #: cheapest first, within the 3-stop cap. GPUs never move between queues.
    service_preemption: int = 0
    #: Another order inside each queue (issue #42, policies/in_queue_service.py `LINE_ORDERS`; 0: the fold's
    #: line): 1 priority, service level, then the fold's order; 2 priority, the jobs stopped before first, then
    #: the fold's order; 3 priority, then the remaining claim per GPU (run time, not GPU-hours). On, a cycle
    #: sorts the backlog (as any `job_key` function does).
    line_order: int = 0
    #: Shortest run time across queues, within fair share (issue #42, policies/fairshare.py `run_time_tilted`;
    #: 0: off): each queue's weighted share in the fair-share order counts (1 + its head's run time in
    #: `share_tilt_unit_s`) ** this, the run time being the head's line claim per GPU (its time limit, else the learned run time;
    #: a head of unknown run time counts as 0). A queue whose next job is short goes before one whose next
    #: job is long at a somewhat lower share: the order across queues leans toward global shortest-job-first,
    #: as the order inside each queue already is. 3 (with `share_tilt_above_mean`) by default since round 3:
    #: on the load sweep it cuts average JCT 6-17% at loads 1.0-1.2 and keeps the worst queue's share error
    #: within DRF's wherever the untilted order did (bench/RESULTS.md, issue #42).
    share_tilt: float = 3.0
    #: The run time that counts as one unit in `share_tilt`'s (1 + run time / unit) (seconds), and the most the
    #: factor weighs a share (math.inf: no cap): a cap bounds how far below its share a queue of long jobs falls.
    share_tilt_unit_s: float = 3600.0
    share_tilt_max: float = math.inf
    #: 1: the tilt weighs only the shares of queues at or above the mean weighted share of the top-level queues
    #: using GPUs (issue #42; 0: every queue's): a queue below it is never pushed further below its share.
    share_tilt_above_mean: int = 1
    #: The most GPUs a victim of `service_preemption` holds, or as many as its preemptor asks for if more
    #: while `service_bigger_victims` is 1 (0: never more than `service_victim_gpus`).
    service_victim_gpus: int = 8
    service_bigger_victims: int = 1
    #: Hold instead of stop (issue #42, core/heads.py `_near_reservation`; 0: off): a starving gang whose
    #: backfill reservation would start within this many times its run time (its line claim per GPU) holds
    #: it and stops nobody, while fewer than `reservations` gangs hold one; a farther start preempts as before.
    starvation_hold_factor: float = 0.0
    #: Starvation victims by remaining time (issue #42, victims.py `longest_remaining_first`; 0: off): victims
    #: that lose at most this many seconds per GPU (`victim_cost` / GPUs) go first, the longest remaining
    #: (expected end by time limit) first; then the others, cheapest first. On, only the ordered set is taken.
    #: 30 min by default since round 3: a short job near its end is no longer the one stopped, so it finishes
    #: instead of waiting again (stops fell 44-66% at loads 1.0-1.2; bench/RESULTS.md, issue #42).
    starvation_longest_first_s: float = 1800.0
    #: Who a starving gang may stop, and in which order (victims.STARVATION: cheapest first).
    starvation_rule: PreemptionRule = STARVATION
    #: Judge the preemptors whose GPUs are earmarked before every other head (core/starving.py:
    #: `earmarked`): in a line ordered by claim a big preemptor may sit where a cycle never looks.
    #: False: in their line's order, as the baselines do.
    earmarked_first: bool = True
    #: Whether a job ending at the given time may run on a reservation's held GPUs. None declares
    #: the default rule (`backfill.may_use_held`: only if it ends, by its time limit, before the
    #: reservation starts), which admission reads as one comparison with the earliest start of the
    #: cycle's reservations; under it no placement on held GPUs outlasts a told reservation, so
    #: such a placement leaves `Admitted.complete` as it is (core/completeness.py). A rule function,
    #: even one deciding alike, is asked per reservation and makes such a cycle incomplete.
    may_use_held: Callable[[float, Hold], bool] | None = None
    #: A job's run time learned from the log (state, job, its queue): backfill names an estimated
    #: start from it where running gangs have no time limit (core/model/estimates.py). None: no estimate.
    estimate: Callable[[ClusterState, Job, str], Estimate | None] = told_estimate
    reject: Callable[[Job, ClusterFacts], tuple[str, ...]] = unfit_reasons
    #: Blocked heads tried per queue per cycle (placements do not count): bounds a cycle's work.
    heads_per_queue: int = 32
    #: New (unexplained) jobs a cycle checks and tells a first reason, oldest arrival first; the rest
    #: wait in their lines for the next cycles (core/backlog.py). Each costs ~20 us (the spec check,
    #: the estimate, a JobWaiting), so a burst costs a cycle ~10 ms of CPU whatever its size
    #: (#34: one call met 50,000 and held the scheduler's loop 1.3 CPU s, past the lease's TTL).
    fresh_per_cycle: int = 500
    #: Gangs the fair-share loop places per cycle; the next cycle goes on where it stopped
    #: (core/admit.py). ~80-150 us each at 4,096 nodes (with the JobRunning that follows): an empty
    #: cluster is filled in cycles of ~20 ms of CPU instead of one of 0.5 s.
    placements_per_cycle: int = 128
    #: Follow-up events one cycle appends (core/react.py, #40): completions, stops, restarts, requeues,
    #: JobRunning, the ends of pending jobs. Past it the rest wait for the next cycles, in an order of
    #: classes (the ends and stops of gangs first, then the requeues of gangs hit by failures, oldest
    #: gang first, then JobRunning, then the ends of pending jobs), and a capped cycle decides nothing
    #: else: admission waits until the plan knows every GPU the follow-ups free. A mass NodeFailed
    #: (4,096 nodes, 4,239 gangs) otherwise made one call requeue them all (bench/followups.py).
    followups_per_cycle: int = 512
    #: Victim searches per cycle (each costs O(running gangs)).
    preemption_searches: int = 8
    #: Extra wait after a grace period before a stopped or preempted gang is declared gone.
    stop_margin_s: float = 10.0
    #: Prefer nodes whose dataset cache holds a job's datasets among placements of equal topology quality
    #: (issue #33: core/locality.py, policies/placement.py). False: placement ignores the caches (a spec's
    #: `locality: require` still holds); the simulator compares the two.
    prefer_warm: bool = True

    def __post_init__(self) -> None:
        # A bound of 0 would leave every new job, placement or follow-up to a next cycle forever.
        for name in ("fresh_per_cycle", "placements_per_cycle", "followups_per_cycle"):
            if getattr(self, name) < 1:
                raise ValueError(f"Policies.{name} must be at least 1, got {getattr(self, name)}")


DEFAULT_POLICIES = Policies()

__all__ = ["DEFAULT_POLICIES", "Candidate", "Ending", "Policies", "PreemptionAsk", "PreemptionRule"]
