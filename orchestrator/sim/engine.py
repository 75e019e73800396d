"""The event-driven simulation loop: the production `evolve`/`decide` on a virtual clock.

No NATS, no sleeping. A heap holds the future instants that can change
anything -- the next submit, the next completion, an outage or repair, a
time limit, the moment a young gang becomes preemptible, with
`SimConfig.log_checkpoints` each periodic checkpoint -- and the loop:

1. advances the clock to the next instant and appends what happens there
   (JobSubmitted, the workers' exits, NodeFailed, NodeRegistered, and for a
   GPU fault of the outage trace GpuUnhealthy, then GpuHealthy when it ends);
2. settles: calls `decide(state, now)`, folds its events through `evolve` in
   order (exactly what the log would do), lets the simulated agents answer
   (WorkerStarted, Checkpointed, WorkerExited), and repeats until decide has
   nothing left to say at this instant;
3. samples the timeline.

Every appended event gets a deterministic id and occurred_at = virtual time,
and is written in the real log format, so the file folds with the normal
`evolve` to the simulation's final state.

Settling stops early when a decide round only produced JobWaiting,
JobRejected or JobRunning (without releasing an earmark), or the end of a
gang nobody waits on (JobCompleted, JobFailed, JobCancelled of a gang not
being preempted, with no job depending on it nor array element waiting for
its slot: core/gating.py): folding those changes nothing decide reads besides the
waiting reasons it just wrote -- an ended gang's GPUs were already free in
that round's plan (core/tentative.py) -- so another round would return
nothing. Strict mode checks that claim -- and the safety invariants -- after
every instant.
"""

from __future__ import annotations

import math
import time
from bisect import insort
from collections import deque
from collections.abc import Callable, Sequence
from heapq import heappop, heappush
from typing import IO, Any, NamedTuple

from orchestrator.core.decide import decide, decide_cycle
from orchestrator.core.evolve import evolve
from orchestrator.core.gating import end_ungates
from orchestrator.core.model.facts import SETTLE_S
from orchestrator.core.model.memo import Memo
from orchestrator.core.model.state import HOLDING, RESERVING, ClusterState, Job
from orchestrator.policies import Policies
from orchestrator.policies.victims import protected_for
from orchestrator.sim.agents import checkpointed, workers_exited, workers_started
from orchestrator.sim.baselines import policies_for
from orchestrator.sim.cluster import EPOCH
from orchestrator.sim.invariants import violations
from orchestrator.sim.specs import SimJob
from orchestrator.sim.staging import Plan as StagePlan
from orchestrator.sim.staging import Stager, StagingStats
from orchestrator.sim.threat import preemption_threat
from orchestrator.sim.timeline import Timeline
from orchestrator.sim.trace import Outage
from orchestrator.sim.work import Work
from schemas.codec import encode
from schemas.events import (
    CancelRequested,
    Event,
    GangReserved,
    GangRestarted,
    GpuHealthy,
    GpuUnhealthy,
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobRejected,
    JobRunning,
    JobSubmitted,
    JobWaiting,
    NodeFailed,
    NodeRegistered,
    PreemptionRequested,
    WorkerStarted,
)

# Heap entry kinds; at one instant they are handled in this order.
_FINISH, _FAIL, _REPAIR, _SUBMIT, _WAKE, _GPU_REPAIR, _STAGED, _CHECKPOINT = range(8)

#: Follow-ups that end a gang; decide already planned with its GPUs free (see the module docstring).
_ENDED = (JobCompleted, JobFailed, JobCancelled)

#: Decide rounds at one instant before the simulator calls it a livelock.
MAX_ROUNDS = 64


class SimConfig(NamedTuple):
    #: Seconds of work between checkpoints (0: checkpoint on the preemption signal only).
    checkpoint_interval_s: float = 1800.0
    #: The simulated agents log each periodic checkpoint as it is saved (Checkpointed, as a real job's
    #: agent does), so the core's victim cost sees the work a stop would lose; False logs a checkpoint
    #: only when an attempt is stopped (round 2's records: victims' whole attempts looked at risk).
    log_checkpoints: bool = True
    #: Seconds every restarted attempt spends before it makes progress again.
    restart_overhead_s: float = 120.0
    #: Check the invariants and the settle shortcut at every instant (slow; for tests).
    strict: bool = False
    #: Skip admission in a round that only marks placed gangs running, when the placing round's
    #: admission was complete (core/decide.decide_cycle); False admits in every round (for tests).
    skip_complete: bool = True
    #: Dataset staging (issue #33, staging.py): each node's staging bandwidth in GB/s, and its cache size
    #: in GB (0: unbounded). Jobs without datasets never stage.
    staging_gbps: float = 1.0
    cache_gb: float = 1000.0


class Scenario(NamedTuple):
    """What to simulate: the log's setup (cluster, queues, settings), the jobs, the outages."""

    setup: tuple[Event, ...]
    jobs: tuple[SimJob, ...]
    outages: tuple[Outage, ...] = ()


class RunStats(NamedTuple):
    events: int
    decides: int
    #: Decide calls made after a complete admission (SimConfig.skip_complete): they skip
    #: admission unless their follow-ups do more than mark gangs running.
    admission_skips: int
    wall_s: float
    voids: int
    time_limit_kills: int
    unfinished: int
    #: GPU faults of the trace that took effect, and the GPU-seconds their GPUs were out of service.
    gpu_faults: int = 0
    gpu_fault_down_s: float = 0.0


class SimResult(NamedTuple):
    policy: str
    state: ClusterState
    timeline: Timeline
    work: dict[str, Work]
    stats: RunStats
    #: What dataset staging cost (None: no job of the run had datasets).
    staging: StagingStats | None = None


class SimulationError(RuntimeError):
    pass


class _LogWriter:
    """Buffers encoded events and writes them in chunks (one JSON event per line)."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f = f
        self.buf: list[bytes] = []

    def add(self, event: Event) -> None:
        self.buf.append(encode(event))
        if len(self.buf) >= 4096:
            self.flush()

    def flush(self) -> None:
        if self.buf:
            self.f.write(b"\n".join(self.buf) + b"\n")
            self.buf.clear()


class Simulation:
    def __init__(self, scenario: Scenario, policy: str = "corral", config: SimConfig | None = None,
                 log: IO[bytes] | None = None, on_instant: Callable[[Simulation], None] | None = None,
                 policies: Policies | None = None) -> None:
        """`policies` runs a what-if record (a changed field) instead of `policy`'s, under its name."""
        self.scenario = scenario
        self.policy = policy
        self.config = config if config is not None else SimConfig()
        self.policies = policies if policies is not None else policies_for(policy)
        self.state = ClusterState()
        self.timeline = Timeline()
        self.work: dict[str, Work] = {}
        self.now = 0.0
        self.events = 0
        self.decides = 0
        #: What decide keeps between calls, for this run (core/model/memo.py).
        self.memo = Memo()
        self.skips = 0
        self.kills = 0
        self._log = _LogWriter(log) if log is not None else None
        self._on_instant = on_instant
        self._heap: list[tuple[float, int, int, Any]] = []
        self._n = 0
        self._wakes: set[float] = set()
        #: (time a gang becomes preemptible, job), sorted.
        self._maturing: deque[tuple[float, str]] = deque()
        self._preempts = self.policies.preemption_searches > 0
        #: (node, GPU) -> when its fault began, while it is out of service.
        self._gpu_down: dict[tuple[str, int], float] = {}
        self.gpu_faults = 0
        self.gpu_fault_down_s = 0.0
        #: Dataset staging (staging.py), and the attempts staging now: job -> its staging plan.
        self.stager = Stager(self.config.staging_gbps, self.config.cache_gb)
        self._staging: dict[str, StagePlan] = {}

    # --- plumbing -----------------------------------------------------------------------

    def _push(self, at: float, kind: int, payload: Any) -> None:
        self._n += 1
        heappush(self._heap, (float(at), kind, self._n, payload))  # float: snapshots must not see ints

    def append(self, event: Event) -> None:
        """Fold one event into the state (and the log file), telling the timeline what it changed."""
        jid: str | None = getattr(event, "job_id", None)
        before = self.state.jobs.get(jid) if jid is not None else None
        evolve(self.state, event)  # type: ignore[arg-type]
        self.events += 1
        if self._log is not None:
            self._log.add(event)
        if jid is not None:
            after = self.state.jobs.get(jid)
            if after is not None and (before is None or before.status != after.status):
                prev = before.status if before is not None else None
                self.timeline.transition(self.state, after, prev, self.now)

    def _capacity(self) -> int:
        return sum(n.inventory.gpu_count - len(n.gpu_faults) for n in self.state.nodes.values() if n.schedulable)

    # --- the loop -------------------------------------------------------------------------

    def run(self) -> SimResult:
        started = time.perf_counter()
        for e in self.scenario.setup:
            self.now = e.occurred_at
            self.append(e)
        self.timeline.set_capacity(self._capacity())
        for q in self.state.queues:
            self.timeline.queue_index(q)
        for job in self.scenario.jobs:
            self._push(job.submit_time, _SUBMIT, job)
            self.work[job.job_id] = Work(job.duration, job.gpus)
        for o in self.scenario.outages:
            self._push(o.time, _FAIL, o)
        if self.state.nodes:
            # The core judges "can never fit" only once the cluster settled: look again then.
            self._wake(max(n.registered_at for n in self.state.nodes.values()) + SETTLE_S)
        heap = self._heap
        while heap:
            now = heap[0][0]
            self.now = now
            changed = False
            while heap and heap[0][0] == now:
                _, kind, _, payload = heappop(heap)
                changed |= self._handle(kind, payload)
            if changed:
                self._settle()
                if self.config.strict:
                    self._check()
            self.timeline.sample(now)
            if self._on_instant is not None:
                self._on_instant(self)
            self._wake_for_preemption()
        if self._log is not None:
            self._log.flush()
        for since in self._gpu_down.values():  # (faults still open at the end count until then)
            self.gpu_fault_down_s += max(0.0, self.now - since)
        unfinished = sum(1 for j in self.state.jobs.values() if j.status not in ("completed", "failed", "cancelled", "rejected"))
        stats = RunStats(events=self.events, decides=self.decides, admission_skips=self.skips, wall_s=time.perf_counter() - started,
                         voids=self.state.voids, time_limit_kills=self.kills, unfinished=unfinished,
                         gpu_faults=self.gpu_faults, gpu_fault_down_s=self.gpu_fault_down_s)
        staged = self.stager.stats() if any(j.spec.dataset_list for j in self.scenario.jobs) else None
        return SimResult(self.policy, self.state, self.timeline, self.work, stats, staged)

    def _handle(self, kind: int, payload: Any) -> bool:
        """Append what happens at this instant; False when the entry turned out stale."""
        now = self.now
        if kind == _SUBMIT:
            job: SimJob = payload
            self.append(JobSubmitted(event_id=f"sim:submit:{job.job_id}", occurred_at=now, job_id=job.job_id,
                                     spec=job.spec, submitted_by="sim"))
            return True
        if kind == _FINISH:
            jid, attempt = payload
            j = self.state.jobs.get(jid)
            if j is None or j.attempt != attempt or j.status not in ("reserved", "running") or j.stop is not None:
                return False
            for e in workers_exited(self.state, j, now, "completed"):
                self.append(e)
            return True
        if kind == _FAIL:
            return self._fail(payload) if payload.gpu is None else self._gpu_fail(payload)
        if kind == _REPAIR:
            return self._repair(payload)
        if kind == _GPU_REPAIR:
            return self._gpu_repair(*payload)
        if kind == _STAGED:
            return self._staged(payload)
        if kind == _CHECKPOINT:
            self._checkpoint(*payload)
            return False  # nothing decide acts on changed: the next instant's decide reads it
        self._wakes.discard(now)
        return True

    def _settle(self) -> None:
        state = self.state
        complete = False  # the last round's admission was complete, and only WorkerStarted answered it
        rounds = 0
        while rounds < MAX_ROUNDS:
            out, done, more = decide_cycle(state, self.now, epoch=EPOCH, policies=self.policies,
                                               after_complete=complete, memo=self.memo)
            rounds += not more  # a burst of new jobs is judged in as many rounds as it takes (core/backlog.py)
            self.decides += 1
            self.skips += complete
            if complete and self.config.strict:
                full = decide(state, self.now, epoch=EPOCH, policies=self.policies, memo=self.memo)
                if full != out:
                    raise SimulationError(f"t={self.now}: a complete admission decided more: {full[len(out):]}")
            if not out:
                return
            inert = True
            voids = state.voids
            for e in out:
                if isinstance(e, JobWaiting):
                    j = state.jobs.get(e.job_id)
                    if j is not None and j.earmark and e.code != "preempting":
                        inert = False
                    if e.code == RESERVING and e.job_id not in state.holders:
                        inert = False  # decide reads who holds the backfill reservation
                elif isinstance(e, _ENDED):
                    j = state.jobs.get(e.job_id)
                    if j is not None and j.status == "preempting":
                        inert = False  # its preemptor stops waiting for it
                    if end_ungates(state, e.job_id):
                        inert = False  # jobs that waited for its end join their lines (core/gating.py)
                elif isinstance(e, JobRejected):
                    if end_ungates(state, e.job_id):
                        inert = False
                elif not isinstance(e, JobRunning):
                    inert = False
                self.append(e)
            if state.voids != voids and self.config.strict:
                raise SimulationError(f"t={self.now}: decide emitted a void decision: {state.last_void}")
            answers = self._agents(out)
            for e in answers:
                self.append(e)
            if inert and not answers and not more:
                return
            complete = self.config.skip_complete and done and all(isinstance(e, WorkerStarted) for e in answers)
        raise SimulationError(f"t={self.now}: decide did not settle after {MAX_ROUNDS} rounds")

    # --- the agents' answers --------------------------------------------------------------

    def _agents(self, decided: Sequence[Event]) -> list[Event]:
        state, now = self.state, self.now
        out: list[Event] = []
        for e in decided:
            if isinstance(e, (GangReserved, GangRestarted)):
                j = state.jobs[e.job_id]
                if j.status == "reserved" and j.attempt == e.attempt and not state.ranks.get(j.job_id):
                    out += self._stage(j) if j.spec.dataset_list else self._start(j)
            elif isinstance(e, PreemptionRequested):
                j = state.jobs[e.job_id]
                if j.status == "preempting" and j.attempt == e.attempt and not self._staging.pop(j.job_id, None):
                    out += self._interrupt(j, "preemption", signalled=True)
                    out += workers_exited(state, j, now, "preempted")
            elif isinstance(e, CancelRequested):
                j = state.jobs[e.job_id]
                if j.status in HOLDING and j.live:
                    self.kills += 1
                    self.work[j.job_id].abandon(now)
                    out += workers_exited(state, j, now, "killed")
            elif isinstance(e, JobCompleted):
                self.work[e.job_id].complete()
        return out

    def _start(self, job: Job) -> list[Event]:
        w = self.work[job.job_id]
        now = self.now
        done = w.start(now, self.config.restart_overhead_s)
        self._push(done, _FINISH, (job.job_id, job.attempt))
        limit = job.spec.time_limit_s
        if limit is not None and job.reserved_at + limit < done:
            self._wake(job.reserved_at + limit)
        if self._preempts and job.spec.preemptible:
            # Protection grows with each earlier stop (policies/victims.protected_for): keep the deque sorted.
            at = now + protected_for(self.state.config.min_runtime_s, max(0, job.attempt - 1 - job.restarts))
            if self._maturing and self._maturing[-1][0] > at:
                insort(self._maturing, (at, job.job_id))
            else:
                self._maturing.append((at, job.job_id))
        if self.config.log_checkpoints:
            self._next_checkpoint(job.job_id, w, w.saved)
        return list(workers_started(job, now))

    def _next_checkpoint(self, job_id: str, w: Work, after: float) -> None:
        """Schedule the running attempt's first periodic checkpoint past `after` seconds of work, if before its end."""
        interval = self.config.checkpoint_interval_s
        if interval <= 0:
            return
        step = (math.floor(after / interval) + 1) * interval
        if step < w.duration:
            self._push(w.started_at + w.overhead + (step - w.saved), _CHECKPOINT, (job_id, w.started_at, step))

    def _checkpoint(self, job_id: str, started_at: float, step: float) -> None:
        """A periodic checkpoint (SimConfig.log_checkpoints): rank 0 logs it if its attempt still runs; then the next."""
        j = self.state.jobs.get(job_id)
        w = self.work[job_id]
        if j is None or w.started_at != started_at or j.status not in ("reserved", "running") or j.stop is not None:
            return  # (that attempt ended: a later one has its own; nan never equals)
        e = checkpointed(j, self.now, step)
        if e is not None:
            self.append(e)
        self._next_checkpoint(job_id, w, step)

    def _stage(self, job: Job) -> list[Event]:
        """A gang with datasets: its nodes stage them first (staging.py); its ranks start when the last is there."""
        plan = self.stager.plan(job, self.now)
        if plan.ready_at <= self.now:  # every node holds every dataset: told, and started at once
            return [*self.stager.land(plan, self.state, self.now), *self._start(job)]
        self._staging[job.job_id] = plan
        self._push(plan.ready_at, _STAGED, plan)
        limit = job.spec.time_limit_s
        if limit is not None and job.reserved_at + limit < plan.ready_at:
            self._wake(job.reserved_at + limit)
        return []

    def _staged(self, plan: StagePlan) -> bool:
        """An attempt's datasets are on its nodes: the caches fill, and its ranks start if it is still placed."""
        for e in self.stager.land(plan, self.state, self.now):
            self.append(e)
        if self._staging.get(plan.job_id) is plan:
            del self._staging[plan.job_id]
        j = self.state.jobs.get(plan.job_id)
        if (j is not None and j.status == "reserved" and j.attempt == plan.attempt and j.stop is None
                and not self.state.ranks.get(j.job_id)):
            for e in self._start(j):
                self.append(e)
        return True

    def _interrupt(self, job: Job, cause: str, *, signalled: bool) -> list[Event]:
        """The running attempt stops early: record its newest checkpoint (and what was lost)."""
        w = self.work[job.job_id]
        now = self.now
        ck = w.interrupt(now, cause, self.config.checkpoint_interval_s, signalled=signalled)
        e = checkpointed(job, now, ck)
        return [e] if e is not None else []

    # --- nodes ----------------------------------------------------------------------------

    def _fail(self, o: Outage) -> bool:
        node = self.state.nodes.get(o.node_id)
        if node is None or node.failed:
            return False
        for jid in list(self.state.active):
            j = self.state.jobs[jid]
            if j.status in ("reserved", "running") and any(rp.node_id == o.node_id for rp in j.placement):
                if self._staging.pop(jid, None) is not None:
                    continue  # it was staging: no work to lose
                for e in self._interrupt(j, "failure", signalled=False):
                    self.append(e)
        self.append(NodeFailed(event_id=f"sim:fail:{o.node_id}:{node.incarnation}", occurred_at=self.now,
                               node_id=o.node_id, incarnation=node.incarnation, reason="outage from the trace"))
        self.timeline.set_capacity(self._capacity())
        if math.isfinite(o.duration):
            self._push(self.now + o.duration, _REPAIR, o.node_id)
        return True

    def _repair(self, node_id: str) -> bool:
        node = self.state.nodes[node_id]
        inc = str(int(node.incarnation) + 1) if node.incarnation.isdigit() else f"{node.incarnation}+1"
        self.append(NodeRegistered(event_id=f"sim:register:{node_id}:{inc}", occurred_at=self.now, node_id=node_id,
                                   incarnation=inc, address=node.address, inventory=node.inventory))
        self.timeline.set_capacity(self._capacity())
        return True

    def _gpu_fail(self, o: Outage) -> bool:
        """A GPU fault of the trace: the gang on it loses its work since its checkpoint and is requeued."""
        node = self.state.nodes.get(o.node_id)
        gpu = o.gpu
        assert gpu is not None
        if node is None or not 0 <= gpu < node.inventory.gpu_count or (o.node_id, gpu) in self._gpu_down:
            return False
        owner = self.state.owners[o.node_id][gpu]
        j = self.state.jobs.get(owner) if owner else None
        if j is not None and j.status in ("reserved", "running") and self._staging.pop(j.job_id, None) is None:
            for e in self._interrupt(j, "gpu_fault", signalled=False):
                self.append(e)
        self.gpu_faults += 1
        self._gpu_down[(o.node_id, gpu)] = self.now
        self.append(GpuUnhealthy(event_id=f"sim:gpu-fault:{o.node_id}:{gpu}:{self.gpu_faults}", occurred_at=self.now,
                                 node_id=o.node_id, gpu_index=gpu, gpu_uuid=node.inventory.gpus[gpu].uuid,
                                 reason="GPU fault from the trace", running_job=owner))
        self.timeline.set_capacity(self._capacity())
        if math.isfinite(o.duration):
            self._push(self.now + o.duration, _GPU_REPAIR, (o.node_id, gpu))
        return True

    def _gpu_repair(self, node_id: str, gpu: int) -> bool:
        since = self._gpu_down.pop((node_id, gpu), None)
        if since is None:
            return False
        self.gpu_fault_down_s += self.now - since
        self.append(GpuHealthy(event_id=f"sim:gpu-repair:{node_id}:{gpu}:{self.gpu_faults}", occurred_at=self.now,
                               node_id=node_id, gpu_index=gpu, reason="GPU fault of the trace over"))
        self.timeline.set_capacity(self._capacity())
        return True

    # --- wake-ups -------------------------------------------------------------------------

    def _wake(self, at: float) -> None:
        if at not in self._wakes:
            self._wakes.add(at)
            self._push(at, _WAKE, None)

    def _wake_for_preemption(self) -> None:
        """If jobs wait and a gang becomes preemptible before anything else happens, decide again then.

        With the default preemption rule only for a gang some pending job could
        preempt at all (`preemption_threat`): most wake-ups were for gangs nobody
        could preempt, and decided nothing. The waiting jobs change only at
        instants that decide anyway, and a wake-up is looked for again after each.
        """
        m = self._maturing
        while m and m[0][0] <= self.now:
            m.popleft()
        if not m or not self.state.pending:
            return
        nxt = self._heap[0][0] if self._heap else math.inf
        if m[0][0] >= nxt:
            return
        threat = preemption_threat(self.state) if self.policies.preemption.priority_or_reclaim_only else None
        jobs = self.state.jobs
        for at, jid in m:
            if at >= nxt:
                return
            # A job that finished may have left the fold already (past FINISHED_KEPT): nothing to preempt.
            j = jobs.get(jid)
            if j is None:
                continue
            if threat is None or (j.status in ("reserved", "running") and j.stop is None and threat(j)):
                self._wake(at)
                return

    def _check(self) -> None:
        bad = violations(self.state)
        if bad:
            raise SimulationError(f"t={self.now}: " + "; ".join(bad[:5]))
        extra = decide(self.state, self.now, epoch=EPOCH, policies=self.policies, memo=self.memo)
        if extra:
            raise SimulationError(f"t={self.now}: decide was not settled: {[type(e).__name__ for e in extra]}")


def simulate(scenario: Scenario, policy: str = "corral", config: SimConfig | None = None,
             log: IO[bytes] | None = None, policies: Policies | None = None,
             on_instant: Callable[[Simulation], None] | None = None) -> SimResult:
    """`on_instant` is called after each simulated instant (a progress bar's tick: keep it cheap)."""
    return Simulation(scenario, policy, config, log, on_instant, policies).run()
