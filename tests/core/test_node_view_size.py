"""An agent's state does not grow with history nor with the cluster (#40, acceptance: RSS independent of both).

A node's view is folded from its slice alone (the server's filter rule, events/subjects.py). After a history
of finished jobs it holds nothing of them: the same bytes after 40 jobs as after 2,000, on 4 nodes as on 64.
And what the server delivers to a node is its own part of the log: a node with no work in a history of
2,000 jobs on other nodes reads only the elections, the settings and its own registration.
"""

from __future__ import annotations

from events.subjects import in_slice, subject_for
from orchestrator.core.node_view import NodeView, evolve_node, view_bytes
from tests.core.harness import Sim


def history(nodes: int, jobs: int, *, busy: set[str] | None = None) -> Sim:
    """`jobs` one-GPU jobs run to completion, 4 at a time per node; only `busy` nodes (all: None) take work."""
    s = Sim()
    for i in range(nodes):
        s.node(f"n{i}", gpus=4)
    if busy is not None:
        for i in range(nodes):
            if f"n{i}" not in busy:
                s.cordon(f"n{i}")
    done, room = 0, 4 * (nodes if busy is None else len(busy))
    while done < jobs:
        batch = [f"j{done + k}" for k in range(min(room, jobs - done))]
        for j in batch:
            s.submit(j, ranks=1, gpus_per_rank=1, command=("true",))
        s.run()
        for j in batch:
            assert s.job(j).status == "running", (j, s.job(j).status)
            s.tick(1.0)
            s.finish(j)
        s.run()
        assert all(s.job(j).status == "completed" for j in batch)
        done += len(batch)
    return s


def slice_of(s: Sim, node: str) -> tuple[int, NodeView]:
    """How many events the server delivers to `node`'s agent, and the view they fold to."""
    view, delivered = NodeView(node_id=node), 0
    for seq, e in enumerate(s.log, start=1):
        if in_slice(subject_for(e), node):
            delivered += 1
            evolve_node(view, e, seq)
    return delivered, view


def test_a_views_size_does_not_grow_with_history() -> None:
    short, long = slice_of(history(4, 40), "n0")[1], slice_of(history(4, 2_000), "n0")[1]
    assert not long.work and not long.slice.unended
    assert len(view_bytes(long)) == len(view_bytes(short))


def test_a_views_size_does_not_grow_with_the_cluster() -> None:
    small, large = slice_of(history(4, 400), "n0")[1], slice_of(history(64, 400), "n0")[1]
    assert len(view_bytes(large)) == len(view_bytes(small))


def test_a_node_reads_only_its_own_part_of_a_long_log() -> None:
    s = history(8, 2_000, busy={"n1", "n2"})
    idle, _ = slice_of(s, "n5")
    busy, _ = slice_of(s, "n1")
    # Settings, the election, its registration and its cordon: nothing of the 2,000 jobs that ran elsewhere.
    assert idle == 4, idle
    # A busy node reads its own jobs' orders and reports (a few per job), a small share of the whole log.
    assert busy < len(s.log) / 4, (busy, len(s.log))
