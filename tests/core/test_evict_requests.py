"""`corral datasets evict` in the fold (#41): a DatasetEvictRequested is remembered on its node until the node's
DatasetEvicted of the key; a NodeDatasets without the key ends it too; the agent's slice folds it alike."""

from __future__ import annotations

from orchestrator.core.node_view import NodeView, evolve_node, node_view_of
from schemas.events import CachedDataset, DatasetEvicted, DatasetEvictRequested, NodeDatasets
from tests.core.harness import Sim

KEY, OTHER = "src-" + "a" * 32, "src-" + "b" * 32


def test_a_request_stands_until_the_node_says_the_entry_is_gone() -> None:
    s = Sim()
    s.node("n0")
    s.emit(NodeDatasets(event_id=s.eid(), occurred_at=s.now, node_id="n0",
                        datasets=(CachedDataset(key=KEY, size_bytes=10), CachedDataset(key=OTHER, size_bytes=5))))
    s.emit(DatasetEvictRequested(event_id=s.eid(), occurred_at=s.now, node_id="n0", key=KEY, requested_by="al"))
    seq = s.state.seq
    s.emit(DatasetEvictRequested(event_id=s.eid(), occurred_at=s.now, node_id="n0", key=KEY))  # asked twice: once
    s.emit(DatasetEvictRequested(event_id=s.eid(), occurred_at=s.now, node_id="n9", key=KEY))  # no such node
    node = s.state.nodes["n0"]
    assert [(r.key, r.requested_by, r.seq) for r in node.evict_requests] == [(KEY, "al", seq)]
    assert node.datasets == (KEY, OTHER)
    # The agent's slice folds it to the same record (it reads corral.node.n0.>).
    view = node_view_of(s.state, "n0")
    assert view.node is not None and view.node.evict_requests == node.evict_requests

    s.emit(DatasetEvicted(event_id=s.eid(), occurred_at=s.now, node_id="n0", key=KEY, size_bytes=10))
    node = s.state.nodes["n0"]
    assert node.evict_requests == () and node.datasets == (OTHER,)

    # A key the node does not hold: its agent answers at once (0 bytes), which ends the request as well.
    s.emit(DatasetEvictRequested(event_id=s.eid(), occurred_at=s.now, node_id="n0", key=KEY))
    assert [r.key for r in s.state.nodes["n0"].evict_requests] == [KEY]
    s.emit(DatasetEvicted(event_id=s.eid(), occurred_at=s.now, node_id="n0", key=KEY))
    assert s.state.nodes["n0"].evict_requests == ()


def test_a_restarted_agent_whose_cache_lacks_the_key_ends_the_request() -> None:
    s = Sim()
    s.node("n0")
    s.emit(NodeDatasets(event_id=s.eid(), occurred_at=s.now, node_id="n0", datasets=(CachedDataset(key=KEY),)))
    s.emit(DatasetEvictRequested(event_id=s.eid(), occurred_at=s.now, node_id="n0", key=KEY))
    s.emit(DatasetEvictRequested(event_id=s.eid(), occurred_at=s.now, node_id="n0", key=OTHER))
    s.emit(NodeDatasets(event_id=s.eid(), occurred_at=s.now, node_id="n0", datasets=(CachedDataset(key=OTHER),)))
    assert [r.key for r in s.state.nodes["n0"].evict_requests] == [OTHER]


def test_the_node_slice_fold_agrees() -> None:
    s = Sim()
    s.node("n0")
    view = node_view_of(s.state, "n0")
    events = [NodeDatasets(event_id="nd", occurred_at=1.0, node_id="n0", datasets=(CachedDataset(key=KEY),)),
              DatasetEvictRequested(event_id="ask", occurred_at=2.0, node_id="n0", key=KEY, requested_by="al")]
    seq = s.state.seq
    for i, e in enumerate(events, 1):
        s.emit(e)
        view = evolve_node(view, e, seq + i)
    assert isinstance(view, NodeView) and view.node == s.state.nodes["n0"]
