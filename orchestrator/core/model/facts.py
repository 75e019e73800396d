"""What the cluster could ever offer: every registered GPU free, failed and cordoned nodes included.

Admission rules ask it whether a spec can *ever* fit; a job that fits here but
not now waits, one that does not fit here is rejected with the numbers.
"""

from __future__ import annotations

from collections.abc import Hashable

from orchestrator.core.model.capacity import FreeIndex
from orchestrator.core.model.eligibility import ANY_GPU, GpuClass, eligible_gpus
from orchestrator.core.model.memo import Memo
from orchestrator.core.model.state import ClusterState
from orchestrator.core.model.topology import Topology
from orchestrator.core.model.usage import first_over_limit, resolve_queue

#: Capacity is judged only once no node has joined for this long: a job submitted while the
#: cluster is still registering (every `corral up`, every scheduler restart of a fresh
#: cluster) must not be rejected for lack of nodes that are about to arrive.
SETTLE_S = 30.0


class ClusterFacts:
    __slots__ = ("_empty", "_recent", "now", "state", "topo", "unfit")

    def __init__(self, state: ClusterState, topo: Topology, now: float, memo: Memo) -> None:
        self.state = state
        self.topo = topo
        self.now = now
        self._empty: dict[GpuClass, FreeIndex] = {}
        #: Empty-cluster indexes of recent calls (`Memo.empty_indexes`): a Topology is reused only
        #: while no node record changed (`build_topology`), and these indexes read only the nodes'
        #: inventories, so the same Topology object means the same answer; rules only read them.
        self._recent = memo.empty_indexes
        #: Why a spec shape can never run here, by the shape the admission rules read (a backlog has
        #: few shapes; `policies/reject.py`). Not "memo": that is the caller-owned `Memo` of decide.
        self.unfit: dict[Hashable, tuple[str, ...]] = {}

    @property
    def settled_at(self) -> float | None:
        """When "can never fit" becomes a fair verdict: SETTLE_S after the newest node joined."""
        return self.state.newest_node_at + SETTLE_S if self.state.nodes else None

    @property
    def capacity_settled(self) -> bool:
        at = self.settled_at
        return at is not None and at <= self.now

    def models(self) -> list[str]:
        seen: dict[str, None] = {}
        for node in self.state.nodes.values():
            for g in node.inventory.gpus:
                seen[f"{g.model} ({g.memory_mib} MiB)"] = None
        return list(seen)

    def empty_index(self, cls: GpuClass) -> FreeIndex:
        """Every GPU of class `cls` free, on every registered node."""
        idx = self._empty.get(cls)
        if idx is None:
            for topo, cached_cls, cached in self._recent:
                if topo is self.topo and cached_cls == cls:
                    idx = self._empty[cls] = cached
                    return idx
            free: dict[str, tuple[int, ...]] = {}
            eligible: dict[str, frozenset[int]] | None = None if cls == ANY_GPU else {}
            for nid, node in self.state.nodes.items():
                gpus = node.inventory.gpus
                if eligible is None:
                    free[nid] = tuple(range(len(gpus)))
                else:
                    e = eligible_gpus(gpus, cls)
                    if e:
                        eligible[nid] = e
                        free[nid] = tuple(sorted(e))
            idx = self._empty[cls] = FreeIndex(self.topo, cls, free, eligible)
            self._recent.insert(0, (self.topo, cls, idx))
            del self._recent[8:]
        return idx

    def queue_of(self, name: str) -> str | None:
        """The queue a job asking for `name` runs in; None when queues exist but neither it nor the default does."""
        q = resolve_queue(self.state, name)
        if q in self.state.queues or not self.state.queues:
            return q
        return None

    def queue_names(self) -> list[str]:
        return list(self.state.queues)

    def limit_of(self, queue: str, gpus: int) -> tuple[str, int] | None:
        """(queue, limit) of the first queue in the chain whose limit is below `gpus` even when idle."""
        over = first_over_limit(self.state.queues, lambda _name: 0, queue, gpus)
        return None if over is None else (over[0], over[1])
