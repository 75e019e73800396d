"""What an agent decides from beyond the ranks is in the fold, so an agent may start from a snapshot.

Before #28 the agent rebuilt three things from the whole log, event by event,
beside its state: the workers its node started and never ended, of any attempt
(reported at adoption when they vanished), the position of the NodeFailed that
failed it (named by its NodeRecovered), and a gang restart's `not_before` (the
backoff its workers wait). An agent that starts from a snapshot never sees the
events before it, so the fold holds them now: `ClusterState.unended`,
`Node.failed_seq`, `Job.not_before`.

The checker here is that old per-event rule, written out again (not imported:
it no longer exists in the agent; one change: a start about a job or node the
fold never knew is garbage and kept by nobody), run over random logs with crashes, node
failures and recoveries, re-registrations, gang restarts, stale and racing
decisions; the fold must agree with it at every position, and a state restored
from a snapshot at any position and folded on must equal the full fold byte for byte.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import ClusterState, restore, snapshot
from schemas.events import (
    AnyEvent,
    GangRestarted,
    NodeFailed,
    NodeRecovered,
    NodeRegistered,
    Unknown,
    WorkerExited,
    WorkerStarted,
)
from tests.core.harness import Sim, inventory
from tests.core.strategies import LEVELS, PROFILE, nodes, ops, queues, tight_ops
from tests.core.test_properties import apply_op, build, play_agents


class OldAgentRule:
    """The agent's per-event bookkeeping before #28 (nodeagent/agent.py `_observe`), for every node at once."""

    def __init__(self) -> None:
        self.unended: dict[str, dict[tuple[str, int, int], int]] = {}
        self.failed_at: dict[str, int] = {}
        self.not_before: dict[tuple[str, int], float] = {}

    def observe(self, state: ClusterState, e: AnyEvent | Unknown, seq: int) -> None:
        """Called after `e` (at `seq`) was folded into `state`, as the agent's listener was."""
        if isinstance(e, NodeFailed | NodeRecovered | NodeRegistered):
            me = state.nodes.get(e.node_id)
            if me is None or not me.failed:  # (an agent of the node's current incarnation)
                self.failed_at[e.node_id] = 0
            elif not self.failed_at.get(e.node_id):
                self.failed_at[e.node_id] = seq
        elif isinstance(e, WorkerStarted) and e.job_id in state.jobs and e.node_id in state.nodes:
            # (The one change: a start about a job or node the fold never knew is garbage, kept by nobody.)
            self.unended.setdefault(e.node_id, {})[(e.job_id, e.attempt, e.rank)] = e.restarts
        elif isinstance(e, WorkerExited):
            mine = self.unended.get(e.node_id, {})
            key = (e.job_id, e.attempt, e.rank)
            if mine.get(key, e.restarts + 1) <= e.restarts:
                del mine[key]
        elif isinstance(e, GangRestarted) and e.not_before > 0:
            job = state.jobs.get(e.job_id)
            if job is not None and job.attempt == e.attempt:
                self.not_before.setdefault((e.job_id, e.attempt), e.not_before)

    def check(self, state: ClusterState) -> None:
        assert {n: w for n, w in state.unended.items() if w} == {n: w for n, w in self.unended.items() if w}
        for node_id, node in state.nodes.items():
            assert node.failed_seq == (self.failed_at.get(node_id, 0) if node.failed else 0), node_id
        current = {k: t for k, t in self.not_before.items()
                   if (j := state.jobs.get(k[0])) is not None and j.attempt == k[1]}
        assert {(jid, j.attempt): j.not_before for jid, j in state.jobs.items() if j.not_before > 0} == current


def _check_log(log: list[AnyEvent], cut: int) -> None:
    rule = OldAgentRule()
    full = ClusterState()
    for seq, e in enumerate(log, 1):
        evolve(full, e, seq)
        rule.observe(full, e, seq)
        rule.check(full)
    # From a snapshot at `cut`: the same state, byte for byte, as the full fold.
    cut = min(cut, len(log))
    head = ClusterState()
    for seq, e in enumerate(log[:cut], 1):
        evolve(head, e, seq)
    resumed = restore(snapshot(head))
    for seq, e in enumerate(log[cut:], cut + 1):
        evolve(resumed, e, seq)
    assert snapshot(resumed) == snapshot(full)


@given(cluster=nodes(), qs=queues(), levels=LEVELS, cut=st.integers(0, 400),
       script=st.lists(st.one_of(ops, tight_ops), min_size=10, max_size=120))
@PROFILE
def test_the_fold_holds_what_the_agent_rebuilt_from_the_whole_log(
    cluster: list[dict[str, Any]], qs: list[dict[str, Any]], levels: tuple[str, ...], cut: int,
    script: list[tuple[Any, ...]],
) -> None:
    s = build(cluster, qs, levels, min_runtime_s=0.0)
    counter = [0]
    for op in script:
        apply_op(s, op, counter)
    for _ in range(2):
        s.decide()
        play_agents(s)
    _check_log(s.log, cut)


def test_gang_restarts_node_failures_and_workers_of_ended_attempts() -> None:
    """A fixed log with each case at least once (the random ones may miss one)."""
    s = Sim(min_runtime_s=0.0)
    s.node("n0", 4)
    s.node("n1", 4)
    s.submit("g", ranks=2, gpus_per_rank=4, restart_policy="gang", max_restarts=2)
    s.decide()
    s.start("g")
    s.exit("g", rank=1, code=1, reason="crashed")
    restarts = [e for e in s.decide() if isinstance(e, GangRestarted)]
    assert restarts and restarts[0].not_before > 0 and s.job("g").not_before == restarts[0].not_before
    s.start("g")
    s.fail_node("n1")  # attempt 2's rank on n1 never exits in the log: its gang is requeued
    failed_at = s.state.seq
    s.decide()
    assert s.job("g").attempt == 3 and s.job("g").not_before == 0.0
    assert s.state.nodes["n1"].failed_seq == failed_at
    assert ("g", 2, 1) in s.state.unended["n1"]
    assert ("g", 1, 1) not in s.state.unended["n1"]  # its exit ended it
    assert ("g", 1, 0) in s.state.unended["n0"]  # never told ended: a restarted agent reports it if it is gone
    s.emit(NodeRegistered(event_id=s.eid(), occurred_at=s.now, node_id="n1", incarnation="n1-b", address="n1",
                          inventory=inventory(4)))
    assert s.state.nodes["n1"].failed_seq == 0
    _check_log(s.log, len(s.log) // 2)
