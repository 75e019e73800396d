"""The cluster's domain tree: topology levels coarse to fine, then nodes, then GPUs.

Levels come from ClusterConfigured.topology_levels (e.g. ("block", "leaf"))
and are read from node labels. A domain's id is its path ("block=b1/leaf=l3"),
so equal labels under different parents stay distinct. A node without a
label for a level is a domain of its own at that level: nothing says it shares
that switch with anyone.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable

from orchestrator.core.model.memo import Memo
from orchestrator.core.model.state import ClusterState, Node

#: The whole cluster, the coarsest domain.
ROOT = "*"
#: Pseudo-levels around the configured ones.
NODE = "node"
CLUSTER = "cluster"


class Topology:
    """Domains and their members; built once per decide call from the registered nodes."""

    __slots__ = ("children", "domains_at", "failed", "ids", "levels", "nodes_in", "order", "path_ids", "paths", "width")

    def __init__(self, levels: tuple[str, ...]) -> None:
        self.levels = levels
        #: node -> its domains, root first then one per level (coarse to fine).
        self.paths: dict[str, tuple[str, ...]] = {}
        #: node -> its position in registration order (ties between nodes go to the first).
        self.order: dict[str, int] = {}
        #: domain -> its number (capacity indexes keep flat per-domain arrays), and each node's path as numbers.
        self.ids: dict[str, int] = {ROOT: 0}
        self.path_ids: dict[str, tuple[int, ...]] = {}
        #: Nodes marked failed when this was built (a Topology is rebuilt whenever a node record changes).
        self.failed: tuple[str, ...] = ()
        #: domain -> member nodes, in registration order.
        self.nodes_in: dict[str, list[str]] = {ROOT: []}
        #: domain -> child domains (empty at the finest level, whose children are nodes).
        self.children: dict[str, list[str]] = {ROOT: []}
        #: level -> its domains; CLUSTER -> [ROOT].
        self.domains_at: dict[str, list[str]] = {CLUSTER: [ROOT], **{lvl: [] for lvl in levels}}
        #: Most GPUs on one node (histogram width for capacity indexes).
        self.width = 0

    def add(self, node_id: str, labels: dict[str, str], gpu_count: int) -> None:
        path = [ROOT]
        parent = ROOT
        prefix = ""
        for lvl in self.levels:
            label = labels.get(lvl)
            part = f"{lvl}={label}" if label else f"{lvl}=~{node_id}"
            prefix = f"{prefix}/{part}" if prefix else part
            if prefix not in self.nodes_in:
                self.ids[prefix] = len(self.ids)
                self.nodes_in[prefix] = []
                self.children[prefix] = []
                self.children[parent].append(prefix)
                self.domains_at[lvl].append(prefix)
            path.append(prefix)
            parent = prefix
        for d in path:
            self.nodes_in[d].append(node_id)
        self.paths[node_id] = tuple(path)
        self.path_ids[node_id] = tuple(self.ids[d] for d in path)
        self.order.setdefault(node_id, len(self.order))
        self.width = max(self.width, gpu_count)

    def label_of(self, domain: str) -> str:
        """A domain's readable name: its last label ("l3"), or "cluster"."""
        if domain == ROOT:
            return CLUSTER
        return domain.rsplit("/", 1)[-1].split("=", 1)[1].lstrip("~")

    def known_level(self, level: str) -> bool:
        return level in (NODE, CLUSTER) or level in self.levels


def topology_of(state: ClusterState, memo: Memo) -> Topology:
    """`build_topology` of a state's nodes, in O(1) while the fold has not changed a node record
    since (`ClusterState.nodes_rev`; `memo.topology_for` keeps the state alive, so `is` is never a
    recycled address)."""
    last = memo.topology_for
    if last is not None:
        seen, rev, topo = last
        if seen is state and rev == state.nodes_rev and topo.levels == state.config.topology_levels:
            return topo
    topo = build_topology(state.nodes.values(), state.config.topology_levels, memo)
    memo.topology_for = (state, state.nodes_rev, topo)
    return topo


def build_topology(nodes: Iterable[Node], levels: tuple[str, ...], memo: Memo | None = None) -> Topology:
    """The domain tree of `nodes`; with a memo, reused while no node changed (a Topology is never
    modified once built)."""
    key = tuple(nodes)
    recent = memo.topologies if memo is not None else []
    for cached, cached_levels, topo in recent:
        if cached_levels == levels and len(cached) == len(key) and all(map(operator.is_, cached, key)):
            return topo
    topo = Topology(levels)
    for node in key:
        topo.add(node.node_id, node.inventory.labels, node.inventory.gpu_count)
    topo.failed = tuple(n.node_id for n in key if n.failed)
    recent.insert(0, (key, levels, topo))
    del recent[4:]
    return topo
