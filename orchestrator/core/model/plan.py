"""The tentative plan of one decide call: what is free, what each queue holds, what was decided.

`decide` never touches the ClusterState; it builds a Plan from it, lets each
stage extend the plan (a placement takes GPUs, a preemption earmarks them, a
backfill reservation holds them), and drops it when the call returns. Trying a
scenario (victim search, backfill estimate) works on a copy of an index, so
dropping the copy is the rollback -- no undo log.
"""

from __future__ import annotations

from typing import NamedTuple
from zlib import crc32

from orchestrator.core.model.capacity import FreeIndex
from orchestrator.core.model.eligibility import GpuClass
from orchestrator.core.model.freegpus import FreeGpus, free_gpus
from orchestrator.core.model.memo import Memo
from orchestrator.core.model.running import preemptions_in_flight, running_gangs
from orchestrator.core.model.state import FREE, ClusterState, Job
from orchestrator.core.model.topology import Topology
from orchestrator.core.model.usage import ancestors, average_gpus, first_over_limit, resolve_queue
from schemas.events import RankPlacement

#: MASTER_PORT range for rank 0's rendezvous: 29500 + [0, PORT_SPAN).
PORT_BASE = 29500
PORT_SPAN = 2000


class QueueLoad(NamedTuple):
    """A queue as fair share and quotas see it at this point of the plan."""

    name: str
    weight: float
    guaranteed: int
    limit: int | None
    #: GPUs held now, plus those placed or claimed by preemption this cycle.
    gpus: int
    #: Fair-share usage: decayed average GPUs (== held GPUs without a half-life), plus this cycle's.
    usage: float
    #: Hierarchy: each ancestor's share (its subtree's usage / its weight), the root first; empty
    #: for a top-level queue. Children split their parent's share by weight.
    ancestor_shares: tuple[float, ...] = ()
    #: GPUs the queue's next job asks for (0: not told).
    asks: int = 0


class Hold(NamedTuple):
    """A backfill reservation: GPUs kept for the blocked head gang `job_id`."""

    job_id: str
    #: When the gang is expected to start (math.inf: some GPUs have no end estimate).
    until: float
    ranks: tuple[RankPlacement, ...]


class Plan:
    __slots__ = (
        "_base",
        "_cpu_gangs",
        "_indexes",
        "_memo",
        "_ports",
        "_subtrees",
        "_touched",
        "added",
        "busy",
        "charges",
        "ended",
        "free",
        "gpus",
        "holds",
        "now",
        "state",
        "topo",
        "tree",
        "version",
        "victims",
    )

    def __init__(self, state: ClusterState, now: float, topo: Topology, memo: Memo) -> None:
        self.state = state
        self.now = now
        self.topo = topo
        #: The cycle's memo (running gangs, for ports); outlives the plan.
        self._memo = memo
        #: What the folded state leaves free (kept between decide calls in `memo`, see freegpus.py).
        self._base: FreeGpus = free_gpus(state, topo, memo)
        #: Schedulable node -> GPUs neither owned nor earmarked, nor taken in this plan.
        self.free: dict[str, tuple[int, ...]] = dict(self._base.free)
        #: Nodes whose free GPUs this plan changed (an index built later starts from the base).
        self._touched: set[str] = set()
        self._indexes: dict[tuple[GpuClass, bool], FreeIndex] = {}
        #: Backfill reservations of this cycle, in the order they were made.
        self.holds: list[Hold] = []
        #: Per queue, tentative: GPUs it holds (for guarantees), GPUs its subtree holds
        #: (for limits), GPUs it gained since the fold plus those its reservations hold
        #: (for the fair-share order).
        self.gpus: dict[str, int] = {q: u.gpus for q, u in state.usage.items()}
        self.tree: dict[str, int] = {q: u.tree_gpus for q, u in state.usage.items()}
        self.added: dict[str, int] = {}
        #: Bumped by every charge: a queue's load (and so its fair-share rank) is unchanged without one.
        self.charges = 0
        self._count_preemptions()
        #: Jobs already decided on this cycle (placed, victims, rejected, follow-ups): not again.
        self.busy: set[str] = set()
        #: Gangs whose GPUs a follow-up releases, and gangs asked to give theirs to a preemptor.
        self.ended: set[str] = set()
        self.victims: set[str] = set()
        #: Bumped whenever free GPUs are taken: memoised answers about the plan expire.
        self.version = 0
        self._ports: dict[str, set[int]] | None = None
        #: (charges, queue -> its subtree's fair-share usage): only when some queue has a parent.
        self._subtrees: tuple[int, dict[str, float]] | None = None
        self._cpu_gangs: list[str] | None = None

    # --- free GPUs ---------------------------------------------------------------

    def eligible(self, cls: GpuClass) -> dict[str, frozenset[int]] | None:
        """Node -> GPUs of class `cls` (None: every GPU of every node qualifies)."""
        return self._base.eligible(cls)

    def index(self, cls: GpuClass, *, through_hold: bool = False) -> FreeIndex:
        """Free GPUs of `cls`; without `through_hold`, minus those held by backfill reservations."""
        through = through_hold and bool(self.holds)
        idx = self._indexes.get((cls, through))
        if idx is None:
            idx = self._base.index(cls).copy()
            for n in self._touched:
                idx.reset(n, self.free[n])
            if not through:
                for hold in self.holds:
                    for rp in hold.ranks:
                        idx.take(rp.node_id, rp.gpus)
            self._indexes[(cls, through)] = idx
        return idx

    def take(self, ranks: tuple[RankPlacement, ...]) -> None:
        """GPUs now spoken for in this plan (placed, earmarked or held)."""
        self.version += 1
        for rp in ranks:
            cur = self.free.get(rp.node_id)
            if cur is None or not rp.gpus:
                continue
            self.free[rp.node_id] = tuple(g for g in cur if g not in rp.gpus)
            self._touched.add(rp.node_id)
            for idx in self._indexes.values():
                idx.take(rp.node_id, rp.gpus)

    def release(self, job: Job) -> None:
        """A follow-up ends `job`'s gang: its GPUs (not earmarked for others) are free for this cycle."""
        marks_of = self.state.earmarks
        for rp in job.placement:
            cur = self.free.get(rp.node_id)
            if cur is None or not rp.gpus:
                continue
            owners = self.state.owners[rp.node_id]
            marks = marks_of.get(rp.node_id)
            node = self.state.nodes.get(rp.node_id)
            sick = node.unhealthy_gpus if node is not None and node.gpu_faults else frozenset()
            back = [
                g for g in rp.gpus if g < len(owners) and owners[g] == job.job_id and (marks is None or marks[g] == FREE)
                and g not in sick  # an unhealthy GPU its gang gives back stays out of service
            ]
            if back:
                self.free[rp.node_id] = tuple(sorted({*cur, *back}))
                self._touched.add(rp.node_id)
                for idx in self._indexes.values():
                    idx.give(rp.node_id, back)
        if job.status == "preempting":  # its own share was already moved to its preemptor
            for a in ancestors(self.state.queues, job.queue):
                self.tree[a] = self.tree.get(a, 0) - job.gpus
        else:
            self.charge(job.queue, -job.gpus)
        self.ended.add(job.job_id)

    def add_hold(self, hold: Hold) -> None:
        """Hold GPUs for a blocked gang: hidden from the plain indexes, kept in the through-hold ones."""
        self.holds.append(hold)
        self.version += 1
        for (cls, through), idx in list(self._indexes.items()):
            if not through:
                if len(self.holds) == 1:  # until now the plain index was the through-hold one too
                    self._indexes[(cls, True)] = idx.copy()
                for rp in hold.ranks:
                    idx.take(rp.node_id, rp.gpus)

    def held_gpus(self) -> dict[str, set[int]]:
        """Node -> GPUs some reservation of this cycle plans to start on (free now or not)."""
        held: dict[str, set[int]] = {}
        for hold in self.holds:
            for rp in hold.ranks:
                held.setdefault(rp.node_id, set()).update(rp.gpus)
        return held

    def earmark_view(self, job: Job, cls: GpuClass) -> FreeIndex:
        """What a preemptor may use: the free GPUs plus those earmarked for it that are free now."""
        view = self.index(cls).copy()
        for rp in job.earmark:
            node = self.state.nodes.get(rp.node_id)
            if node is None or not node.schedulable:
                continue
            owners = self.state.owners[rp.node_id]
            sick = node.unhealthy_gpus
            view.give(rp.node_id, [g for g in rp.gpus if g < len(owners) and owners[g] == FREE and g not in sick])
        return view

    # --- queues ------------------------------------------------------------------

    def _count_preemptions(self) -> None:
        """Preemptions in flight move GPUs between queues before the fold does.

        A preempting victim's GPUs no longer count for its queue's guarantee, and a
        waiting preemptor's claim counts for its queue (guarantee, share and limit),
        so the next cycle neither reclaims the same guarantee twice nor takes a
        victim queue below its guarantee twice. Limits keep counting the victims
        until they are gone: the fold checks limits against what is held.
        """
        victims, preemptors = preemptions_in_flight(self.state)
        for j in victims:
            self.charge(j.queue, -j.gpus, tree=False)
        for p in preemptors:
            self.charge(resolve_queue(self.state, p.spec.queue), p.spec.total_gpus)

    def charge(self, queue: str, delta: int, *, tree: bool = True) -> None:
        self.charges += 1
        self.gpus[queue] = self.gpus.get(queue, 0) + delta
        self.added[queue] = self.added.get(queue, 0) + delta
        if tree:
            for a in ancestors(self.state.queues, queue):
                self.tree[a] = self.tree.get(a, 0) + delta

    def charge_share(self, queue: str, gpus: int) -> None:
        """Count `gpus` in `queue`'s fair-share usage for the rest of this cycle only (a reservation it holds).

        Neither its guarantee nor its limits see them: the GPUs are not taken yet.
        """
        self.charges += 1
        self.added[queue] = self.added.get(queue, 0) + gpus

    def _usage(self, queue: str) -> float:
        u = self.state.usage.get(queue)
        base = average_gpus(u, self.now, self.state.config.fairshare_half_life_s) if u is not None else 0.0
        return base + self.added.get(queue, 0)

    def _ancestor_shares(self, queue: str) -> tuple[float, ...]:
        """Each ancestor's subtree usage per weight, root first (hierarchical fair share, as a fair tree)."""
        queues = self.state.queues
        q = queues.get(queue)
        if q is None or q.parent is None:
            return ()
        if self._subtrees is None or self._subtrees[0] != self.charges:
            totals: dict[str, float] = {}
            for name in dict.fromkeys([*self.state.usage, *self.added]):
                used = self._usage(name)
                for a in ancestors(queues, name):
                    totals[a] = totals.get(a, 0.0) + used
            self._subtrees = (self.charges, totals)
        totals = self._subtrees[1]
        chain = ancestors(queues, queue)[1:]
        return tuple(
            totals.get(a, 0.0) / max(p.weight if (p := queues.get(a)) is not None else 1.0, 1e-9) for a in reversed(chain)
        )

    def load(self, queue: str) -> QueueLoad:
        q = self.state.queues.get(queue)
        return QueueLoad(
            name=queue,
            weight=q.weight if q is not None else 1.0,
            guaranteed=q.guaranteed_gpus if q is not None else 0,
            limit=q.limit_gpus if q is not None else None,
            gpus=self.gpus.get(queue, 0),
            usage=self._usage(queue),
            ancestor_shares=self._ancestor_shares(queue),
        )

    def owed(self, queue: str, extra: int) -> bool:
        """Whether `queue` would still hold no more than its guarantee with `extra` GPUs more: such a gang
        is owed its GPUs, and may reclaim them from borrowers (policies/victims.py)."""
        q = self.state.queues.get(queue)
        return self.gpus.get(queue, 0) + extra <= (q.guaranteed_gpus if q is not None else 0)

    def limit_blocker(self, queue: str, extra: int, freed: dict[str, int] | None = None) -> tuple[str, int, int] | None:
        """(queue, its limit, GPUs it holds) of the first queue in the chain that `extra` GPUs would overflow.

        `freed` lists GPUs given back per queue (victims), counted for the queue and its ancestors.
        """
        held = self.tree
        if freed:
            held = dict(held)
            for victim_queue, n in freed.items():
                for a in ancestors(self.state.queues, victim_queue):
                    held[a] = held.get(a, 0) - n
        return first_over_limit(self.state.queues, lambda name: held.get(name, 0), queue, extra)

    # --- ports ------------------------------------------------------------------

    def master_port(self, job_id: str, attempt: int, node: str) -> int:
        """A deterministic rendezvous port for rank 0, unused by other gangs whose rank 0 is on `node`."""
        if self._ports is None:
            self._ports = {}
        taken = self._ports.get(node)
        if taken is None:
            taken = self._ports[node] = self._ports_on(node)
        start = crc32(f"{job_id}:{attempt}".encode()) % PORT_SPAN
        for i in range(PORT_SPAN):
            port = PORT_BASE + (start + i) % PORT_SPAN
            if port not in taken:
                taken.add(port)
                return port
        return PORT_BASE + start

    def _ports_on(self, node: str) -> set[int]:
        """Ports of gangs whose rank 0 is on `node`: GPU gangs found through the node's owners."""
        state = self.state
        if self._cpu_gangs is None:
            self._cpu_gangs = sorted(running_gangs(state, self._memo).cpu_only)
        ports: set[int] = set()
        for jid in {*state.owners.get(node, ()), *self._cpu_gangs}:
            j = state.jobs.get(jid)
            if j is not None and j.placement and j.placement[0].node_id == node and jid in state.active:
                ports.add(j.master_port)
        return ports
