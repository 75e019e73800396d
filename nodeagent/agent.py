"""The node agent: turns the ranks the log places on this node into running workers.

It reads only its node's slice of the log (issue #40; events/subjects.py:
`slice_filters`, filtered by the server): the scheduler's orders to this node
(WorkAssigned, WorkChanged), its own facts and reports, the elections. It folds
them into a `NodeView` (orchestrator/core/node_view.py), starting from the
view the scheduler stored for this node (events/nodeviews.py), so its memory
and what the server sends it do not grow with the cluster or its history.
"What should run here" is a pure read of the view
(`orchestrator.core.node_view.node_work`); the agent's job is the difference
between that and the workers that exist. Everything it learns (a worker
started, exited, checkpointed) goes back into the log as an event whose id is
derived from the worker's identity, so a retried or repeated report is stored
once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal as signals
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import structlog
from nats.js.kv import KeyValue

from events import telemetry
from events.bus import Bus, BusError, append_reclaiming
from events.follow import Follower
from events.logsource import LogSource
from events.nodeviews import NodeViewStore
from events.subjects import slice_filters
from events.swallowed_cancel import stop_if_cancelled
from nodeagent.backoff import Backoff
from nodeagent.checkpoint import checkpoint_dir, checkpoint_failure, newest_manifest, step_of
from nodeagent.datasets.cache import DatasetCache
from nodeagent.datasets.limits import Limits
from nodeagent.datasets.stager import Stager
from nodeagent.gpu_health import Finding, GpuHealthWatch
from nodeagent.heartbeat import publish_heartbeats, put_heartbeat
from nodeagent.logs import LogServer
from nodeagent.rank_env import GangPart, ignored_spec_env, node_env, over_node_env, part_env
from nodeagent.runtime.base import ExitInfo, Runtime, WorkerHandle, WorkerSpec, stop_with_grace
from nodeagent.shutdown import REPORT_S, SHUTDOWN_GRACE_S, end_within, until_done
from nodeagent.start_rules import backoff_left, blocked, held_gpus, next_generation, on_faulty_gpu, restarts_rank
from nodeagent.stdin import StdinServer, stdin_mode
from orchestrator.core.model.slices import NodeJob
from orchestrator.core.model.state import SHUTDOWN
from orchestrator.core.node_view import NodeView, evolve_node, node_work, rank_intent
from orchestrator.core.node_work import Intent, WorkerKey
from schemas import (
    Checkpointed,
    Event,
    GpuHealthy,
    GpuUnhealthy,
    Inventory,
    NodeHealthChecked,
    NodeRecovered,
    NodeRegistered,
    WorkerExited,
    WorkerStarted,
)
from schemas.events import GPU_FATAL
from schemas.heartbeat import HEARTBEAT_BUCKET

log = structlog.get_logger("corral.agent")

#: Grace for stopping a worker nobody wants any more (superseded attempt, requeued gang).
UNWANTED_GRACE_S = 5.0
#: How often running workers' checkpoint dirs are scanned for new manifests.
CHECKPOINT_SCAN_S = 1.0


@dataclass
class Tracked:
    handle: WorkerHandle
    spec: WorkerSpec
    grace_s: float
    signal_name: str
    restart_policy: str
    max_restarts: int
    #: Its job is preemptible, so it takes the checkpoint signal (preemption, a graceful shutdown).
    checkpoints: bool = True
    #: Why we are ending it: preempted | cancelled | killed | shutdown; None while it should run.
    ending: str | None = None
    signaled_at: float = 0.0
    checkpoint_step: int = -1
    #: `checkpoint_step` when the checkpoint signal was sent: a newer one is the preemption's checkpoint.
    step_at_signal: int = -1
    waiter: asyncio.Task[None] | None = None
    stopper: asyncio.Task[ExitInfo] | None = None
    #: Its process has ended and its exit is in the log: it holds no GPU, though it stays tracked until removed
    #: and its report is folded.
    exited: bool = False
    #: Adopted after a restart: which GPUs it holds is not recorded with the worker.
    gpus_unknown: bool = False
    #: Its WorkerStarted is in the log; False for one whose attempt ended while it was starting.
    told: bool = True

    @property
    def gpus(self) -> tuple[int, ...]:
        return self.spec.gpus


@dataclass(frozen=True)
class AgentConfig:
    node_id: str
    address: str = "127.0.0.1"
    data_dir: Path = Path(".corral/agent")
    #: Where ranks checkpoint (shared storage in a real cluster, so a requeued job resumes elsewhere).
    checkpoint_root: Path | None = None
    heartbeat_s: float = 10.0  # a Kubernetes node lease's renewal (README, "Liveness")
    tick_s: float = 0.5
    #: Docker renumbers the GPUs it exposes from 0 inside the container.
    isolated_gpus: bool = False
    backoff: Backoff = field(default_factory=Backoff)
    #: How long one GPU health poll waits for Xid events (the watch runs only with a `GpuHealthWatch`).
    health_poll_s: float = 1.0
    #: The operator's health-check command (a shell line, like Slurm's HealthCheckProgram): a non-zero
    #: exit drains the node with its output, a pass after that brings it back. None: no check.
    health_check: str | None = None
    health_check_interval_s: float = 60.0
    health_check_timeout_s: float = 60.0
    #: Variables every worker of this node gets over its node baseline (`--worker-env`: NCCL settings, say).
    worker_env: tuple[tuple[str, str], ...] = ()
    #: The node-local dataset cache (nodeagent/datasets/; default DATA_DIR/datasets) and its size limit (0: none).
    dataset_cache: Path | None = None
    dataset_cache_bytes: int = 0
    #: Where s3:// dataset sources are (MinIO, Ceph); None: the AWS chain's own (AWS_ENDPOINT_URL, the profile).
    s3_endpoint_url: str | None = None
    #: What one staging may take: bytes, members, ratio, time, stall, the staging child's memory (#39).
    dataset_limits: Limits = field(default_factory=Limits)


class Agent:
    def __init__(self, bus: Bus, config: AgentConfig, inventory: Inventory, runtime: Runtime,
                 health: GpuHealthWatch | None = None, history: LogSource | None = None) -> None:
        self.bus = bus
        self.health = health
        #: Serializes NVML polls (the loop's, and the one a crashing worker's report waits for).
        self._health_lock = asyncio.Lock()
        self._health_n = 0
        #: GPUs the log had out of service at the last look: one undrained since is watched afresh.
        self._faulted: frozenset[int] = frozenset()
        self.config = config
        self.inventory = inventory
        self.runtime = runtime
        # Its node's slice only, filtered by the server (#40); one clock for time (#30).
        # `history` (--archive): the archive and the stream as one log, so a node whose view is damaged or
        # missing reads its slice from the log's start even after retention (events/nodeviews.py).
        self.follower = Follower(history if history is not None else bus, evolve_node,
                                 NodeView(node_id=config.node_id), stream_times=True,
                                 subjects=slice_filters(config.node_id))
        self.incarnation = uuid.uuid4().hex[:12]
        self.workers: dict[WorkerKey, Tracked] = {}
        self._restarting: set[WorkerKey] = set()
        #: Ranks whose start failed -> the seq of that WorkerExited: not started again before it is folded.
        self._failed_starts: dict[WorkerKey, int] = {}
        #: The position of the NodeFailed our last NodeRecovered answered (Node.failed_seq): one
        #: recovery per failure, however many partitions.
        self._recovered_for = 0
        self._hb_kv: KeyValue | None = None
        self._tasks: set[asyncio.Task[object]] = set()
        self._checkpoints_scanned = 0.0
        #: A runtime that runs workers on this host (the process runtime) gives them the job's `workdir`
        #: and start from `node_env`; a container starts in its image's directory with its image's env.
        self._on_host = bool(getattr(runtime, "on_host", False))
        self._node_env = (node_env() if self._on_host else {}) | dict(config.worker_env)
        #: Seconds until the soonest gang-restart backoff the last reconcile pass waited on ends (None: none).
        self._backoff_left: float | None = None
        #: A graceful shutdown began (`shut_down`): nothing starts or restarts any more.
        self._stopping = False
        #: Held while a worker starts: a shutdown waits for the start in flight, so no worker escapes it.
        self._starting = asyncio.Lock()
        #: Stages the datasets of gangs placed here before their ranks start (#33).
        self.stager = Stager(self.node_id, self.incarnation,
                             DatasetCache(config.dataset_cache or config.data_dir / "datasets",
                                          config.dataset_cache_bytes),
                             append=self._append, state=lambda: self.follower.state, spawn=self._spawn,
                             s3_endpoint_url=config.s3_endpoint_url, limits=config.dataset_limits)

    @property
    def node_id(self) -> str:
        return self.config.node_id

    # --- lifecycle ---------------------------------------------------------------

    async def run(self) -> None:
        """Register, adopt what survived a restart, then reconcile until cancelled."""
        await self._catch_up_from_view()
        await self.stager.start()
        await self._adopt()
        # Fold what adoption reported (exits while we were down) before the first reconcile:
        # until then the state still says those ranks run, and reconcile would start them again.
        await self.follower.catch_up()
        registered = await self._append(
            NodeRegistered(
                event_id=f"register:{self.node_id}:{self.incarnation}",
                occurred_at=time.time(),
                node_id=self.node_id,
                incarnation=self.incarnation,
                address=self.config.address,
                inventory=self.inventory,
            )
        )
        hb_kv = self._hb_kv = await self.bus.kv(HEARTBEAT_BUCKET)
        # `corral logs` asks this node for its workers' output (nodeagent/logs.py).
        logs = await LogServer(self.node_id, self.config.data_dir / "logs", self.runtime,
                               lambda: self.workers).serve(self.bus.nc)
        # An interactive job's rank 0 reads what its `corral run` sends (nodeagent/stdin.py).
        stdin = StdinServer(self.node_id, self.runtime, lambda: self.workers, lambda: self.follower.state.work)
        stdin_sub = await stdin.serve(self.bus.nc)
        log.info("agent_started", node_id=self.node_id, incarnation=self.incarnation, gpus=self.inventory.gpu_count)
        try:
            stop_if_cancelled()  # a SIGTERM one of the start-up's nats waits swallowed: the loops below never saw it
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self.follower.follow())
                tg.create_task(
                    publish_heartbeats(
                        hb_kv, self.node_id, self.incarnation, self.config.heartbeat_s, lambda: len(self.workers)
                    )
                )
                tg.create_task(self._reconcile_loop())
                tg.create_task(self._announce_datasets(registered))
                if self.health is not None:
                    tg.create_task(self._health_loop(self.health))
                if self.config.health_check:
                    tg.create_task(self._health_check_loop(self.config.health_check))
        finally:
            self.stager.close()
            with contextlib.suppress(Exception):
                await logs.unsubscribe()
            with contextlib.suppress(Exception):
                await stdin_sub.unsubscribe()
            stdin.close()
            for t in list(self._tasks):
                t.cancel()
            for t in list(self._tasks):
                with contextlib.suppress(BaseException):
                    await t

    async def _catch_up_from_view(self) -> None:
        """The node's state now: the view the scheduler stored for it, then its slice after it (or all of it).

        Everything the agent decides from is in the view (the workers it reported and never saw end,
        `unended`; a gang restart's backoff, `not_before`; the failure a recovery answers, the node's
        `failed_seq`), so a start from a stored view decides as a fold of the whole slice.
        """
        t0 = time.monotonic()
        start = 0
        if self.follower.state.seq == 0:
            stored = await NodeViewStore(self.bus.js, replicas=self.bus.replicas).load(self.node_id, NodeView)
            if stored is not None:
                start, view = stored
                view.node_id, view.seq = self.node_id, start  # (`_base`'s is nobody's; a view holds through it)
                self.follower.state = view
        await self.follower.catch_up()
        log.info("caught_up", node_id=self.node_id, seq=self.follower.state.seq, from_view=start,
                 read_through=self.follower.read_through, jobs=len(self.follower.state.work),
                 seconds=round(time.monotonic() - t0, 3))

    def _spawn(self, coro: object) -> asyncio.Task[object]:
        task: asyncio.Task[object] = asyncio.ensure_future(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _append(self, event: Event) -> int:
        """Append a fact this agent observed, retrying until the log takes it.

        Only this agent knows it (a worker started or exited, a checkpoint appeared). Dropped,
        the rank would stay "running" in every reader's state, and reconcile would start the
        worker again. A BusError means the log refused or was out of reach for a while (a full
        stream, a long partition); the event id makes every retry the same event.
        """
        delay = 0.5
        while True:
            try:
                (seq,) = await append_reclaiming(self.bus, [event])
                break
            except BusError as e:
                log.warning("append_retry", event_id=event.event_id, error=str(e), retry_in_s=delay)
                await asyncio.sleep(delay)
                delay = min(2 * delay, 10.0)
        telemetry.EVENTS_APPENDED.labels("agent").inc()
        return seq

    # --- adoption (agent restart) ----------------------------------------------------

    async def _adopt(self) -> None:
        """Take over the workers a previous agent process left: track the live, report the dead.

        And tell the log what that process could not: a start it never reported, a rank whose
        worker is gone without a trace.
        """
        state = self.follower.state
        seen: set[WorkerKey] = set()
        for found in await self.runtime.adopt():
            lb = found.handle.labels
            key = (lb.job_id, lb.attempt, lb.rank)
            seen.add(key)
            job = state.work.get(lb.job_id)
            current = job is not None and job.attempt == lb.attempt
            rank = job.report(lb.rank) if job is not None and current else None
            if found.running:
                if job is None:
                    await stop_with_grace(self.runtime, found.handle, UNWANTED_GRACE_S)
                    await self.runtime.remove(found.handle)
                    continue
                tr = self._track(found.handle, job, lb.restarts)
                tr.gpus_unknown = True
                log.info("worker_adopted", job_id=lb.job_id, attempt=lb.attempt, rank=lb.rank)
                if current and (rank is None or rank.status == "restarting"):
                    # Its agent died between starting it and telling the log: tell it now, under the
                    # id that agent would have used (so if it did, this one dedupes).
                    await self._report_started(key, lb.restarts, found.handle.worker_id)
                tr.waiter = self._spawn(self._watch(key, tr))  # type: ignore[assignment]
                continue
            # Its end is told if the log has this generation (or a later one) exited or restarting: the
            # agent died after the report, before removing it. Told again past the duplicate window, a
            # restart would turn into a failure.
            told = rank is not None and rank.status != "started" and rank.restarts >= lb.restarts
            if current and not told:
                info = found.exit or ExitInfo.of(None, None)
                log.info("worker_exited_while_down", job_id=lb.job_id, rank=lb.rank, reason=info.reason)
                await self._report_exit(key, lb.restarts, info, info.reason, will_restart=False)
            await self.runtime.remove(found.handle)
        # A rank the log says runs here whose worker left no trace (container removed, runtime state
        # lost) is lost: the scheduler requeues its gang from the newest checkpoint. Started again
        # as it is, its events would reuse the vanished worker's ids and dedupe away.
        for key in node_work(state):
            nj = state.work.get(key[0])
            rank = nj.report(key[2]) if nj is not None else None
            if key not in seen and rank is not None and rank.status == "started":
                log.warning("worker_vanished", job_id=key[0], attempt=key[1], rank=key[2])
                info = ExitInfo.of(None, None, "no worker of this rank was found after the agent restarted")
                await self._report_exit(key, rank.restarts, info, info.reason, will_restart=False)
        # The same for a worker of an attempt that ended meanwhile (its gang was requeued while this agent
        # was down): the fold no longer cares, but left untold the log would show it running on its GPUs
        # forever, beside every later worker there.
        for key, generation in list(state.slice.unended.items()):
            job = state.work.get(key[0])
            if key not in seen and (job is None or job.attempt != key[1]):
                log.warning("worker_vanished", job_id=key[0], attempt=key[1], rank=key[2], attempt_ended=True)
                info = ExitInfo.of(None, None, "no worker of this superseded attempt was found after the agent "
                                               "restarted")
                await self._report_exit(key, generation, info, info.reason, will_restart=False)

    def _track(self, handle: WorkerHandle, job: NodeJob, restarts: int, spec: WorkerSpec | None = None) -> Tracked:
        lb = handle.labels
        tr = Tracked(
            handle=handle,
            spec=spec
            or WorkerSpec(
                job_id=lb.job_id,
                attempt=lb.attempt,
                rank=lb.rank,
                node_id=lb.node_id,
                command=job.spec.command,
                restarts=restarts,
                checkpoint_dir=str(self._checkpoint_dir(job, lb.attempt, lb.rank)),
                stdin=stdin_mode(job, lb.rank, self._on_host),
            ),
            grace_s=job.spec.grace_period_s,
            signal_name=job.spec.checkpoint_signal,
            restart_policy=job.spec.restart_policy,
            max_restarts=job.spec.max_restarts,
            checkpoints=job.spec.preemptible,
        )
        self.workers[(lb.job_id, lb.attempt, lb.rank)] = tr
        return tr

    # --- reconciling --------------------------------------------------------------

    async def _reconcile_loop(self) -> None:
        while True:
            stop_if_cancelled()
            # A backoff ending before the next tick wakes the pass then: nothing else happens in the log
            # at that moment, and a tick late would stretch a 1 s backoff by half.
            wake = self.config.tick_s if self._backoff_left is None else min(self.config.tick_s, self._backoff_left)
            await self.follower.wait_changed(max(wake, 0.0))
            self.follower.changed.clear()
            await self.reconcile()

    async def reconcile(self) -> None:
        if self._stopping:
            return  # its workers are the shutdown's now (nodeagent/shutdown.py)
        state = self.follower.state
        await self._recover(state)
        self.stager.evict_requested(state.node)  # `corral datasets evict` (once no job here uses the dataset)
        work = node_work(state)
        now = time.monotonic()
        if self._failed_starts:
            self._failed_starts = {k: seq for k, seq in self._failed_starts.items() if seq > state.seq}
        # Stale workers first (a superseded attempt, a requeued gang, orphans adopted after a
        # restart): their stop begins before anything is started, and until they are gone their
        # GPUs are held (start_rules.py: `held_gpus`).
        self._stop_unwanted()
        held = held_gpus(self.workers, work)
        log_now = self.follower.clock.now()  # the log's clock, as the backoff's end is (#30)
        self._backoff_left = None
        for key in work:
            # Asked again of the state as it is now: the pass awaits each start, and meanwhile a
            # worker may have exited and been forgotten; by the pass's first reading it would
            # run again (its second run invisible in the log, as its event ids dedupe).
            intent = rank_intent(self.follower.state, key)
            tr = self.workers.get(key)
            if tr is None:
                if (intent == "run" and key not in self._restarting and key not in self._failed_starts
                        and not self._backing_off(key, log_now) and not self._blocked(key, held)
                        and self._staged(key)):
                    await self._start(key, restarts=next_generation(self.follower.state, key))
            elif intent is not None:
                await self._steer(key, tr, intent, now)
        self._stop_unwanted()  # what the pass's awaits made stale
        if now - self._checkpoints_scanned >= CHECKPOINT_SCAN_S:
            # Periodic checkpoints go into the log as they appear (not only on preemption), so a
            # gang requeued after its node died resumes from the newest one instead of step 0.
            self._checkpoints_scanned = now
            for key, tr in list(self.workers.items()):
                if tr.ending is None and work.get(key) == "run":
                    await self._report_checkpoint(key, tr)

    async def _recover(self, state: NodeView) -> None:
        """Declared dead (a partition, a pause) but alive: say so, once for each NodeFailed.

        Our gangs were requeued meanwhile; the node takes work again once this is folded.
        """
        me = state.node
        if me is None or not me.failed or me.incarnation != self.incarnation:
            return
        failed_at = me.failed_seq
        if self._recovered_for == failed_at:
            return  # answered; our NodeRecovered is not folded yet
        self._recovered_for = failed_at
        log.warning("node_recovering", node_id=self.node_id, failed_at_seq=failed_at)
        if self._hb_kv is not None:
            # A beat first: the scheduler judges silence from the last beat it received, and one
            # from before the pause would fail the node again the moment it is back.
            await put_heartbeat(self._hb_kv, self.node_id, self.incarnation, len(self.workers))
        await self._append(
            NodeRecovered(
                event_id=f"recovered:{self.node_id}:{self.incarnation}:{failed_at}",
                occurred_at=time.time(),
                node_id=self.node_id,
                incarnation=self.incarnation,
            )
        )

    def _stop_unwanted(self) -> None:
        """Begin stopping every worker the log no longer wants here (at most the usual grace)."""
        for key, tr in list(self.workers.items()):
            if tr.ending is None and rank_intent(self.follower.state, key) is None:
                tr.ending = "killed"
                tr.stopper = asyncio.ensure_future(
                    stop_with_grace(self.runtime, tr.handle, min(tr.grace_s, UNWANTED_GRACE_S))
                )

    def _staged(self, key: WorkerKey) -> bool:
        """Whether every node of `key`'s gang holds every dataset of its attempt (the fold says); if not,
        make sure this node stages its part (core/staging.py, nodeagent/datasets/)."""
        job = self.follower.state.work[key[0]]
        ready = job.staged
        if ready and self.stager.holds(job):
            return True
        self.stager.ensure(job, again=ready)  # (ready, yet not here: the cache was wiped under us)
        return False

    async def _announce_datasets(self, registered: int) -> None:
        """Once our registration is folded: tell the log what the dataset cache holds, if it does not know."""
        await self.follower.wait_for_seq(registered)
        await self.stager.announce()

    def _backing_off(self, key: WorkerKey, log_now: float | None) -> bool:
        """Whether `key`'s attempt waits out a gang restart's backoff (start_rules.py: `backoff_left`); the
        soonest end of one wakes the next reconcile pass (`_backoff_left`)."""
        left = backoff_left(self.follower.state.work.get(key[0]), key[1], log_now, self.config.tick_s)
        if left is None:
            return False
        self._backoff_left = left if self._backoff_left is None else min(self._backoff_left, left)
        return True

    def _blocked(self, key: WorkerKey, held: set[int] | None) -> bool:
        """A new worker waits until no old one holds any of its GPUs (reconcile retries each tick)."""
        if held is not None and not held:
            return False
        job = self.follower.state.work[key[0]]
        gpus = next((p.gpus for p in job.ranks if p.rank == key[2]), ())
        if blocked(held, gpus):
            log.info("worker_start_deferred", job_id=key[0], rank=key[2], reason="GPUs still held by a stopping worker")
            return True
        return False

    async def _steer(self, key: WorkerKey, tr: Tracked, intent: Intent, now: float) -> None:
        if intent == "checkpoint":
            if tr.ending is None:
                tr.ending = "preempted"
                tr.signaled_at = now
                tr.step_at_signal = tr.checkpoint_step
                sig = getattr(signals, tr.signal_name, signals.SIGUSR1)
                log.info("checkpoint_signal", job_id=key[0], rank=key[2], signal=tr.signal_name)
                await self.runtime.signal(tr.handle, int(sig))
            await self._report_checkpoint(key, tr)
            job = self.follower.state.work.get(key[0])
            grace = job.grace_s if job is not None and job.grace_s > 0 else tr.grace_s
            if tr.stopper is None and now - tr.signaled_at > grace:
                log.warning("grace_expired", job_id=key[0], rank=key[2], grace_s=grace)
                tr.stopper = asyncio.ensure_future(stop_with_grace(self.runtime, tr.handle, 0.0))
        elif intent == "stop" and tr.stopper is None:
            tr.ending = tr.ending or "cancelled"
            tr.stopper = asyncio.ensure_future(stop_with_grace(self.runtime, tr.handle, tr.grace_s))

    async def _report_checkpoint(self, key: WorkerKey, tr: Tracked) -> None:
        """Append the newest checkpoint `key`'s worker wrote, if new and its attempt is current.

        Only a current attempt's, and only manifests of that attempt: a worker of an earlier one
        (an orphan, a stale worker after a partition) may still be writing, and the log would
        then credit the new attempt with steps it never reached.
        """
        if tr.spec.checkpoint_dir is None or rank_intent(self.follower.state, key) is None:
            return
        manifest = newest_manifest(tr.spec.checkpoint_dir, attempt=key[1])
        if manifest is None or manifest.step <= tr.checkpoint_step:
            return
        tr.checkpoint_step = manifest.step
        job_id, attempt, rank = key
        await self._append(
            Checkpointed(
                event_id=f"ckpt:{job_id}:{attempt}:{rank}:{manifest.step}",
                occurred_at=time.time(),
                job_id=job_id,
                attempt=attempt,
                rank=rank,
                step=manifest.step,
                path=manifest.path,
                node_id=self.node_id,
            )
        )

    def _checkpoint_dir(self, job: NodeJob, attempt: int, rank: int) -> Path:
        """One directory per attempt and rank: an earlier attempt's orphan never writes into it.

        A new attempt resumes from the path the log recorded (CORRAL_RESUME_FROM, in an
        earlier attempt's directory), not from whatever it finds here.
        """
        root = self.config.checkpoint_root or self.config.data_dir / "checkpoints"
        base = Path(job.spec.checkpoint_dir) if job.spec.checkpoint_dir else root / job.job_id
        return checkpoint_dir(base, attempt, rank)

    def _warn_ignored_env(self, job: NodeJob, attempt: int) -> None:
        """Say once per attempt and node (at its first rank's first start) which spec env keys corral overrides."""
        if ignored := ignored_spec_env(job.spec):
            log.warning("spec_env_ignored", job_id=job.job_id, attempt=attempt, keys=list(ignored),
                        why="corral sets these for every rank; the job's values are dropped")

    async def _start(self, key: WorkerKey, restarts: int) -> None:
        async with self._starting:
            if not self._stopping:
                await self._start_worker(key, restarts)

    async def _start_worker(self, key: WorkerKey, restarts: int) -> None:
        job_id, attempt, rank = key
        state = self.follower.state
        if rank_intent(state, key) != "run":
            return  # never a worker for an attempt that is not current in our fold now
        job = state.work[job_id]
        placement = next(p for p in job.ranks if p.rank == rank)
        if restarts == 0 and rank == job.ranks[0].rank:
            self._warn_ignored_env(job, attempt)
        workdir = job.spec.working_dir if self._on_host else None
        if workdir is not None and not os.path.isdir(workdir):
            # The same on every retry: the job fails now with the reason, no restart (evolve_workers: unstartable).
            why = f"workdir {workdir} does not exist on node {self.node_id}"
            log.warning("worker_start_failed", job_id=job_id, rank=rank, error=why)
            self._failed_starts[key] = await self._report_exit(
                key, restarts, ExitInfo(None, None, "crashed", why), "unstartable", will_restart=False
            )
            return
        ckpt = self._checkpoint_dir(job, attempt, rank)
        env = over_node_env(self._node_env, part_env(
            GangPart(job.ranks, job.world_size, job.node_rank, job.master_addr),
            rank,
            job_id=job_id,
            attempt=attempt,
            master_port=job.master_port,
            spec=job.spec,
            resume_from=job.resume_from,
            checkpoint_dir=str(ckpt),
            isolated_gpus=self.config.isolated_gpus,
        )) | self.stager.env(job, on_host=self._on_host)
        spec = WorkerSpec(
            job_id=job_id,
            attempt=attempt,
            rank=rank,
            node_id=self.node_id,
            command=job.spec.command,
            env=env,
            image=job.spec.image,
            mounts=job.spec.mounts + (() if self._on_host else self.stager.mounts(job)),
            gpus=placement.gpus,
            workdir=workdir,
            log_dir=str(self.config.data_dir / "logs"),
            checkpoint_dir=str(ckpt),
            restarts=restarts,
            world_size=job.world_size,
            shm_size_mb=job.spec.shm_size_mb,
            stdin=stdin_mode(job, rank, self._on_host),
        )
        # Logged before the runtime starts it: a slow start (an image pull, a loaded node) shows as the
        # time from this line to `worker_started`, apart from any backoff before it.
        log.info("worker_starting", job_id=job_id, attempt=attempt, rank=rank, restarts=restarts)
        try:
            handle = await self.runtime.start(spec)
        except Exception as e:  # a worker that cannot start is a crash to report, not ours
            log.warning("worker_start_failed", job_id=job_id, rank=rank, error=str(e))
            # Until this report is folded the state still says the rank runs (as in `_watch`).
            self._failed_starts[key] = await self._report_exit(
                key, restarts, ExitInfo(127, None, "crashed", str(e)), "crashed", will_restart=False
            )
            return
        tr = self._track(handle, job, restarts, spec)
        # The attempt's checkpoint dir outlives a rank restart: what is there already was
        # reported by the generation before, not a new one to report.
        if (found := newest_manifest(ckpt, attempt=attempt)) is not None:
            tr.checkpoint_step = found.step
        if rank_intent(self.follower.state, key) is None:
            # The attempt ended while the runtime started it (a JobFailed, restart or requeue
            # folded meanwhile): the log will not say a worker of an attempt that is over
            # started. It stops with the other unwanted ones; its GPUs stay held until then.
            tr.told = False
            log.warning("worker_start_superseded", job_id=job_id, attempt=attempt, rank=rank)
            self._stop_unwanted()
            tr.waiter = self._spawn(self._watch(key, tr))  # type: ignore[assignment]
            return
        await self._report_started(key, restarts, handle.worker_id, placement.gpus)
        log.info("worker_started", job_id=job_id, attempt=attempt, rank=rank, gpus=placement.gpus)
        tr.waiter = self._spawn(self._watch(key, tr))  # type: ignore[assignment]

    async def _report_started(self, key: WorkerKey, restarts: int, worker_id: str, gpus: tuple[int, ...] = ()) -> int:
        job_id, attempt, rank = key
        return await self._append(
            WorkerStarted(
                event_id=f"started:{job_id}:{attempt}:{rank}:{restarts}",
                occurred_at=time.time(),
                job_id=job_id,
                attempt=attempt,
                rank=rank,
                node_id=self.node_id,
                worker_id=worker_id,
                restarts=restarts,
                gpus=gpus,
            )
        )

    async def _watch(self, key: WorkerKey, tr: Tracked) -> None:
        info = await self.runtime.wait(tr.handle)
        if tr.stopper is not None:
            with contextlib.suppress(Exception):
                await tr.stopper
        if not tr.told:  # its start never reached the log, so neither does its end
            self._release_gpus(tr)
            try:
                await self.runtime.remove(tr.handle)
            finally:
                self.workers.pop(key, None)
            return
        failed, lost = "", -1
        if tr.ending == "preempted" or (tr.ending == SHUTDOWN and tr.checkpoints):
            await self._report_checkpoint(key, tr)  # the worker may have written it just before exiting
            job = self.follower.state.work.get(key[0])
            base = tr.checkpoint_step if tr.checkpoint_step >= 0 else step_of(job.resume_from if job else None)
            failed, lost = checkpoint_failure(saved_since_signal=tr.checkpoint_step > tr.step_at_signal,
                                              exit_code=info.exit_code, signal=info.signal, log_tail=info.log_tail,
                                              base_step=base or 0)
            if failed:
                log.warning("checkpoint_failed", job_id=key[0], attempt=key[1], rank=key[2], why=failed,
                            steps_lost=lost)
        if info.reason == "crashed" and self.health is not None and tr.spec.gpus:
            # A GPU fault kills its workers too: told first, the gang is requeued (restarts unspent), not restarted.
            await self._health_poll(self.health, 0)
        reason = tr.ending or info.reason
        state = self.follower.state
        restart = restarts_rank(ending=tr.ending, exit_reason=info.reason, restart_policy=tr.restart_policy,
                                restarts=tr.spec.restarts, max_restarts=tr.max_restarts,
                                intent=rank_intent(state, key),
                                faulty_gpu=on_faulty_gpu(state.node, tr.spec.gpus))
        if restart:
            self._restarting.add(key)
        try:
            seq = await self._report_exit(key, tr.spec.restarts, info, reason, will_restart=restart,
                                          checkpoint_error=failed, steps_lost=lost)
            # Its end is in the log now: a worker of another job may start on its GPUs (the log never shows
            # two live workers on one GPU), without waiting for the removal and our report's fold.
            self._release_gpus(tr)
            await self.runtime.remove(tr.handle)
            # Keep it tracked until our own report is folded: until then the state still says the
            # rank runs, and reconcile would start the same worker again (a second run of the
            # attempt, invisible in the log because its events dedupe by id).
            await self.follower.wait_for_seq(seq)
        finally:
            self.workers.pop(key, None)
            # Its GPUs are free here now: a rank deferred on them (`_blocked`) starts at once, not a tick later.
            self.follower.changed.set()
        if restart:
            self._spawn(self._restart_later(key, tr.spec.restarts + 1))

    def _release_gpus(self, tr: Tracked) -> None:
        """The worker ended and the log says so: its GPUs stop blocking starts (start_rules.py: `held_gpus`); wake reconcile."""
        tr.exited = True
        self.follower.changed.set()

    async def _restart_later(self, key: WorkerKey, restarts: int) -> None:
        try:
            await asyncio.sleep(self.config.backoff.delay_for(restarts))
            if rank_intent(self.follower.state, key) == "run" and key not in self.workers and not self._stopping:
                await self._start(key, restarts)
        finally:
            self._restarting.discard(key)

    async def _report_exit(
        self, key: WorkerKey, restarts: int, info: ExitInfo, reason: str, *, will_restart: bool,
        checkpoint_error: str = "", steps_lost: int = -1,
    ) -> int:
        job_id, attempt, rank = key
        log.info(
            "worker_exited",
            job_id=job_id,
            attempt=attempt,
            rank=rank,
            reason=reason,
            exit_code=info.exit_code,
            signal=info.signal,
            will_restart=will_restart,
        )
        return await self._append(
            WorkerExited(
                event_id=f"exited:{job_id}:{attempt}:{rank}:{restarts}",
                occurred_at=time.time(),
                job_id=job_id,
                attempt=attempt,
                rank=rank,
                node_id=self.node_id,
                exit_code=info.exit_code,
                signal=info.signal,
                reason=reason,
                log_tail=info.log_tail[-4000:],
                restarts=restarts,
                will_restart=will_restart,
                checkpoint_error=checkpoint_error,
                steps_lost=steps_lost,
            )
        )

    # --- GPU health -------------------------------------------------------------------

    async def _health_loop(self, watch: GpuHealthWatch) -> None:
        """Poll NVML (in a thread: its calls block) and put what it finds in the log."""
        await asyncio.to_thread(watch.start)
        if watch.unsupported:
            log.info("gpu_health_unsupported", node_id=self.node_id, queries=sorted(watch.unsupported))
        try:
            wait_ms = max(0, int(self.config.health_poll_s * 1000))
            while True:
                stop_if_cancelled()
                await self._health_poll(watch, wait_ms)
                if wait_ms == 0:
                    await asyncio.sleep(self.config.health_poll_s)
        finally:
            watch.close()

    async def _health_poll(self, watch: GpuHealthWatch, wait_ms: int) -> None:
        async with self._health_lock:
            me = self.follower.state.node
            faulted = me.unhealthy_gpus if me is not None else frozenset()
            for index in self._faulted - faulted:  # undrained (an operator, a reset): watch it afresh
                watch.clear(index)
            self._faulted = faulted
            findings = await asyncio.to_thread(watch.poll, wait_ms)
            for f in findings:
                await self._report_health(f)

    async def _report_health(self, f: Finding) -> None:
        state = self.follower.state
        me = state.node
        fault = next((x for x in me.gpu_faults if x.index == f.index), None) if me is not None else None
        self._health_n += 1
        n = f"{self.incarnation}:{self._health_n}"
        if f.healthy:
            # Only a fault this watch can see end (lost, a pending remap): an Xid or a drain stays until undrained.
            if fault is not None and fault.source == "agent" and fault.xid is None:
                log.info("gpu_healthy", node_id=self.node_id, gpu=f.index, reason=f.reason)
                seq = await self._append(GpuHealthy(event_id=f"gpu-healthy:{self.node_id}:{f.index}:{n}",
                                                    occurred_at=time.time(), node_id=self.node_id,
                                                    gpu_index=f.index, gpu_uuid=f.uuid, reason=f.reason))
                await self.follower.wait_for_seq(seq)
            return
        if f.severity == GPU_FATAL and fault is not None:
            log.info("gpu_fault_again", node_id=self.node_id, gpu=f.index, reason=f.reason)
            return  # already out of service
        job = next((j.job_id for j in state.work.values() for p in j.ranks if f.index in p.gpus), "")
        (log.error if f.severity == GPU_FATAL else log.warning)(
            "gpu_unhealthy", node_id=self.node_id, gpu=f.index, uuid=f.uuid, reason=f.reason, severity=f.severity,
            job_id=job or None)
        seq = await self._append(GpuUnhealthy(
            event_id=f"gpu-unhealthy:{self.node_id}:{f.index}:{n}", occurred_at=time.time(), node_id=self.node_id,
            gpu_index=f.index, gpu_uuid=f.uuid, reason=f.reason, xid=f.xid, counter=f.counter, value=f.value,
            severity=f.severity, running_job=job))
        if f.severity == GPU_FATAL:
            await self.follower.wait_for_seq(seq)  # the next poll sees it in the fold: never told twice

    async def _health_check_loop(self, command: str) -> None:
        """Run the operator's check every interval; tell the log when its verdict differs from the log's."""
        n = 0
        while True:
            stop_if_cancelled()
            ok, code, output = await run_health_check(command, self.config.health_check_timeout_s)
            me = self.follower.state.node
            failing = me is not None and bool(me.health_check)
            if me is not None and ok == failing:
                n += 1
                (log.info if ok else log.error)("health_check", node_id=self.node_id, ok=ok, exit_code=code,
                                                output=output[-500:])
                seq = await self._append(NodeHealthChecked(
                    event_id=f"health-check:{self.node_id}:{self.incarnation}:{n}", occurred_at=time.time(),
                    node_id=self.node_id, ok=ok, exit_code=code, output="" if ok else output))
                await self.follower.wait_for_seq(seq)
            await asyncio.sleep(self.config.health_check_interval_s)

    async def shut_down(self, grace_s: float = SHUTDOWN_GRACE_S, now: asyncio.Event | None = None) -> int:
        """The graceful stop (nodeagent/shutdown.py): checkpoint or stop every worker, report each exit as
        "shutdown", start nothing more. Returns how many workers it stopped; their exits are in the log unless
        the reports ran out of time. `now` set (a second Ctrl-C): kill what still runs at once."""
        self._stopping = True
        now = now or asyncio.Event()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace_s):  # a start in flight (an image pull) ends first, or is left
                async with self._starting:
                    pass
        stopped = 0
        for key, tr in list(self.workers.items()):
            if tr.ending is not None or tr.exited or not tr.told or tr.waiter is None:
                continue  # already on its way out (and reported as such), or its start never told
            stopped += 1
            tr.ending = SHUTDOWN
            tr.signaled_at = time.monotonic()
            tr.step_at_signal = tr.checkpoint_step
            # A job that cannot checkpoint (not preemptible) gets SIGTERM instead, with the same grace.
            name = tr.signal_name if tr.checkpoints else "SIGTERM"
            log.info("checkpoint_signal" if tr.checkpoints else "stop_signal", job_id=key[0], rank=key[2],
                     signal=name, why=SHUTDOWN)
            await self.runtime.signal(tr.handle, int(getattr(signals, name, signals.SIGUSR1)))
            tr.stopper = asyncio.ensure_future(end_within(self.runtime, tr.handle, min(tr.grace_s, grace_s), now))
        waiters = [tr.waiter for tr in self.workers.values() if tr.waiter is not None]
        if not await until_done(waiters, grace_s + REPORT_S, now):
            log.warning("shutdown_unreported", node_id=self.node_id,
                        workers=[k for k, tr in self.workers.items() if tr.waiter is not None and not tr.waiter.done()])
        log.info("shutdown", node_id=self.node_id, workers=stopped)
        return stopped

    async def stop_workers(self, grace_s: float = UNWANTED_GRACE_S) -> None:
        """Stop every worker this agent runs (used when `corral up` exits without --keep-workers)."""
        for tr in list(self.workers.values()):
            with contextlib.suppress(Exception):
                await stop_with_grace(self.runtime, tr.handle, min(grace_s, tr.grace_s))


#: Most characters of a health check's output the log keeps (its tail).
HEALTH_OUTPUT_CHARS = 2000


async def run_health_check(command: str, timeout_s: float) -> tuple[bool, int | None, str]:
    """(passed, exit code, output) of `sh -c command`; a check that hangs past `timeout_s` fails."""
    proc = await asyncio.create_subprocess_shell(command, stdout=asyncio.subprocess.PIPE,
                                                 stderr=asyncio.subprocess.STDOUT, start_new_session=True)
    try:
        async with asyncio.timeout(timeout_s):
            out, _ = await proc.communicate()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signals.SIGKILL)
        await proc.wait()
        return False, None, f"health check timed out after {timeout_s:g}s"
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signals.SIGKILL)
        raise
    text = out.decode(errors="replace").strip()[-HEALTH_OUTPUT_CHARS:]
    return proc.returncode == 0, proc.returncode, text
