"""Stage 3, reject: pending specs that can never fit get JobRejected with every reason.

Only jobs never looked at before (no JobWaiting yet) are checked, plus those
explained while nodes were still joining (capacity is judged only once the
cluster settled, see facts.SETTLE_S): the cluster only grows (nodes are never
forgotten), so a job that could fit once could fit forever.
"""

from __future__ import annotations

from orchestrator.core.cycle import Cycle
from orchestrator.core.facts import ClusterFacts
from orchestrator.core.plan import Plan
from orchestrator.core.state import Job
from schemas.events import JobRejected


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
