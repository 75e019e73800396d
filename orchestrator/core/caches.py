"""What each node's dataset cache holds, with sizes and when a job last used each entry (issue #33).

`Node.datasets` (core/staging.py) is the set of keys placement reads; the
operator views (`corral nodes --datasets`, `corral datasets`) also want each
entry's size and when a job last used it. Those live beside the node records
(`ClusterState.dataset_cache`), not in them: a cache hit is told for every
gang that starts, and a node record that changed with each would make every
reader rebuild its topology. A NodeDatasets replaces a node's entries (its
agent's `last_used`), a DatasetReady adds or refreshes one (the size it
names, used at the event's time), a DatasetEvicted drops one. Entries are
kept sorted by key; values are replaced, never mutated.
"""

from __future__ import annotations

from orchestrator.core.model.state import ClusterState
from schemas.events import CachedDataset, DatasetEvicted, DatasetReady, NodeDatasets


def cache_listed(state: ClusterState, e: NodeDatasets) -> None:
    if e.node_id in state.nodes:
        by_key = {d.key: d for d in e.datasets if d.key}
        state.dataset_cache[e.node_id] = tuple(by_key[k] for k in sorted(by_key))


def cache_used(state: ClusterState, e: DatasetReady, at: float) -> None:
    if e.node_id not in state.nodes or not e.key:
        return
    entries = {d.key: d for d in state.dataset_cache.get(e.node_id, ())}
    old = entries.get(e.key)
    size = e.size_bytes or (old.size_bytes if old is not None else 0)
    entries[e.key] = CachedDataset(key=e.key, size_bytes=size, last_used=max(at, old.last_used if old else 0.0))
    state.dataset_cache[e.node_id] = tuple(entries[k] for k in sorted(entries))


def cache_evicted(state: ClusterState, e: DatasetEvicted) -> None:
    entries = state.dataset_cache.get(e.node_id)
    if entries is not None and any(d.key == e.key for d in entries):
        state.dataset_cache[e.node_id] = tuple(d for d in entries if d.key != e.key)
