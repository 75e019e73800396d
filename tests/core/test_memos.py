"""decide's per-call memos (topology_of, free_gpus, running_gangs) answer in O(1) for the same state
object while the fold's revision counters (`ClusterState.alloc_rev`, `nodes_rev`) stand still.

The fold moves them for every event outside `evolve._ALLOCATION_UNTOUCHED` (node events: both). That
list is a claim about the fold; it is checked here against every event of simulated logs with
preemptions, requeues, outages and repairs: an event of a listed type never changes node records,
GPU owners, earmarks or `ends`, and only node events change node records.
"""

from __future__ import annotations

import io

from orchestrator.core.evolve import _ALLOCATION_UNTOUCHED, _NODE_EVENTS, evolve
from orchestrator.core.model.memo import Memo
from orchestrator.core.model.running import RunningGangs, running_gangs
from orchestrator.core.model.state import ClusterState
from orchestrator.sim.cluster import setup_events
from orchestrator.sim.engine import Scenario, SimConfig, simulate
from orchestrator.sim.gen import GenConfig, generate, standard_cluster
from orchestrator.sim.specs import sim_jobs
from schemas.codec import decode
from schemas.events import Unknown, WorkAssigned, WorkChanged


def test_events_said_to_leave_allocation_alone_do() -> None:
    cluster = standard_cluster(nodes=16, queues=4, leaf_nodes=4, block_leaves=2)
    trace = generate(cluster, GenConfig(jobs=800, seed=1, node_mtbf_days=2, urgent_share=0.2, load=1.2))
    scenario = Scenario(tuple(setup_events(cluster)), tuple(sim_jobs(trace.jobs, cluster)), trace.outages)
    seen: set[type] = set()
    for policy in ("corral", "las"):
        log = io.BytesIO()
        simulate(scenario, policy, SimConfig(checkpoint_interval_s=600), log=log)
        state = ClusterState()
        for line in log.getvalue().splitlines():
            e = decode(line)
            nodes, alloc = dict(state.nodes), (dict(state.owners), dict(state.earmarks), list(state.ends))
            revs = (state.alloc_rev, state.nodes_rev)
            evolve(state, e)  # type: ignore[arg-type]
            seen.add(type(e))
            if isinstance(e, _ALLOCATION_UNTOUCHED):
                assert (dict(state.owners), dict(state.earmarks), list(state.ends)) == alloc, e
                assert (state.alloc_rev, state.nodes_rev) == revs
            elif state.voids == 0:
                assert state.alloc_rev == revs[0] + 1
            if not isinstance(e, _NODE_EVENTS):
                assert dict(state.nodes) == nodes, e
                assert state.nodes_rev == revs[1]
    # (The simulator has no agents, so no node's orders: tests/core/test_orders.py checks those the same way.)
    assert set(_ALLOCATION_UNTOUCHED) <= seen | {Unknown, WorkAssigned, WorkChanged}, "each listed type must occur"


def _facts(r: RunningGangs) -> tuple[object, ...]:
    return (r.lowest, r.counts, set(r.preemptible), set(r.cpu_only), r.facts)


def test_running_gangs_follow_the_folds_changes_or_read_ends_afresh() -> None:
    """running.running_gangs follows `ends_changes` between calls, and reads `ends` whole when the fold
    dropped changes it had not seen (a long gap between calls): either way it matches a fresh read."""
    cluster = standard_cluster(nodes=16, queues=4, leaf_nodes=4, block_leaves=2)
    trace = generate(cluster, GenConfig(jobs=800, seed=2, urgent_share=0.2, load=1.2))
    log = io.BytesIO()
    simulate(Scenario(tuple(setup_events(cluster)), tuple(sim_jobs(trace.jobs, cluster))), "corral", SimConfig(),
             log=log)
    events = [decode(line) for line in log.getvalue().splitlines()]
    state = ClusterState()
    memo = Memo()
    asked_at = {i for i in range(0, len(events), 7) if not 2000 <= i < 6000}  # and one long gap
    paths = {"followed": 0, "read afresh": 0}
    for i, e in enumerate(events):
        evolve(state, e)  # type: ignore[arg-type]
        if i in asked_at:
            kept = memo.running if memo.running is not None and memo.running.ends is state.ends else None
            if kept is not None and kept.rev != state.alloc_rev:
                paths["followed" if kept.seq >= state.ends_dropped else "read afresh"] += 1
            assert _facts(running_gangs(state, memo)) == _facts(RunningGangs(state)), i
    assert paths["followed"] > 100 and paths["read afresh"] >= 1, paths
