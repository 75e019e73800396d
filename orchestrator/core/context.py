"""What one cycle's admission shares between the heads it judges (built lazily, dropped with the cycle).

Owner and lifetime: `admit` builds one `AdmitContext` per decide call and
every head's judgment reads and extends it; nothing in it outlives the call.
It holds the events decided so far, lazily derived views of the state
(running gangs, preemption candidates, preemptors' victims), answers of
placement answers that stay true while free GPUs only shrink, and the facts
the skip certificate (`completeness.py`) is judged on.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from orchestrator.core.cycle import Cycle
from orchestrator.core.explain import Outcome, capacity_outcome
from orchestrator.core.locality import cache_index, located
from orchestrator.core.model.capacity import FreeIndex
from orchestrator.core.model.memo import REQUESTS_KEPT
from orchestrator.core.model.plan import Plan, QueueLoad
from orchestrator.core.model.running import RunningGangs, running_gangs
from orchestrator.core.model.state import Job, attained_service
from orchestrator.core.reserved_nodes import restricted
from orchestrator.core.starving import is_starving
from orchestrator.policies import Candidate, Ending, PreemptionAsk, PreemptionRule
from orchestrator.policies.links import Links
from orchestrator.policies.placement import GangRequest, Placement, request_of
from schemas.events import Event

if TYPE_CHECKING:  # completeness imports this module (its Certificate is built by admit)
    from orchestrator.core.completeness import Certificate

#: A gang shape: what placement answers depend on besides the free GPUs.
Shape = tuple[object, ...]


def shape_of(req: GangRequest) -> Shape:
    return (req.cls, req.ranks, req.gpus_per_rank, req.level, req.required, req.warm, req.only)


def candidate_of(j: Job, now: float) -> Candidate:
    """A running gang as a victim search sees it: the record `AdmitContext.candidates` builds (inline there, for
    speed), for searches that look at a few gangs only (core/service_preemption.py)."""
    return Candidate(job_id=j.job_id, attempt=j.attempt, queue=j.queue, priority=j.spec.priority,
                     preemptible=j.spec.preemptible, started_at=j.reserved_at, gpus=j.gpus, placement=j.placement,
                     attained=attained_service(j, now), interruptions=max(0, j.attempt - 1 - j.restarts),
                     at_risk=j.gpus * _since_checkpoint(j, now), expected_end=_expected_end(j))


def _expected_end(j: Job) -> float:
    """When the attempt ends by its time limit (math.inf: none), for victim orders by remaining time."""
    limit = j.spec.time_limit_s
    return math.inf if limit is None else j.reserved_at + limit


def _since_checkpoint(job: Job, now: float) -> float:
    """Seconds of its attempt's work a stop now would lose: since the attempt began, less what its newest
    checkpoint of this attempt holds (issue #29: a victim just past a checkpoint loses little)."""
    ran = max(0.0, now - job.reserved_at)
    ckpt = job.checkpoint
    if ckpt is None or ckpt.attempt != job.attempt:
        return ran
    return max(0.0, ran - ckpt.after_s)


class AdmitContext:
    """What the admission of one cycle shares between heads (built lazily)."""

    def __init__(self, c: Cycle, plan: Plan, cert: Certificate) -> None:
        self.c = c
        self.plan = plan
        self.events: list[Event] = []
        #: Each judged job's verdict (`admit`'s answer; `completeness.final_verdicts` may restate some).
        self.outcomes: dict[str, Outcome] = {}
        self.searches = c.policies.preemption_searches
        self._eligible_jobs: list[Job] | None = None
        self._running: RunningGangs | None = None
        self._candidates: list[Candidate] | None = None
        self._victims_of: dict[str, list[str]] | None = None
        #: (plan charges, the candidate list, the loads of its queues): `candidate_loads`.
        self._candidate_loads: tuple[int, list[Candidate], dict[str, QueueLoad]] | None = None
        #: Gangs placed earlier in this cycle: they end too (backfill estimates).
        self.placed: list[Ending] = []
        #: Placement and fit answers of this cycle by gang shape (they stay true while free GPUs only
        #: shrink); not "memo", which names the caller-owned `Memo` that outlives the cycle.
        self.answers: dict[tuple[object, ...], object] = {}
        #: Victim searches that found nothing: shape/queue -> highest priority that failed.
        self.hopeless: dict[tuple[object, ...], float] = {}
        #: Victim searches that spent the budget without a `hopeless` entry (the next alike head searches too).
        self.unremembered_searches = 0
        #: (holds counted, the earliest start among them): the default may_use_held rule's bound.
        self.held_until: tuple[int, float] = (0, math.inf)
        #: A reservation of this cycle was planned afresh: a later holder cannot keep its told one past returns.
        self.replanned = False
        #: Limited queue -> the queue head its limit blocked first (in line order): its quota is
        #: kept for that gang (set once per cycle, before any head is judged: see quota_holds).
        self.quota_holds: dict[str, tuple[tuple[object, ...], str]] = {}
        #: What the skip certificate is judged on (`completeness.Certificate`), recorded as heads are judged.
        self.cert = cert
        #: Dataset cache key -> the nodes holding it (core/locality.py), built for the first job with datasets.
        self._caches: dict[str, list[str]] | None = None
        #: (rule, what it reads of the ask) -> (candidates, loads, the pool, its GPUs per queue): `victim_pool`.
        self._pools: dict[tuple[object, ...], tuple[list[Candidate], dict[str, QueueLoad], list[Candidate],
                                                    dict[str, int]]] = {}
        #: Job id -> whether it is past the starvation bound (`starving`): the state and `now` stand still all cycle.
        self._starving: dict[str, bool] = {}

    def starving(self, job: Job) -> bool:
        """`starving.is_starving`, once per job and cycle (a starving gang is asked about two or three times a cycle)."""
        found = self._starving.get(job.job_id)
        if found is None:
            found = self._starving[job.job_id] = is_starving(self.c, job)
        return found

    def starving_now(self, job: Job) -> None:
        """`job` is one of `starving.starving_gangs` (past its bound, by the fold's `big_pending`, which keeps
        each big pending gang under its `waiting_since`: so `is_starving` would say yes)."""
        self._starving[job.job_id] = True

    def request(self, job: Job) -> GangRequest:
        """`Policies.request`, with the nodes holding the job's datasets (core/locality.py) when it names any,
        and only the nodes the node reservations leave it."""
        fn = self.c.policies.request
        if fn is request_of:  # it reads the job's id and spec only: kept per job (Memo.requests)
            known = self.c.memo.requests
            found = known.get(job.job_id)
            if found is not None and found[0] is job.spec and isinstance(found[1], GangRequest):
                req = found[1]
            else:
                if len(known) >= REQUESTS_KEPT:
                    known.clear()
                req = fn(job)
                known[job.job_id] = (job.spec, req)
        else:
            req = fn(job)
        if job.spec.dataset_list:
            if self._caches is None:
                self._caches = cache_index(self.c.state)
            req = located(req, job.spec, self.c.state, self._caches, self.plan.eligible(req.cls),
                          prefer=self.c.policies.prefer_warm)
        return restricted(self.c.state, job, req, self.c.now)  # node reservations (core/reserved_nodes.py)

    # Free GPUs only shrink during admission (placements take, holds take, victims' GPUs go to
    # their preemptor), so a gang shape that found no room in the plan's shared index finds
    # none later in the cycle either: remember it instead of searching 64 leaves again.

    def place(self, req: GangRequest, index: FreeIndex, *, shared: bool) -> Placement | None:
        key = ("no room", shape_of(req))
        if shared and key in self.answers:
            return None
        p = self.c.policies.place(req, index, self.links_of)
        if p is None and shared:
            self.answers[key] = None
        return p

    def place_through_hold(self, req: GangRequest) -> Placement | None:
        """Place on free and held GPUs (held ones only shrink too, so a shape that found no room finds none later)."""
        key = ("no room through hold", shape_of(req))
        if key in self.answers:
            return None
        p = self.c.policies.place(req, self.plan.index(req.cls, through_hold=True), self.links_of)
        if p is None:
            self.answers[key] = None
        else:
            self.cert.through_hold = True
        return p

    def fits_now(self, req: GangRequest) -> bool:
        key = ("fits", shape_of(req), self.plan.version)
        found = self.answers.get(key)
        if found is None:
            found = self.answers[key] = self.c.policies.fits(req, self.plan.index(req.cls))
        return bool(found)

    def fits_through_hold(self, req: GangRequest) -> bool:
        key = ("through hold", shape_of(req), self.plan.version)
        found = self.answers.get(key)
        if found is None:
            found = self.answers[key] = self.c.policies.fits(req, self.plan.index(req.cls, through_hold=True))
        return bool(found)

    def capacity_outcome(self, req: GangRequest, index: FreeIndex, model: str | None, *, shared: bool) -> Outcome:
        """Why it does not fit; the numbers are computed once per shape until the plan changes."""
        if not shared:
            return capacity_outcome(req, index, model)
        key = ("why", shape_of(req), model, self.plan.version)
        found = self.answers.get(key)
        if not isinstance(found, Outcome):
            found = self.answers[key] = capacity_outcome(req, index, model)
        return found

    def links_of(self, node: str) -> Links:
        return self.c.state.nodes[node].inventory.links

    def running(self) -> RunningGangs:
        if self._running is None:
            self._running = running_gangs(self.c.state, self.c.memo)
        return self._running

    def _eligible(self) -> list[Job]:
        """Running preemptible gangs not yet decided on this cycle (`preempted` drops each victim)."""
        if self._eligible_jobs is None:
            state, busy = self.c.state, self.plan.busy
            jobs = state.jobs
            self._eligible_jobs = [
                j
                for jid in sorted(self.running().preemptible)
                if jid not in busy and (j := jobs[jid]).status in ("reserved", "running") and j.stop is None
            ]
            self._candidates = None
        return self._eligible_jobs

    def candidates(self) -> list[Candidate]:
        if self._candidates is None:
            # Built positionally in `Candidate`'s field order, with `state.attained_service` inlined (every
            # eligible gang holds GPUs): a cycle builds one per running preemptible gang, a tenth of corral's
            # time on an isolated trace, a third of it the keyword form's (issue #42's sim speed).
            # at_risk: the seconds of its attempt's work a stop now would lose -- since the attempt began, less
            # what its newest checkpoint of this attempt holds (issue #29: a victim just past one loses little).
            now, new = self.c.now, tuple.__new__
            out: list[Candidate] = []
            for j in self._eligible():
                gpus = j.gpus
                ran = max(0.0, now - j.reserved_at)
                ckpt = j.checkpoint
                kept = ran if ckpt is None or ckpt.attempt != j.attempt else max(0.0, ran - ckpt.after_s)
                spec = j.spec
                out.append(new(Candidate, (j.job_id, j.attempt, j.queue, spec.priority, spec.preemptible,
                                           j.reserved_at, gpus, j.placement, j.attained_s + gpus * ran,
                                           max(0, j.attempt - 1 - j.restarts), gpus * kept,
                                           math.inf if (limit := spec.time_limit_s) is None else j.reserved_at + limit)))
            self._candidates = out
        return self._candidates

    def candidate_loads(self) -> dict[str, QueueLoad]:
        """The loads of the candidates' queues, kept while no charge changes them (a victim search reads them)."""
        found = self._candidate_loads
        cands = self.candidates()
        if found is None or found[0] != self.plan.charges or found[1] is not cands:
            plan = self.plan
            found = self._candidate_loads = (plan.charges, cands,
                                             {q: plan.load(q) for q in dict.fromkeys(x.queue for x in cands)})
        return found[2]

    def victim_pool(self, ask: PreemptionAsk, rule: PreemptionRule) -> tuple[list[Candidate], dict[str, int]] | None:
        """The candidates `rule` lets `ask` stop (`find_victims`' pool, unordered) and their GPUs per queue,
        or None if the rule does not say what of the ask it reads (`PreemptionRule.reason_reads`).

        Kept per what the rule reads of the ask while the candidates and their queues' loads stand
        (`preempted` and a charge renew those lists): the starving gangs judged first ask alike.
        """
        if rule.reason_reads is None:
            return None
        cands, loads = self.candidates(), self.candidate_loads()
        key = (rule, rule.reason_reads(ask))
        found = self._pools.get(key)
        if found is None or found[0] is not cands or found[1] is not loads:
            pool = [c for c in cands if rule.reason(ask, c, loads)]
            freed: dict[str, int] = {}
            for v in pool:
                freed[v.queue] = freed.get(v.queue, 0) + v.gpus
            found = self._pools[key] = (cands, loads, pool, freed)
        return found[2], found[3]

    def could_preempt(self, queue: str, priority: int, owed: bool) -> bool:
        """Cheap necessary condition for a victim search: someone it may preempt at all.

        (It counts gangs already decided on this cycle too: a search then finds out.)
        """
        lowest = self.running().lowest
        if lowest.get(queue, priority) < priority:
            return True
        return owed and any(q != queue for q in lowest)

    def preempted(self) -> None:
        """The victims just chosen are in `plan.busy` now: drop them from the lists, in order.

        The state and `now` stand still all cycle and only `plan.busy` grew, so this is what a rebuild
        gives, without building a Candidate for every running gang again (#34: the rebuilds were the
        largest part of a preemption's cost).
        """
        busy = self.plan.busy
        if self._eligible_jobs is not None:
            self._eligible_jobs = [j for j in self._eligible_jobs if j.job_id not in busy]
        if self._candidates is not None:
            self._candidates = [x for x in self._candidates if x.job_id not in busy]

    def victims_of(self, preemptor: str) -> list[str]:
        if self._victims_of is None:
            self._victims_of = {}
            for jid in self.c.state.watch:  # every preempting gang is watched
                j = self.c.state.jobs[jid]
                if j.status == "preempting" and j.preemptor:
                    self._victims_of.setdefault(j.preemptor, []).append(jid)
        return self._victims_of.get(preemptor, [])
