"""A small cluster simulator for core tests: builds events, folds them, runs decide, plays the agents.

Everything is deterministic: event ids count up, time moves only when a test
says so. `decide()` folds the decisions it returns one by one and fails the
test if the fold voids any of them (decide must never emit a void decision).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from orchestrator.core.decide import decide
from orchestrator.core.evolve import evolve
from orchestrator.core.model.memo import Memo
from orchestrator.core.model.state import ClusterState, Job
from orchestrator.core.orders import node_orders
from orchestrator.policies import DEFAULT_POLICIES, Policies
from schemas.events import (
    AnyEvent,
    CancelRequested,
    Checkpointed,
    ClusterConfigured,
    Event,
    GangReserved,
    JobSubmitted,
    NodeCordoned,
    NodeFailed,
    NodeRecovered,
    NodeRegistered,
    PreemptionRequested,
    QueueDefined,
    SchedulerElected,
    WorkerExited,
    WorkerStarted,
)
from schemas.inventory import Gpu, Inventory
from schemas.jobspec import JobSpec, Topology

# The DGX-1 hybrid cube mesh, from shared/fixtures/topology/
# topo_dgx1_v100_8gpu_hybrid_cube_mesh_1nic.txt scored with schemas.inventory.link_score:
# NV1 -> 101, NV2 -> 102, SYS -> 1 (diagonal 0).
DGX1_LINKS: tuple[tuple[int, ...], ...] = (
    (0, 101, 101, 102, 102, 1, 1, 1),
    (101, 0, 102, 101, 1, 102, 1, 1),
    (101, 102, 0, 102, 1, 1, 101, 1),
    (102, 101, 102, 0, 1, 1, 1, 101),
    (102, 1, 1, 1, 0, 101, 101, 102),
    (1, 102, 1, 1, 101, 0, 102, 101),
    (1, 1, 101, 1, 101, 102, 0, 102),
    (1, 1, 1, 101, 102, 101, 102, 0),
)


def inventory(gpus: int = 8, model: str = "H100", memory_mib: int = 81920, labels: dict[str, str] | None = None,
              links: tuple[tuple[int, ...], ...] = ()) -> Inventory:
    return Inventory(
        gpus=tuple(Gpu(index=i, uuid=f"GPU-{i}", model=model, memory_mib=memory_mib) for i in range(gpus)),
        links=links,
        labels=labels or {},
    )


class Sim:
    def __init__(self, *, levels: tuple[str, ...] = (), half_life_s: float = 0.0, min_runtime_s: float = 0.0,
                 now: float = 1000.0, policies: Policies = DEFAULT_POLICIES) -> None:
        self.state = ClusterState()
        self.log: list[AnyEvent] = []
        self.now = now
        self.epoch = 1
        self.policies = policies
        #: What decide keeps between this test's calls (core/model/memo.py).
        self.memo = Memo()
        self._n = 0
        self.emit(ClusterConfigured(event_id=self.eid(), occurred_at=now, topology_levels=levels,
                                    fairshare_half_life_s=half_life_s, min_runtime_s=min_runtime_s))
        self.emit(SchedulerElected(event_id=self.eid(), occurred_at=now, epoch=1, scheduler_id="s1"))

    # --- plumbing ---------------------------------------------------------------

    def eid(self) -> str:
        self._n += 1
        return f"t{self._n}"

    def emit(self, event: AnyEvent) -> None:
        self.log.append(event)
        evolve(self.state, event)

    def emit_all(self, events: Iterable[AnyEvent]) -> None:
        for e in events:
            self.emit(e)

    def job(self, job_id: str) -> Job:
        return self.state.jobs[job_id]

    def tick(self, seconds: float) -> None:
        self.now += seconds

    def decide(self) -> list[Event]:
        """Run decide and fold its events, then the orders they imply for the nodes (as the scheduler's next
        cycle appends them: core/orders.py); no decision may be void. Returns decide's events."""
        events = decide(self.state, self.now, epoch=self.epoch, policies=self.policies, memo=self.memo)
        for e in events:
            before = self.state.voids
            self.emit(e)  # type: ignore[arg-type]
            assert self.state.voids == before, f"decide emitted a void decision: {self.state.last_void}"
        self.orders()
        return events

    def orders(self) -> list[Event]:
        """The orders every node lacks, folded (all of them: no cap)."""
        out = node_orders(self.state, now=self.now, epoch=self.epoch, cap=1_000_000)
        for e in out:
            before = self.state.voids
            self.emit(e)  # type: ignore[arg-type]
            assert self.state.voids == before, f"an order was void: {self.state.last_void}"
        return out

    # --- cluster ----------------------------------------------------------------

    def node(self, node_id: str, gpus: int = 8, **kw: Any) -> None:
        self.emit(NodeRegistered(event_id=self.eid(), occurred_at=self.now, node_id=node_id, incarnation="i1",
                                 address=f"10.0.0.{len(self.state.nodes) + 1}", inventory=inventory(gpus, **kw)))

    def queue(self, name: str, **kw: Any) -> None:
        self.emit(QueueDefined(event_id=self.eid(), occurred_at=self.now, queue=name, **kw))

    def submit(self, job_id: str, *, topology: tuple[str, str] | None = None, **spec: Any) -> None:
        spec.setdefault("name", job_id)
        topo = Topology(level=topology[0], mode=topology[1]) if topology else None  # type: ignore[arg-type]
        self.emit(JobSubmitted(event_id=self.eid(), occurred_at=self.now, job_id=job_id,
                               spec=JobSpec(topology=topo, **spec)))

    def fail_node(self, node_id: str) -> None:
        self.emit(NodeFailed(event_id=self.eid(), occurred_at=self.now, node_id=node_id, incarnation="i1"))

    def recover_node(self, node_id: str) -> None:
        self.emit(NodeRecovered(event_id=self.eid(), occurred_at=self.now, node_id=node_id, incarnation="i1"))

    def cordon(self, node_id: str) -> None:
        self.emit(NodeCordoned(event_id=self.eid(), occurred_at=self.now, node_id=node_id))

    def cancel(self, job_id: str) -> None:
        self.emit(CancelRequested(event_id=self.eid(), occurred_at=self.now, job_id=job_id, reason="user asked",
                                  requested_by="alice"))

    def elect(self, epoch: int) -> None:
        self.epoch = epoch
        self.emit(SchedulerElected(event_id=self.eid(), occurred_at=self.now, epoch=epoch, scheduler_id=f"s{epoch}"))

    # --- agents -----------------------------------------------------------------

    def start(self, job_id: str) -> None:
        job = self.job(job_id)
        for rp in job.placement:
            self.emit(WorkerStarted(event_id=self.eid(), occurred_at=self.now, job_id=job_id, attempt=job.attempt,
                                    rank=rp.rank, node_id=rp.node_id))

    def exit(self, job_id: str, rank: int | None = None, *, code: int | None = 0, reason: str = "completed",
             will_restart: bool = False) -> None:
        job = self.job(job_id)
        for rp in job.placement:
            if rank is None or rp.rank == rank:
                self.emit(WorkerExited(event_id=self.eid(), occurred_at=self.now, job_id=job_id, attempt=job.attempt,
                                       rank=rp.rank, node_id=rp.node_id, exit_code=code, reason=reason,
                                       will_restart=will_restart))

    def finish(self, job_id: str) -> None:
        self.exit(job_id)

    def checkpoint(self, job_id: str, step: int, path: str, rank: int = 0) -> None:
        job = self.job(job_id)
        self.emit(Checkpointed(event_id=self.eid(), occurred_at=self.now, job_id=job_id, attempt=job.attempt,
                               rank=rank, step=step, path=path))

    def agents(self, events: Iterable[Event]) -> None:
        """Play well-behaved agents: start reserved gangs, stop gangs asked to stop."""
        for e in events:
            if isinstance(e, GangReserved):
                self.start(e.job_id)
            elif isinstance(e, PreemptionRequested):
                self.exit(e.job_id, code=None, reason="preempted")

    def run(self, cycles: int = 10) -> list[Event]:
        """decide + agents until nothing happens (or `cycles` rounds)."""
        out: list[Event] = []
        for _ in range(cycles):
            events = self.decide()
            if not events:
                break
            out.extend(events)
            self.agents(events)
        return out

    def holding(self, queue: str) -> int:
        u = self.state.usage.get(queue)
        return u.gpus if u else 0


def of_type(events: Iterable[Event], kind: type[Event]) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]
