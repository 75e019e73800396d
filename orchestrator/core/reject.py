"""Stage 3, reject: pending specs that can never fit get JobRejected with every reason.

Only jobs never looked at before (no JobWaiting yet) are checked, plus those
explained while nodes were still joining (capacity is judged only once the
cluster settled, see facts.SETTLE_S). Nodes are never forgotten, but one may
re-register with fewer GPUs: a pass is remembered only while the node records
stand still (memo.Memo.passed).
"""

from __future__ import annotations

import math

from orchestrator.core.cycle import Cycle
from orchestrator.core.model.facts import ClusterFacts
from orchestrator.core.model.memo import Memo
from orchestrator.core.model.plan import Plan
from orchestrator.core.model.state import ClusterState, Job
from orchestrator.core.model.topology import build_topology
from orchestrator.policies import DEFAULT_POLICIES, Policies
from schemas.events import JobRejected
from schemas.jobspec import JobSpec


class Rejecter:
    """Stage 3's rule, asked of the cycle's batch of new jobs at once and of later ones when admission meets them.

    A cycle checks at most `Policies.fresh_per_cycle` new jobs up front (core/backlog.py); an
    unchecked one that a queue's line offers admission as a head is checked there (`admissible`),
    so it neither starts nor is told a reason before the check, and keeps its place in line.
    """

    __slots__ = ("_batch", "_c", "_facts", "_passed", "_plan", "_settled_at", "events")

    def __init__(self, c: Cycle, plan: Plan, batch: list[Job]) -> None:
        self._c = c
        self._plan = plan
        self._facts = ClusterFacts(c.state, plan.topo, c.now, c.memo)
        self._settled_at = self._facts.settled_at
        #: The batch checked up front: `admissible` passes these (their verdict is in `events`).
        self._batch = {j.job_id for j in batch}
        self.events: list[JobRejected] = []
        self._passed = _passed(c)
        for job in batch:
            self._check(job)

    def _check(self, job: Job) -> bool:
        """Reject `job` if it is owed a check that it fails; whether it may still be admitted."""
        if job.job_id in self._plan.busy:
            return False
        # Fresh jobs, and once more those explained before the cluster settled: their
        # capacity verdict was postponed then, not passed.
        w = job.waiting
        settled_at = self._settled_at
        if w is not None and (settled_at is None or self._c.now < settled_at or w.at >= settled_at):
            return True
        if self._passed.get(job.job_id) is job.spec:
            return True  # passed once the cluster had settled, in an earlier cycle that told it nothing
        c = self._c
        reasons = c.policies.reject(job, self._facts)
        if not reasons:
            if settled_at is not None and settled_at <= c.now:
                self._passed[job.job_id] = job.spec
            return True
        self._plan.busy.add(job.job_id)
        self.events.append(
            JobRejected(event_id=c.event_id("rejected", job), occurred_at=c.now, job_id=job.job_id, reasons=reasons,
                        epoch=c.epoch)
        )
        return False

    def admissible(self, job: Job) -> bool:
        """For a queue's line: False if `job` is a new job outside the batch that fails its check now."""
        jid = job.job_id
        if jid in self._batch or jid not in self._c.state.unexplained:
            return True
        self._batch.add(jid)  # (checked once per cycle)
        return self._check(job)


def _passed(c: Cycle) -> dict[str, JobSpec]:
    """The memo's final passes (memo.Memo.passed) for this state, kept to the jobs still new."""
    memo, state = c.memo, c.state
    # A pass read the node records: a node that re-registers with fewer GPUs (or is replaced) may make a
    # passed job unfit, and a restarted scheduler, memo-less, would reject it (found by test_properties).
    if memo.passed_for is None or memo.passed_for[0] is not state or memo.passed_for[1] != state.nodes_rev:
        memo.passed_for, memo.passed = (state, state.nodes_rev), {}
    elif len(memo.passed) > 2 * c.policies.fresh_per_cycle + 1024:
        memo.passed = {jid: spec for jid, spec in memo.passed.items() if jid in state.unexplained}
    return memo.passed


def reject_unreadable(c: Cycle) -> list[JobRejected]:
    """JobRejected for each job whose only submission no one can read (events/authorship.py: bad JSON, bad
    fields, another type or entity on corral.job.<id>.JobSubmitted), with why: the submitter learns it from
    `corral explain`, as from any rejection. Where auth is on, this is how a client's malformed payload is
    refused (README, "Who may write to the log"); the fold drops the entry when the rejection is folded."""
    jobs = c.state.jobs
    return [
        JobRejected(event_id=f"rejected:{job_id}:unreadable:{seq}", occurred_at=c.now, job_id=job_id,
                    reasons=(f"unreadable submission at #{seq}: {why}",), epoch=c.epoch)
        for job_id, (seq, why) in c.state.unreadable_submissions.items() if job_id not in jobs
    ]


def reject_unfit(c: Cycle, plan: Plan, pending: list[Job]) -> list[JobRejected]:
    """JobRejected for the jobs of `pending` owed a check that they fail (marked busy in `plan`)."""
    return Rejecter(c, plan, pending).events


def never_fits(state: ClusterState, spec: JobSpec, *, policies: Policies = DEFAULT_POLICIES) -> tuple[str, ...]:
    """Every reason a job of `spec` could never run on the nodes `state` has registered; empty if it might.

    The rule of stage 3 (`reject_unfit`: the same `policies.reject`), asked before the job is in the log, so
    that `corral submit` refuses what the scheduler would reject. The verdict is on the registered nodes as
    if the cluster had settled (a submitter who expects more nodes sets `spec.allow_future_nodes`, which the
    rule honours); a cluster without any node judges no capacity: there is nothing to judge it on.
    """
    topo = build_topology(state.nodes.values(), state.config.topology_levels, Memo())
    facts = ClusterFacts(state, topo, math.inf, Memo())
    return policies.reject(Job(job_id="", spec=spec, submitted_at=0.0), facts)
