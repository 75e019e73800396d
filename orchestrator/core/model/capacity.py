"""Free-GPU indexes: how many ranks of a shape fit in a domain, in O(GPUs per node).

A `FreeIndex` covers one GpuClass (model/memory constraint). Per node it keeps
the free eligible GPU indices; per domain a histogram "how many nodes have f
free GPUs". Then the ranks of g GPUs a domain can host is
sum_f hist[f] * (f // g) -- exact, because any g free GPUs of one node can host
a rank -- and a placement updates one histogram slot per level. Feasibility
checks in victim search and backfill are therefore cheap enough to run many
times per decide call.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable

from orchestrator.core.model.eligibility import GpuClass
from orchestrator.core.model.topology import Topology


class FreeIndex:
    __slots__ = ("buckets", "cls", "eligible", "free", "hist", "topo", "totals", "width")

    def __init__(
        self,
        topo: Topology,
        cls: GpuClass,
        free: dict[str, tuple[int, ...]],
        eligible: dict[str, frozenset[int]] | None,
    ) -> None:
        """Index `free` (node -> free eligible GPUs; only schedulable nodes that can host the class)."""
        self.topo = topo
        self.cls = cls
        #: node -> GPUs of the class on it (None: every GPU qualifies).
        self.eligible = eligible
        self.free = free
        self.width = width = topo.width + 1
        ids = topo.ids
        #: Flat: hist[d * width + f] is how many indexed nodes of domain number d (Topology.ids)
        #: have f free GPUs -- one list, so a copy is one C-level list copy.
        self.hist: list[int] = [0] * (len(ids) * width)
        #: domain number -> free GPUs in it.
        self.totals: list[int] = [0] * len(ids)
        #: free count -> (registration position, node) of the nodes with that many free GPUs,
        #: sorted: best-fit node search takes the first, whatever order the GPUs were freed in.
        self.buckets: list[list[tuple[int, str]]] = [[] for _ in range(width)]
        hist, totals = self.hist, self.totals
        order = topo.order
        for node, gpus in free.items():
            f = len(gpus)
            self.buckets[f].append((order[node], node))
            for d in topo.path_ids[node]:
                hist[d * width + f] += 1
                totals[d] += f
        for b in self.buckets:
            b.sort()

    def copy(self) -> FreeIndex:
        new = FreeIndex.__new__(FreeIndex)
        new.topo = self.topo
        new.cls = self.cls
        new.eligible = self.eligible
        new.free = dict(self.free)
        new.width = self.width
        new.hist = list(self.hist)
        new.totals = list(self.totals)
        new.buckets = [list(b) for b in self.buckets]
        return new

    def _move(self, node: str, before: int, after: int) -> None:
        if before == after:
            return
        key = (self.topo.order[node], node)
        b = self.buckets[before]
        del b[bisect_left(b, key)]
        insort(self.buckets[after], key)
        delta = after - before
        totals, hist, width = self.totals, self.hist, self.width
        for d in self.topo.path_ids[node]:
            o = d * width
            hist[o + before] -= 1
            hist[o + after] += 1
            totals[d] += delta

    def take(self, node: str, gpus: Iterable[int]) -> None:
        """Mark `gpus` of `node` as used (GPUs this index does not hold are ignored)."""
        cur = self.free.get(node)
        if cur is None:
            return
        gone = set(gpus)
        new = tuple(g for g in cur if g not in gone)
        if len(new) != len(cur):
            self.free[node] = new
            self._move(node, len(cur), len(new))

    def reset(self, node: str, gpus: tuple[int, ...]) -> None:
        """Set `node`'s free GPUs to `gpus` (the eligible ones among them; unindexed nodes are ignored)."""
        cur = self.free.get(node)
        if cur is None:
            return
        allowed = self.eligible.get(node, frozenset()) if self.eligible is not None else None
        new = gpus if allowed is None else tuple(g for g in gpus if g in allowed)
        if new != cur:
            self.free[node] = new
            self._move(node, len(cur), len(new))

    def give(self, node: str, gpus: Iterable[int]) -> None:
        """Mark `gpus` of `node` as free (only eligible GPUs of indexed nodes count)."""
        cur = self.free.get(node)
        if cur is None:
            return
        allowed = self.eligible.get(node, frozenset()) if self.eligible is not None else None
        extra = {g for g in gpus if allowed is None or g in allowed}
        new = tuple(sorted(extra.union(cur)))
        if len(new) != len(cur):
            self.free[node] = new
            self._move(node, len(cur), len(new))

    def capacity(self, domain: str, gpus_per_rank: int, need: int) -> int:
        """Ranks of `gpus_per_rank` GPUs that fit in `domain` (counting stops once `need` is reached)."""
        d = self.topo.ids.get(domain)
        if d is None:
            return 0
        width, hist = self.width, self.hist
        o = d * width
        if gpus_per_rank <= 0:  # CPU-only ranks: any indexed node hosts them all
            return need if any(hist[o : o + width]) else 0
        total = 0
        for f in range(width - 1, gpus_per_rank - 1, -1):
            c = hist[o + f]
            if c:
                total += c * (f // gpus_per_rank)
                if total >= need:
                    return total
        return total

    def free_gpus(self, domain: str) -> int:
        d = self.topo.ids.get(domain)
        return 0 if d is None else self.totals[d]

    def largest_node_free(self) -> int:
        for f in range(len(self.buckets) - 1, -1, -1):
            if self.buckets[f]:
                return f
        return 0

    def best_fit_node(self, gpus: int) -> str | None:
        """The node with the fewest free GPUs that still has `gpus` free (least fragmentation)."""
        for f in range(max(0, gpus), len(self.buckets)):
            b = self.buckets[f]
            if b:
                return b[0][1]
        return None

    def node_slots(self, node: str, gpus_per_rank: int, need: int) -> int:
        cur = self.free.get(node)
        if cur is None:
            return 0
        if gpus_per_rank <= 0:
            return need
        return len(cur) // gpus_per_rank
