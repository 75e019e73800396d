"""One node's slice (#40): the orders converge on what the fold wants, and an agent's fold of its slice alone
holds what the scheduler's state says of that node, at every position.

Random clusters and event sequences (test_properties' ops) with an orders stage after every decide; the
slice of each node is chosen by subject with the server's own filter rule (events/subjects.py), not by the
fold, so a report missing from a node's subjects would show here as a difference.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from events.subjects import in_slice, subject_for
from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import ClusterState, restore, snapshot
from orchestrator.core.node_view import NodeView, evolve_node, node_view_of, node_work, rank_intent
from orchestrator.core.node_work import node_work as wanted_work
from orchestrator.core.orders import due, node_orders
from schemas.events import AnyEvent, WorkAssigned, WorkChanged
from tests.core.harness import Sim
from tests.core.test_properties import LEVELS, PROFILE, apply_op, build, nodes, ops, queues


def send_orders(s: Sim, cap: int = 3) -> list[AnyEvent]:
    """The orders stage, folded as the scheduler's appends would be (a small cap: several rounds)."""
    sent: list[AnyEvent] = []
    for _ in range(50):
        orders = node_orders(s.state, now=s.now, epoch=s.epoch, cap=cap)
        if not orders:
            return sent
        for e in orders:
            before = s.state.voids
            s.emit(e)  # type: ignore[arg-type]
            assert s.state.voids == before, f"an order was void: {s.state.last_void}"
            sent.append(e)  # type: ignore[arg-type]
    raise AssertionError("the orders never converged")


def slice_fold(log: list[AnyEvent], node_id: str) -> NodeView:
    view = NodeView(node_id=node_id)
    for seq, e in enumerate(log, start=1):
        if in_slice(subject_for(e), node_id):
            evolve_node(view, e, seq)
    return view


def check_views(s: Sim) -> None:
    for nid in s.state.nodes:
        folded, projected = slice_fold(s.log, nid), node_view_of(s.state, nid)
        assert folded.facts() == projected.facts(), f"node {nid}: its slice's fold differs from the projection"


def check_due(state: ClusterState) -> None:
    assert set(state.orders_due) == {j for j in set(state.jobs) | set(state.slice_jobs) if due(state, j)}


@given(cluster=nodes(), qs=queues(), levels=LEVELS, script=st.lists(ops, min_size=10, max_size=80),
       cap=st.integers(1, 4))
@PROFILE
def test_a_nodes_slice_folds_to_the_schedulers_view_of_it(
    cluster: list[dict[str, Any]], qs: list[dict[str, Any]], levels: tuple[str, ...], script: list[tuple[Any, ...]],
    cap: int,
) -> None:
    s = build(cluster, qs, levels)
    counter = [0]
    for i, op in enumerate(script):
        apply_op(s, op, counter)
        if op[0] == "decide" or i % 7 == 0:
            send_orders(s, cap)
        check_due(s.state)
    check_views(s)
    send_orders(s, cap)
    check_due(s.state)
    assert not s.state.orders_due
    check_views(s)
    # Converged: what each agent runs is what the scheduler's fold wants run there.
    for nid in s.state.nodes:
        view = slice_fold(s.log, nid)
        assert node_work(view) == wanted_work(s.state, nid), nid
        for key, intent in node_work(view).items():
            assert rank_intent(view, key) == intent
    # The projection survives its own encoding (what an agent loads from the store).
    for nid in s.state.nodes:
        v = node_view_of(s.state, nid)
        assert NodeViewCodec.decode(NodeViewCodec.encode(v)).facts() == v.facts()
    # Replays alike: orders fold deterministically like every decision.
    again = ClusterState()
    for e in s.log:
        evolve(again, e)
    assert snapshot(again) == snapshot(s.state)
    assert snapshot(restore(snapshot(s.state))) == snapshot(s.state)


def test_a_one_rank_job_costs_its_node_an_assignment_and_nothing_to_release() -> None:
    s = Sim()
    s.node("n0")
    s.node("n1")
    s.submit("a")
    s.decide()  # the harness folds the orders after the decisions, as the scheduler's next cycle would
    orders = [e for e in s.log if isinstance(e, (WorkAssigned, WorkChanged))]
    assert [type(e) for e in orders] == [WorkAssigned]
    assert orders[0].node_id == s.job("a").placement[0].node_id  # type: ignore[union-attr]
    s.start("a")
    s.finish("a")
    s.decide()
    assert send_orders(s) == [], "a node whose ranks all exited is through: no release needed"
    assert not s.state.slices, "nothing left in any slice"


def test_a_preemption_and_a_requeue_are_told_to_the_nodes_that_hold_ranks() -> None:
    s = Sim()
    s.node("n0")
    s.node("n1")
    s.submit("g", ranks=2, gpus_per_rank=8)
    s.decide()
    assert {e.node_id for e in s.log if isinstance(e, WorkAssigned)} == {"n0", "n1"}
    s.start("g")
    s.cancel("g")
    changes = send_orders(s)
    assert {(e.node_id, e.intent) for e in changes if isinstance(e, WorkChanged)} == {("n0", "stop"), ("n1", "stop")}
    s.exit("g", rank=0, code=None, reason="cancelled")
    s.fail_node("n1")
    s.tick(100)
    before = len(s.log)
    s.decide()  # the stop ends the job: n1's rank never exited, so n1 is told to let go
    released = [e for e in s.log[before:] if isinstance(e, WorkChanged)]
    assert [(e.node_id, e.intent) for e in released] == [("n1", "release")]


class NodeViewCodec:
    from msgspec import msgpack as _mp

    _enc = _mp.Encoder()
    _dec = _mp.Decoder(NodeView)

    @classmethod
    def encode(cls, v: NodeView) -> bytes:
        return cls._enc.encode(v)

    @classmethod
    def decode(cls, b: bytes) -> NodeView:
        return cls._dec.decode(b)
