"""Stage 3, reject: pending specs that can never fit get JobRejected with every reason.

Only jobs never looked at before (no JobWaiting yet) are checked, plus those
explained while nodes were still joining (capacity is judged only once the
cluster settled, see facts.SETTLE_S): the cluster only grows (nodes are never
forgotten), so a job that could fit once could fit forever.
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


def reject_unfit(c: Cycle, plan: Plan, pending: list[Job]) -> list[JobRejected]:
    facts = ClusterFacts(c.state, plan.topo, c.now, c.memo)
    settled_at = facts.settled_at
    out: list[JobRejected] = []
    for job in pending:
        if job.job_id in plan.busy:
            continue
        # Fresh jobs, and once more those explained before the cluster settled: their
        # capacity verdict was postponed then, not passed.
        w = job.waiting
        if w is not None and (settled_at is None or c.now < settled_at or w.at >= settled_at):
            continue
        reasons = c.policies.reject(job, facts)
        if reasons:
            plan.busy.add(job.job_id)
            out.append(
                JobRejected(event_id=c.event_id("rejected", job), occurred_at=c.now, job_id=job.job_id, reasons=reasons,
                            epoch=c.epoch)
            )
    return out


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
