"""Stage 3, reject: pending specs that can never fit get JobRejected with every reason.

Only jobs never looked at before (no JobWaiting yet) are checked: the cluster
only grows (nodes are never forgotten), so a job that could fit once could fit
forever, and a long queue costs nothing per cycle.
"""

from __future__ import annotations

from orchestrator.core.cycle import Cycle
from orchestrator.core.facts import ClusterFacts
from orchestrator.core.plan import Plan
from orchestrator.core.state import Job
from schemas.events import JobRejected


def reject_unfit(c: Cycle, plan: Plan, pending: list[Job]) -> list[JobRejected]:
    facts = ClusterFacts(c.state, plan.topo, c.now)
    out: list[JobRejected] = []
    for job in pending:
        if job.waiting is not None or job.job_id in plan.busy:
            continue
        reasons = c.policies.reject(job, facts)
        if reasons:
            plan.busy.add(job.job_id)
            out.append(
                JobRejected(event_id=c.event_id("rejected", job), occurred_at=c.now, job_id=job.job_id, reasons=reasons)
            )
    return out
