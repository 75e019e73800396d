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
from schemas.events import JobWaiting, Unknown, WorkAssigned, WorkChanged


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
            moved = (dict(state.owners), dict(state.earmarks), list(state.ends)) != alloc
            if moved:  # whatever the event: the memos trust the counter
                assert state.alloc_rev > revs[0], e
            if isinstance(e, _ALLOCATION_UNTOUCHED):
                # ... and a listed type leaves allocation alone, but for a JobWaiting releasing an earmark.
                assert not moved or (isinstance(e, JobWaiting) and dict(state.earmarks) != alloc[1]), e
                assert state.nodes_rev == revs[1] and (moved or state.alloc_rev == revs[0])
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


def test_a_warm_decide_sees_the_gpus_a_preemptor_gave_up() -> None:
    """A JobWaiting that tells a preemptor it no longer waits on its victims releases its earmark. The
    warm free-GPU memo (`Memo.free`) trusted `alloc_rev`, which that JobWaiting did not move: the warm decide
    left the freed node unused while a cold decide (the same state restored from its snapshot) placed on it.
    (Found by #42's speed work: queue a reclaims its guarantee from b's 8-GPU r1, whose stop leaves n1 free.)"""
    from dataclasses import replace

    from orchestrator.core.decide import decide
    from orchestrator.core.model.state import restore, snapshot
    from orchestrator.policies import DEFAULT_POLICIES
    from tests.core.harness import Sim

    s = Sim(min_runtime_s=0.0, policies=replace(DEFAULT_POLICIES, starvation_bound_s=900.0, starvation_bound_floor_s=120.0,
                                               preemption_searches=1))
    for n in range(4):
        s.node(f"n{n}")
    s.queue("a", limit_gpus=16, guaranteed_gpus=16)
    s.queue("b", limit_gpus=None, guaranteed_gpus=0)
    for jid, queue, gpus, preemptible in (("r0", "a", 1, False), ("r1", "b", 8, True)):
        s.submit(jid, queue=queue, gpus_per_rank=gpus, preemptible=preemptible, checkpoint_dir="/ckpt")
        s.run(cycles=2)
    for i, (queue, ranks, gpus) in enumerate((("a", 1, 1), ("a", 1, 1), ("a", 1, 1), ("a", 1, 8), ("a", 1, 8),
                                              ("a", 1, 1), ("b", 3, 4))):
        s.submit(f"w{i}", queue=queue, ranks=ranks, gpus_per_rank=gpus, preemptible=False, checkpoint_dir="/ckpt")
    told: list[tuple[str, str]] = []
    for tick in (2000.0, 60.0):
        s.tick(tick)
        for _ in range(3):
            cold = decide(restore(snapshot(s.state)), s.now, epoch=s.epoch, policies=s.policies)
            events = s.decide()
            assert events == cold, told
            told += [(type(e).__name__, getattr(e, "code", "")) for e in events if getattr(e, "job_id", "") in ("w5", "r1")]
            s.agents(events)
    # w5 gave its earmark up (quota), then r1 was placed again on the node its stop had freed.
    assert told.index(("JobWaiting", "quota")) < told.index(("GangReserved", ""), told.index(("Preempted", ""))), told
