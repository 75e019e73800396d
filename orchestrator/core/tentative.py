"""Stage 2: the cycle's tentative plan, with the follow-ups already applied to it.

Follow-ups that end a gang (completed, failed, cancelled, requeued,
preempted) free its GPUs in the plan, so the same cycle can reuse them: the
follow-up is appended before any reservation, so the fold agrees.
"""

from __future__ import annotations

from orchestrator.core.cycle import Cycle
from orchestrator.core.model.plan import Plan
from schemas.events import Event, JobCancelled, JobCompleted, JobFailed, JobRequeued, JobRunning, Preempted, entity_of

_ENDS_GANG = (JobCompleted, JobFailed, JobCancelled, JobRequeued, Preempted)


def tentative_plan(c: Cycle, followups: list[Event]) -> Plan:
    plan = Plan(c.state, c.now, c.topo, c.memo)
    for e in followups:
        kind, jid = entity_of(e)
        if kind != "job":
            continue
        if not isinstance(e, JobRunning):
            # (A gang that only goes from reserved to running stays a preemption candidate:
            # a PreemptionRequested after its JobRunning folds fine, and the next cycle
            # would preempt it anyway.)
            plan.busy.add(jid)
        if isinstance(e, _ENDS_GANG) and jid in c.state.active:
            plan.release(c.state.jobs[jid])
    return plan
