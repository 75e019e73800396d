"""Stage 1, react: the follow-ups that facts already in the log imply.

Each gang holding GPUs is checked in a fixed order; at most one follow-up per
gang per cycle, the next one comes once the first is folded:

1. ranks lost (node failed, worker lost), a GPU of the gang unhealthy
   (GpuUnhealthy) or a rank stopped by its node's graceful shutdown
   (WorkerExited reason "shutdown"): a stopping gang ends, a preempting one is
   Preempted, any other is requeued as attempt+1 from its newest checkpoint,
   the cause named in the reason ("shutdown: ..."); a requeue spends none of
   the job's `max_restarts`;
2. stop requested (cancel, or the scheduler's own stop): once every worker
   exited, or grace + margin passed -> JobCancelled / JobFailed(reason);
3. preempting: once every worker exited, or grace + margin passed ->
   Preempted(resume_from = newest checkpoint);
4. every rank exited 0 -> JobCompleted;
5. a rank failed for good: restart policy gang with restarts left ->
   GangRestarted(attempt+1, same GPUs, not before the restart backoff);
   otherwise (or when a rank is unstartable: it would not start again) stop it and fail it;
6. time limit passed -> stop it (CancelRequested by the scheduler), then it
   ends as JobFailed("time limit ...") through rule 2;
7. every rank started -> JobRunning.

And pending jobs end: those asked to stop, and those whose dependency can never
be met (gating.py), as JobCancelled with the reason.

A gang whose ranks all started and that ends (or is requeued, restarted,
preempted) before a cycle saw it running -- a short job whose workers start and
exit between two cycles -- gets its JobRunning first, in the same cycle, dated
when its last rank started: every attempt that ran says so in the log.

A cycle appends at most `Policies.followups_per_cycle` follow-up events (plus
one: a JobRunning is never parted from the end it precedes). Past it the rest
wait for the next cycles, in this order of classes: the ends and stops of
gangs (completed, failed, cancelled, preempted, restarted, the scheduler's
stops), then the requeues of gangs hit by a failure (node, lost rank, GPU),
oldest gang first, then JobRunning, then the ends of pending jobs. A mass
NodeFailed thus requeues its gangs over several cycles, oldest first
(bench/followups.py), and a capped cycle decides nothing else (decide.py).

The scheduler's stop is a CancelRequested with requested_by=SCHEDULER so the
agents need one stop protocol only (signal, grace, kill); the fold marks the
stop `fail`, and rule 2 turns it into JobFailed instead of JobCancelled.

Every follow-up carries the cycle's epoch: one decided by a leader that has
since been deposed (it was paused, say) is void when it lands (evolve.py).
"""

from __future__ import annotations

from typing import NamedTuple

from orchestrator.core.backoff import restart_delay
from orchestrator.core.cycle import Cycle
from orchestrator.core.gating import INVALID_SPEC, NEVER_SATISFIED, invalid_reasons
from orchestrator.core.model.state import FREE, SCHEDULER, SHUTDOWN, UNSTARTABLE, ClusterState, Job
from orchestrator.core.staging import failed_for_good
from schemas.events import (
    CancelRequested,
    Event,
    GangRestarted,
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobRejected,
    JobRequeued,
    JobRunning,
    Preempted,
)


def lost_gangs(state: ClusterState, failed: tuple[str, ...]) -> dict[str, str]:
    """Jobs with ranks on the `failed` nodes -> the first such node."""
    lost: dict[str, str] = {}
    if not failed:
        return lost
    for nid in failed:
        for owner in state.owners[nid]:
            if owner != FREE and owner not in lost:
                lost[owner] = nid
    bad = set(failed)
    for jid in state.active:
        job = state.jobs[jid]
        if job.gpus == 0 and jid not in lost:  # CPU-only ranks own no GPU
            for rp in job.placement:
                if rp.node_id in bad:
                    lost[jid] = rp.node_id
                    break
    return lost


class Reaction(NamedTuple):
    events: list[Event]
    #: Follow-ups were left for the next cycles (`Policies.followups_per_cycle`).
    capped: bool = False


#: Follow-ups that end an attempt: a JobRunning owed to it goes first (`_follow_ups`).
_ATTEMPT_ENDS = (JobCompleted, JobFailed, JobCancelled, Preempted, JobRequeued, GangRestarted)


def react(c: Cycle, stopping: list[Job]) -> Reaction:
    """Follow-ups for gangs holding GPUs, and the end of pending jobs asked to stop.

    Only gangs that can need one are visited: those on failed nodes, those the
    fold watches (`needs_look`), and those whose time limit has passed (a
    prefix of the fold's `ends`). Every other gang is simply running.
    """
    state = c.state
    lost = lost_gangs(state, c.topo.failed)  # the Topology knows which nodes failed
    look: dict[str, None] = dict.fromkeys(lost)
    look.update(dict.fromkeys(state.watch))
    now = c.now
    for end, _, jid in state.ends:
        if end > now:
            break
        look[jid] = None
    doomed = [jid for jid in state.doomed if jid not in state.stopping]
    cap = c.policies.followups_per_cycle
    jobs = state.jobs
    if len(look) + len(stopping) + len(doomed) <= cap:
        # The usual cycle: every follow-up, in the order found.
        out: list[Event] = []
        for jid in look:
            out.extend(_follow_ups(c, jobs[jid], lost.get(jid)))
        out.extend(_end(c, job) for job in stopping)
        out.extend(_never_satisfied(c, jobs[jid]) for jid in doomed)
        if len(out) <= cap:
            return Reaction(out)
    return _capped(c, look, lost, stopping, doomed)


def _capped(c: Cycle, look: dict[str, None], lost: dict[str, str], stopping: list[Job], doomed: list[str]) -> Reaction:
    """More follow-ups than a cycle appends: the first `followups_per_cycle` events by class (module docstring).

    Work stays bounded too: requeues are only sorted until their turn, and a class
    that fills the cycle ends the visit.
    """
    cap = c.policies.followups_per_cycle
    jobs = c.state.jobs
    out: list[Event] = []
    requeues: list[Job] = []
    running: list[Event] = []
    for jid in look:
        job, failed = jobs[jid], lost.get(jid)
        if _requeued(job, failed):
            requeues.append(job)
            continue
        if len(out) >= cap:
            return Reaction(out, True)
        events = _follow_ups(c, job, failed)
        if len(events) == 1 and isinstance(events[0], JobRunning):
            running.append(events[0])
        else:
            out.extend(events)
    requeues.sort(key=lambda j: (j.submit_seq, j.job_id))
    for job in requeues:
        if len(out) >= cap:
            return Reaction(out, True)
        out.extend(_follow_ups(c, job, lost.get(job.job_id)))
    for e in running:
        if len(out) >= cap:
            return Reaction(out, True)
        out.append(e)
    ends = [*((job, True) for job in stopping), *((jobs[jid], False) for jid in doomed)]
    for job, stopped in ends:
        if len(out) >= cap:
            return Reaction(out, True)
        out.append(_end(c, job) if stopped else _never_satisfied(c, job))
    return Reaction(out)


def _requeued(job: Job, failed_node: str | None) -> bool:
    """Whether `_follow_up` requeues it (its first rule, for a gang neither stopping nor preempting)."""
    return (failed_node is not None or job.lost > 0 or bool(job.gpu_fault) or bool(job.shutdown)) \
        and job.stop is None \
        and job.status != "preempting"


def _follow_ups(c: Cycle, job: Job, failed_node: str | None) -> list[Event]:
    """`_follow_up`, after the JobRunning the attempt is owed if it ends having run unseen."""
    e = _follow_up(c, job, failed_node)
    if e is None:
        return []
    if isinstance(e, _ATTEMPT_ENDS) and job.status == "reserved":
        at = _ran_at(c.state, job)
        if at is not None:
            ran = JobRunning(event_id=c.event_id("running", job), occurred_at=min(at, c.now), job_id=job.job_id,
                             attempt=job.attempt, epoch=c.epoch)
            return [ran, e]
    return [e]


def _ran_at(state: ClusterState, job: Job) -> float | None:
    """When the last rank of the attempt started, if every rank reported a start; else None.

    A rank that exited without a start reported (it could not start, or its agent lost it
    before it told) has `started_at` 0.0 (slices.RankState); one that completed ran whatever
    its times say. A simulated rank that started at exactly 0.0 and then failed counts as
    never started: the one case this reading gets wrong, and only in a simulation.
    """
    book = state.ranks.get(job.job_id)
    if book is None or len(book) < job.spec.ranks:
        return None
    at = job.reserved_at
    for rs in book.values():
        if rs.status == "started" or rs.started_at != 0.0:
            at = max(at, rs.started_at)
        elif not (rs.status == "exited" and rs.reason == "completed"):
            return None
    return at


def _never_satisfied(c: Cycle, job: Job) -> Event:
    """The end of a job whose dependency can never be met (gating.py): cancelled, saying which; or of one whose
    spec is invalid, found when it was submitted (gating.invalid_gates): rejected, as stage 3 rejects."""
    if job.doomed.startswith(INVALID_SPEC):
        return JobRejected(event_id=c.event_id("rejected", job), occurred_at=c.now, job_id=job.job_id,
                           reasons=invalid_reasons(job) or (job.doomed,), epoch=c.epoch)
    return JobCancelled(event_id=c.event_id("never", job), occurred_at=c.now, job_id=job.job_id,
                        reason=f"{NEVER_SATISFIED}: {job.doomed}", epoch=c.epoch)


def _follow_up(c: Cycle, job: Job, failed_node: str | None) -> Event | None:
    now, margin = c.now, c.policies.stop_margin_s
    spec = job.spec
    if failed_node is not None or job.lost or job.gpu_fault or job.shutdown:
        if job.stop is not None:
            return _end(c, job)
        if job.status == "preempting":
            return _preempted(c, job)
        if failed_node is not None:
            why = f"node {failed_node} failed"
        elif job.gpu_fault or job.lost:
            why = job.gpu_fault or f"{job.lost} rank(s) lost"
        else:
            why = f"{SHUTDOWN}: node {job.shutdown} stopped its workers"
        return JobRequeued(
            event_id=c.event_id("requeue", job),
            occurred_at=now,
            job_id=job.job_id,
            attempt=job.attempt + 1,
            reason=why,
            resume_from=job.newest_checkpoint,
            epoch=c.epoch,
        )
    if job.stop is not None:
        if job.live == 0 or now >= job.stop.requested_at + spec.grace_period_s + margin:
            return _end(c, job)
        return None
    if job.status == "preempting":
        if job.live == 0 or now >= job.preempt_at + job.preempt_grace_s + margin:
            return _preempted(c, job)
        return None
    if job.exited_ok >= spec.ranks:
        return JobCompleted(event_id=c.event_id("completed", job), occurred_at=now, job_id=job.job_id, attempt=job.attempt,
                            epoch=c.epoch)
    if job.failure:
        if failed_for_good(job):
            return _stop_and_fail(c, job, f"{job.failure}; not restarted (the same source fails on any node)")
        if spec.restart_policy == "gang" and job.restarts < spec.max_restarts and not _unstartable(c.state, job):
            # Decided now, so the old attempt's surviving ranks stop at once; its workers wait out
            # the backoff in the log (`not_before`), as a crashing rank's agent waits before restarting it.
            delay = restart_delay(job.restarts + 1)
            return GangRestarted(
                event_id=c.event_id("restart", job),
                occurred_at=now,
                job_id=job.job_id,
                attempt=job.attempt + 1,
                reason=f"{job.failure}; restart {job.restarts + 1} of {spec.max_restarts} in {delay:g}s",
                epoch=c.epoch,
                not_before=now + delay,
            )
        if _unstartable(c.state, job):
            why = job.failure
        elif spec.restart_policy == "gang":
            why = f"{job.failure}; no restarts left ({spec.max_restarts} used)"
        elif spec.restart_policy == "rank":
            why = f"{job.failure}; the agent gave up restarting it"
        else:
            why = f"{job.failure}; restart policy never"
        return _stop_and_fail(c, job, why)
    limit = spec.time_limit_s
    if limit is not None and now >= job.reserved_at + limit:
        return _stop_and_fail(c, job, f"time limit {limit:g}s exceeded")
    if job.status == "reserved" and job.started >= spec.ranks:
        return JobRunning(event_id=c.event_id("running", job), occurred_at=now, job_id=job.job_id, attempt=job.attempt,
                          epoch=c.epoch)
    return None


def _unstartable(state: ClusterState, job: Job) -> bool:
    """A rank of this attempt could not start and never will here (a restart would meet the same)."""
    return any(r.status == "exited" and r.reason == UNSTARTABLE for r in state.ranks.get(job.job_id, {}).values())


def _stop_and_fail(c: Cycle, job: Job, reason: str) -> Event:
    if job.live == 0:
        return JobFailed(event_id=c.event_id("failed", job), occurred_at=c.now, job_id=job.job_id, attempt=job.attempt,
                         reason=reason, epoch=c.epoch)
    return CancelRequested(event_id=c.event_id("stop", job), occurred_at=c.now, job_id=job.job_id, reason=reason,
                           requested_by=SCHEDULER, epoch=c.epoch)


def _end(c: Cycle, job: Job) -> Event:
    """The end of a stopped job: JobFailed for the scheduler's stops, JobCancelled for users', JobRequeued for
    a user's requeue."""
    assert job.stop is not None
    if job.stop.requeue:  # a user's requeue (core/requeues.py): back in line as the next attempt
        return JobRequeued(event_id=c.event_id("requeue", job), occurred_at=c.now, job_id=job.job_id,
                           attempt=job.attempt + 1, reason=job.stop.reason, resume_from=job.newest_checkpoint,
                           epoch=c.epoch)
    if job.stop.fail:
        return JobFailed(event_id=c.event_id("failed", job), occurred_at=c.now, job_id=job.job_id, attempt=job.attempt,
                         reason=job.stop.reason, epoch=c.epoch)
    return JobCancelled(event_id=c.event_id("cancelled", job), occurred_at=c.now, job_id=job.job_id,
                        reason=job.stop.reason, epoch=c.epoch)


def _preempted(c: Cycle, job: Job) -> Event:
    return Preempted(
        event_id=c.event_id("preempted", job),
        occurred_at=c.now,
        job_id=job.job_id,
        attempt=job.attempt,
        preemptor_job_id=job.preemptor,
        resume_from=job.newest_checkpoint,
        epoch=c.epoch,
    )
