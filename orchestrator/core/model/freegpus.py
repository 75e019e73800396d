"""The free GPUs of a folded state and their capacity indexes, carried from one decide call to the next.

Building them from scratch is O(nodes) per decide call -- on 352 nodes that
was most of a cycle -- yet between two calls only the nodes of a few gangs
change. So the newest answer is kept (`Memo.free`), and the next call redoes only the nodes
whose owner or earmark tuple is a different object: the fold replaces a node's
tuple whenever it changes it, never mutates one, so an identical object means
an identical value (the kept copy holds a reference, so it is never a
recycled address). A node record change (registered, failed, cordoned) builds
a new Topology (`build_topology`) and starts over.

A kept answer is never modified: an update makes new dicts and index copies,
so a plan still reading an older answer, or a second caller, is unaffected.
The answer depends only on the state's values -- this is a memo, decide stays
a pure function of (state, now).
"""

from __future__ import annotations

from itertools import compress
from operator import is_not

from orchestrator.core.model.capacity import FreeIndex
from orchestrator.core.model.eligibility import ANY_GPU, GpuClass, eligible_gpus
from orchestrator.core.model.memo import Memo
from orchestrator.core.model.state import FREE, ClusterState
from orchestrator.core.model.topology import Topology


def unclaimed(
    owners: tuple[str, ...], marks: tuple[str, ...] | None, sick: frozenset[int] = frozenset()
) -> tuple[int, ...]:
    """GPU indices neither owned, earmarked nor unhealthy (`sick`: Node.unhealthy_gpus; only changed nodes
    are asked again: FreeGpus.updated, and a health change is a node record change, so a new Topology)."""
    if marks is None:
        free = tuple(i for i, o in enumerate(owners) if o == FREE)
    else:
        free = tuple(i for i, o in enumerate(owners) if o == FREE and marks[i] == FREE)
    return tuple(i for i in free if i not in sick) if sick else free


class FreeGpus:
    """Schedulable node -> unclaimed GPUs, and per GPU class the capacity index over them. Read-only."""

    __slots__ = ("_eligible", "_indexes", "free", "marks", "owners", "state_nodes", "topo")

    def __init__(self, state: ClusterState, topo: Topology) -> None:
        self.topo = topo
        self.owners = dict(state.owners)
        self.marks = dict(state.earmarks)
        self.state_nodes = dict(state.nodes)
        earmarks, owners = state.earmarks, state.owners
        self.free: dict[str, tuple[int, ...]] = {
            nid: unclaimed(owners[nid], earmarks.get(nid), node.unhealthy_gpus if node.gpu_faults else frozenset())
            for nid, node in state.nodes.items()
            if node.schedulable
        }
        self._indexes: dict[GpuClass, FreeIndex] = {}
        self._eligible: dict[GpuClass, dict[str, frozenset[int]] | None] = {}

    def eligible(self, cls: GpuClass) -> dict[str, frozenset[int]] | None:
        """Node -> GPUs of class `cls` (None: every GPU of every node qualifies)."""
        if cls == ANY_GPU:
            return None
        found = self._eligible.get(cls)
        if found is None:
            found = {}
            for nid in self.free:
                e = eligible_gpus(self.state_nodes[nid].inventory.gpus, cls)
                if e:
                    found[nid] = e
            self._eligible[cls] = found
        return found

    def index(self, cls: GpuClass) -> FreeIndex:
        """The capacity index of class `cls` (shared: copy it before changing it)."""
        idx = self._indexes.get(cls)
        if idx is None:
            eligible = self.eligible(cls)
            if eligible is None:
                free = dict(self.free)
            else:
                free = {n: tuple(g for g in self.free[n] if g in e) for n, e in eligible.items()}
            idx = self._indexes[cls] = FreeIndex(self.topo, cls, free, eligible)
        return idx

    def updated(self, state: ClusterState) -> FreeGpus:
        """The answer for `state`, which has the same node records as the one this answers for."""
        owners, marks = state.owners, state.earmarks
        if owners == self.owners and marks == self.marks:
            return self
        old_owners, old_marks = self.owners, self.marks
        if len(owners) == len(old_owners):  # same nodes, same order (a new node means a new Topology)
            changed = list(compress(owners, map(is_not, owners.values(), old_owners.values())))
        else:
            changed = list(owners)
        for n in {*old_marks, *marks}:
            if old_marks.get(n) is not marks.get(n):
                changed.append(n)
        new = FreeGpus.__new__(FreeGpus)
        new.topo = self.topo
        new.state_nodes = self.state_nodes
        new.owners = dict(owners)
        new.marks = dict(marks)
        new._eligible = self._eligible
        new.free = free = dict(self.free)
        moved: list[tuple[str, tuple[int, ...]]] = []
        for n in changed:
            cur = free.get(n)
            if cur is None:
                continue  # not schedulable
            node = self.state_nodes[n]
            f = unclaimed(owners[n], marks.get(n), node.unhealthy_gpus if node.gpu_faults else frozenset())
            if f != cur:
                free[n] = f
                moved.append((n, f))
        new._indexes = {}
        for cls, idx in self._indexes.items():
            if moved:
                idx = idx.copy()
                for n, f in moved:
                    idx.reset(n, f)
            new._indexes[cls] = idx
        return new


def free_gpus(state: ClusterState, topo: Topology, memo: Memo) -> FreeGpus:
    """Free GPUs of `state`, whose topology (from its node records) is `topo`."""
    last = memo.free
    if last is not None and last.topo is topo and memo.free_for is not None:
        seen, rev = memo.free_for
        if seen is state and rev == state.alloc_rev:
            return last
    found = last.updated(state) if last is not None and last.topo is topo else FreeGpus(state, topo)
    memo.free = found
    memo.free_for = (state, state.alloc_rev)
    return found
