"""Prometheus metrics of the scheduler (the readers' shared ones and the endpoint: events/telemetry.py).

Two kinds, for two reasons:
- Counters and the decide-latency histogram are bumped where things happen
  (an append, a decide call, an event folded); they are process-lifetime
  facts that no state holds.
- Gauges (GPUs per node and queue, pending jobs by reason, heartbeat ages)
  are computed from the folded state at scrape time by a custom collector, so
  they are always exactly the projection every other reader sees, never a
  second bookkeeping that could drift from it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, get_args

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, Metric

from events.telemetry import ServiceRegistry, count_folded, digest, fold_gauges, gauge
from orchestrator.core import explain
from orchestrator.core.locality import LOCALITY
from orchestrator.core.model.state import FREE, ClusterState, Job, JobStatus, snapshot
from orchestrator.core.model.usage import ancestors, resolve_queue
from schemas import DatasetReady, GangReserved, GangRestarted, PreemptionRequested, WorkerStarted

if TYPE_CHECKING:
    from events.bus import Envelope
    from events.follow import Follower

# Created without a registry: each exposed registry registers them (tests build several in one process).
DECIDE_SECONDS = Histogram("corral_decide_seconds", "Time of one scheduling decision (decide over the state)",
                           buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
                           registry=None)
PREEMPTIONS = Counter("corral_preemptions", "Preemptions requested (PreemptionRequested folded)", registry=None)
RESTARTS = Counter("corral_restarts", "Restarts folded from the log: gang (GangRestarted) or rank (a worker "
                   "started again by its agent)", ["kind"], registry=None)

#: Jobs that reached a final status, by it: counted when the scheduler's fold finished them (so a void
#: or duplicate completion is not counted), by the queue charged.
JOBS_FINISHED = Counter("corral_jobs_finished", "Jobs the fold finished, by outcome (completed, failed, cancelled, "
                        "rejected) and queue", ["outcome", "queue"], registry=None)
#: From submit (or the preemption that put it back in line) to the GangReserved that placed it.
QUEUE_WAIT = Histogram("corral_queue_wait_seconds", "Time a job waited in line before its gang was reserved, by "
                       "queue", ["queue"], buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400,
                                                    43200, 86400), registry=None)
#: GPUs x seconds of reservations that ended (completed, failed, cancelled, preempted, requeued): what
#: `corral usage` sums from the whole log, here since this process started.
QUEUE_GPU_SECONDS = Counter("corral_queue_gpu_seconds", "GPU-seconds of reservations that ended, by the queue "
                            "charged", ["queue"], registry=None)

#: Elections the scheduler's fold refused (an epoch that does not follow the newest: forged or corrupt).
ELECTIONS_REFUSED = Counter("corral_elections_refused", "SchedulerElected events the fold refused as void (their "
                            "epoch does not follow the newest election: forged or corrupt)", registry=None)

#: Dataset staging (#33): from an attempt's first staging report to the DatasetReady that made every node ready
#: (its own phase between the reservation and the ranks' start), and each node's datasets by cache hit or not.
STAGING_SECONDS = Histogram("corral_staging_seconds", "Time a gang's datasets took to be ready on every node of it "
                            "(its ranks start then), by queue", ["queue"],
                            buckets=(0.5, 1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600), registry=None)
DATASETS_READY = Counter("corral_datasets_ready", "Datasets a node made ready for an attempt, by whether its cache "
                         "held them (cached=true: 0 bytes staged)", ["cached"], registry=None)
DATASET_BYTES_STAGED = Counter("corral_dataset_bytes_staged", "Bytes agents copied or downloaded to stage datasets",
                               registry=None)

SCHEDULER_METRICS = (DECIDE_SECONDS, PREEMPTIONS, RESTARTS, JOBS_FINISHED, QUEUE_WAIT, QUEUE_GPU_SECONDS,
                     ELECTIONS_REFUSED, STAGING_SECONDS, DATASETS_READY, DATASET_BYTES_STAGED)


#: Every label value a labelled gauge is told at, 0 included: a series at 0 is a panel's 0, not its "no data",
#: and an alert such as `corral_node_condition{condition="failed"} == 1` reads a series that exists.
JOB_STATUSES: tuple[str, ...] = get_args(JobStatus)
NODE_CONDITIONS = ("ready", "cordoned", "drained", "failed")
#: The reason codes `decide` tells (orchestrator/core/explain.py, locality.py), and a job not told one yet.
PENDING_REASONS = (explain.QUEUED, explain.CAPACITY, explain.QUOTA, explain.PREEMPTING, explain.BACKFILL,
                   explain.BACKFILL_HEAD, explain.NO_NODES, LOCALITY, "unexplained")


def count_outcomes(follower: Follower[ClusterState]) -> None:
    """Jobs finished by outcome, queue waits and GPU-seconds per queue, from what the fold did with each event.

    Read after each event is folded: a job the event finished is in `state.finished` at that event's
    position; a gang it placed is active with `reserved_at` the event's time. The reservations being
    watched (at most the active gangs) are the only memory kept.
    """
    held: dict[str, tuple[str, int, float]] = {}  # job -> (queue, gpus, reserved_at) while it holds GPUs
    #: job -> (attempt, the (node, dataset)s counted ready) until it finishes: a duplicate counts once.
    told: dict[str, tuple[int, set[tuple[str, str]]]] = {}

    def count_ready(e: DatasetReady, job: Job, queue: str) -> None:
        s = job.staging
        if s is None or s.attempt != e.attempt or not any(
                i.ready and i.node_id == e.node_id and i.dataset == e.dataset for i in s.items):
            return  # the fold did not take it (another attempt, node or dataset)
        attempt, seen = told.get(job.job_id, (0, set()))
        if attempt != e.attempt:
            attempt, seen = e.attempt, set()
        if (e.node_id, e.dataset) in seen:
            return
        seen.add((e.node_id, e.dataset))
        told[job.job_id] = (attempt, seen)
        DATASETS_READY.labels("true" if e.cached else "false").inc()
        DATASET_BYTES_STAGED.inc(e.staged_bytes)
        if s.ready and len(seen) == sum(1 for i in s.items if i.ready):
            STAGING_SECONDS.labels(queue).observe(max(0.0, s.ready_at - s.started_at))


    def on_event(env: Envelope) -> None:
        job_id = getattr(env.event, "job_id", None)
        if not isinstance(job_id, str):
            return
        state = follower.state
        job = state.jobs.get(job_id)
        at = getattr(env.event, "occurred_at", 0.0)
        was = held.get(job_id)
        holding = job is not None and job_id in state.active
        if was is not None and (not holding or job is None or job.reserved_at != was[2]):
            del held[job_id]
            QUEUE_GPU_SECONDS.labels(was[0]).inc(max(0.0, was[1] * (at - was[2])))
        if job is None:
            return
        queue = job.queue or resolve_queue(state, job.spec.queue)
        if holding and job_id not in held:
            held[job_id] = (queue, job.gpus, job.reserved_at)
            if isinstance(env.event, GangReserved):
                QUEUE_WAIT.labels(queue).observe(max(0.0, job.reserved_at - job.waiting_since))
        if state.finished.get(job_id) == env.seq:
            JOBS_FINISHED.labels(job.status, queue).inc()
        if isinstance(env.event, DatasetReady):
            count_ready(env.event, job, queue)
        if state.finished.get(job_id) == env.seq:
            told.pop(job_id, None)

    follower.on_event(on_event)


def count_cluster_facts(follower: Follower[ClusterState]) -> None:
    """Count the preemptions and restarts `follower` folds (one reader per process counts them: the scheduler)."""

    def on_event(env: Envelope) -> None:
        ev = env.event
        if isinstance(ev, PreemptionRequested):
            PREEMPTIONS.inc()
        elif isinstance(ev, GangRestarted):
            RESTARTS.labels("gang").inc()
        elif isinstance(ev, WorkerStarted) and ev.restarts > 0:
            RESTARTS.labels("rank").inc()

    follower.on_event(on_event)


def state_digest(state: ClusterState) -> int:
    """`events.telemetry.digest` of the state's snapshot: equal for equal folds."""
    return digest(snapshot(state))


def state_metrics(state: ClusterState, heartbeat_ages: dict[str, float] | None = None) -> list[Metric]:
    """Gauges of one folded state: a pure function, so a test can check it without HTTP."""
    epoch = gauge("corral_scheduler_epoch", "Newest SchedulerElected epoch in the log")
    epoch.add_metric([], state.epoch)

    node_gpus = gauge("corral_node_gpus", "GPUs of a node by state (allocated: held by a gang)", ["node", "state"])
    node_cond = gauge("corral_node_condition", "1 for the node's condition (ready, cordoned, drained, failed)",
                      ["node", "condition"])
    gpu_healthy = gauge("corral_gpu_healthy", "1 while a GPU is in service, 0 while a fatal GpuUnhealthy holds it out",
                        ["node", "gpu", "uuid"])
    cluster_free = 0
    for nid, node in state.nodes.items():
        owners = state.owners.get(nid, ())
        sick = node.unhealthy_gpus
        used = sum(1 for o in owners if o != FREE)
        free = sum(1 for i, o in enumerate(owners) if o == FREE and i not in sick)
        node_gpus.add_metric([nid, "allocated"], used)
        node_gpus.add_metric([nid, "free"], free)
        node_gpus.add_metric([nid, "unhealthy"], len(sick))
        cond = "failed" if node.failed else "cordoned" if node.cordoned else "drained" if node.drained else "ready"
        for c in NODE_CONDITIONS:
            node_cond.add_metric([nid, c], 1 if c == cond else 0)
        for g in node.inventory.gpus:
            gpu_healthy.add_metric([nid, str(g.index), g.uuid], 0 if g.index in sick else 1)
        if node.schedulable:
            cluster_free += free

    q_alloc = gauge("corral_queue_gpus_allocated", "GPUs a queue holds now (its own jobs)", ["queue"])
    q_free = gauge("corral_queue_gpus_free", "GPUs a queue could still take now: free schedulable GPUs, capped "
                   "by its and its parents' limits", ["queue"])
    q_guar = gauge("corral_queue_gpus_guaranteed", "GPUs guaranteed to a queue", ["queue"])
    q_limit = gauge("corral_queue_gpus_limit", "Most GPUs a queue may hold (absent: no limit)", ["queue"])
    q_weight = gauge("corral_queue_weight", "Fair-share weight of a queue", ["queue"])
    q_pending = gauge("corral_queue_pending_jobs", "Pending jobs of a queue", ["queue"])
    pending_by_queue: dict[str, int] = {}
    pending_by_reason: dict[str, int] = {}
    for jid in state.pending:
        job = state.jobs[jid]
        qn = job.queue or resolve_queue(state, job.spec.queue)
        pending_by_queue[qn] = pending_by_queue.get(qn, 0) + 1
        code = job.waiting.code if job.waiting is not None else "unexplained"
        pending_by_reason[code] = pending_by_reason.get(code, 0) + 1
    names = list(dict.fromkeys([*state.queues, *state.usage, *pending_by_queue]))
    for name in names:
        q = state.queues.get(name)
        u = state.usage.get(name)
        q_alloc.add_metric([name], u.gpus if u else 0)
        headroom = cluster_free
        for a in ancestors(state.queues, name):
            aq, au = state.queues.get(a), state.usage.get(a)
            if aq is not None and aq.limit_gpus is not None:
                headroom = min(headroom, aq.limit_gpus - (au.tree_gpus if au else 0))
        q_free.add_metric([name], max(0, headroom))
        q_guar.add_metric([name], q.guaranteed_gpus if q else 0)
        if q is not None and q.limit_gpus is not None:
            q_limit.add_metric([name], q.limit_gpus)
        q_weight.add_metric([name], q.weight if q else 1.0)
        q_pending.add_metric([name], pending_by_queue.get(name, 0))

    pending = gauge("corral_pending_jobs", "Pending jobs by the scheduler's reason code", ["reason"])
    for code in dict.fromkeys([*PENDING_REASONS, *sorted(pending_by_reason)]):
        pending.add_metric([code], pending_by_reason.get(code, 0))
    jobs = gauge("corral_jobs", "Jobs by status", ["status"])
    counts: dict[str, int] = dict.fromkeys(JOB_STATUSES, 0)
    for job in state.jobs.values():
        counts[job.status] = counts.get(job.status, 0) + 1
    for status, n in counts.items():
        jobs.add_metric([status], n)
    # A counter: the fold only ever adds to it (exposed as corral_void_decisions_total).
    voids = CounterMetricFamily("corral_void_decisions", "Decisions the fold recorded as void (stale epoch, GPUs "
                                "taken), since the log began")
    voids.add_metric([], state.voids)

    out: list[Metric] = [*fold_gauges([(None, state)], snapshot), epoch, node_gpus, node_cond, gpu_healthy, q_alloc,
                         q_free, q_guar, q_limit, q_weight, q_pending, pending, jobs, voids]
    if heartbeat_ages is not None:
        hb = gauge("corral_node_heartbeat_age_seconds", "Seconds since the scheduler last received the node's "
                   "heartbeat (its own clock)", ["node"])
        for nid, age in sorted(heartbeat_ages.items()):
            hb.add_metric([nid], age)
        out.append(hb)
    return out


def leader_metric(scheduler_id: str, leading: bool) -> Metric:
    """`corral_scheduler_leader{scheduler}`: 1 while this scheduler leads, 0 while it stands by.

    Only a scheduler exports it, so the alert rules tell "no scheduler leads" by this metric alone
    (`absent(corral_scheduler_leader == 1)`), whatever job name the scrape config gives the target.
    """
    up = gauge("corral_scheduler_leader", "1 while this scheduler holds the leader lease and decides, 0 while it "
               "stands by", ["scheduler"])
    up.add_metric([scheduler_id], 1 if leading else 0)
    return up


class StateCollector:
    """Gauges from a live state, computed when scraped."""

    def __init__(self, state: Callable[[], ClusterState],
                 heartbeat_ages: Callable[[], dict[str, float] | None] = lambda: None,
                 leader: Callable[[], tuple[str, bool]] | None = None) -> None:
        self._state = state
        self._heartbeat_ages = heartbeat_ages
        self._leader = leader

    def collect(self) -> Iterable[Metric]:
        out = state_metrics(self._state(), self._heartbeat_ages())
        if self._leader is not None:
            out.append(leader_metric(*self._leader()))
        return out


def watch_scheduler(registry: CollectorRegistry, follower: Follower[ClusterState],
                    heartbeat_ages: Callable[[], dict[str, float] | None],
                    leader: Callable[[], tuple[str, bool]] | None = None) -> None:
    """Register the scheduler's metrics in `registry` and count what its `follower` folds.

    `heartbeat_ages`: per live node, seconds since its heartbeat was received (None before the
    monitor runs). `leader`: the scheduler's id and whether it leads now. Call before the scheduler
    runs so its catch-up is counted too.
    """
    for metric in SCHEDULER_METRICS:
        registry.register(metric)
    if isinstance(registry, ServiceRegistry):
        registry.require_caught_up("scheduler", follower)  # /readyz: 503 until it folded the log as of its start
    count_folded(follower, "scheduler")
    count_cluster_facts(follower)
    count_outcomes(follower)
    for kind in ("gang", "rank"):  # counters at 0 too (see JOB_STATUSES)
        RESTARTS.labels(kind)
    for cached in ("true", "false"):
        DATASETS_READY.labels(cached)
    registry.register(StateCollector(lambda: follower.state, heartbeat_ages, leader))
