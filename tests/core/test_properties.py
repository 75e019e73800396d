"""Property tests: random clusters, random event sequences, the invariants of DESIGN.md after every fold.

1. A GPU belongs to at most one gang at every log position.
2. A gang is reserved whole or not at all.
3. Folding the same log twice gives byte-equal state.
4. A queue never exceeds its limit.
And: decide never emits a decision that the fold voids when applied at once.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core.decide import decide
from orchestrator.core.evolve import evolve, fold
from orchestrator.core.model.facts import SETTLE_S
from orchestrator.core.model.state import BIG_GANG_GPUS, FREE, HOLDING, ClusterState, needs_look, restore, snapshot
from orchestrator.core.model.usage import ancestors
from orchestrator.core.node_work import node_work, rank_intent
from schemas.events import (
    GangReserved,
    NodeRegistered,
    NodeUncordoned,
    PreemptionRequested,
    SchedulerElected,
    WorkerExited,
    WorkerStarted,
)
from tests.core.harness import Sim, inventory
from tests.core.strategies import LEVELS, PROFILE, nodes, ops, queues, specs, tight_ops


def check_invariants(state: ClusterState) -> None:
    held: dict[tuple[str, int], str] = {}
    per_queue: dict[str, int] = {}
    for jid in state.active:
        job = state.jobs[jid]
        assert job.status in HOLDING, jid
        spec = job.spec
        # 2. whole gangs only
        assert len(job.placement) == spec.ranks, jid
        assert [rp.rank for rp in job.placement] == list(range(spec.ranks)), jid
        for rp in job.placement:
            assert len(rp.gpus) == spec.gpus_per_rank, jid
            for g in rp.gpus:
                owners = state.owners[rp.node_id]
                if g >= len(owners) or (job.lost and owners[g] != jid):
                    # The GPU vanished in a re-registration (maybe to come back free): the gang is lost.
                    assert job.lost > 0, f"{jid} holds {rp.node_id}/{g}, which vanished, and is not marked lost"
                    continue
                # 1. one gang per GPU
                assert (rp.node_id, g) not in held, f"{rp.node_id}/{g} held by {held.get((rp.node_id, g))} and {jid}"
                held[(rp.node_id, g)] = jid
                assert state.owners[rp.node_id][g] == jid
        assert job.gpus == spec.total_gpus
        per_queue[job.queue] = per_queue.get(job.queue, 0) + job.gpus
    owned = {(n, g): o for n, owners in state.owners.items() for g, o in enumerate(owners) if o != FREE}
    assert owned == held, "an owner map entry without a holding gang"
    for jid in state.pending:
        assert state.jobs[jid].status == "pending"
    # the fold's queue lines hold exactly the pending jobs not gated (core/gating.py), sorted
    in_lines = [k for line in state.lines.values() for k in line]
    assert sorted(k[-1] for k in in_lines) == sorted(set(state.pending) - set(state.gated))
    assert all(k == state.jobs[k[-1]].line_key for k in in_lines), "a line key moved while its job waited"
    big = [(j.waiting_since, jid) for jid in state.pending
           if jid not in state.gated and (j := state.jobs[jid]).spec.total_gpus >= BIG_GANG_GPUS]
    assert state.big_pending == sorted(big), "the starvation bound's index is not the big pending gangs in lines"
    assert all(line == sorted(line) for line in state.lines.values())
    # unexplained: the pending jobs without a reason, plus those explained while nodes were
    # still joining (their capacity verdict is due once the cluster settles)
    unsettled = {j for j in state.pending if (w := state.jobs[j].waiting) is not None
                 and w.at < state.newest_node_at + SETTLE_S}
    assert {j for j in state.pending if state.jobs[j].waiting is None and j not in state.gated} <= set(state.unexplained)
    assert not set(state.unexplained) & set(state.gated)
    assert set(state.unexplained) - {j for j in state.pending if state.jobs[j].waiting is None} <= unsettled
    assert set(state.stopping) == {j for j, job in state.jobs.items() if job.stop is not None
                                   and job.status not in ("completed", "failed", "cancelled", "rejected")}
    # react's watch list and the sorted expected ends cover exactly the gangs they claim to
    assert set(state.watch) == {j for j in state.active if needs_look(state.jobs[j])}
    assert state.ends == sorted(state.jobs[j].end_key for j in state.active)
    assert all(state.jobs[h].status == "pending" for h in state.holders)
    # usage bookkeeping matches the gangs
    for q, u in state.usage.items():
        assert u.gpus == per_queue.get(q, 0), q
    # an agent's question about one rank agrees with its question about the whole node
    asked = {(j, state.jobs[j].attempt - back, rp.rank) for j in state.active for back in (0, 1)
             for rp in state.jobs[j].placement}
    for nid in state.nodes:
        work = node_work(state, nid)
        assert {k: i for k in asked | set(work) if (i := rank_intent(state, nid, k)) is not None} == work
    # 4. limits (set once, never lowered, in these sequences)
    tree: dict[str, int] = {}
    for q, n in per_queue.items():
        for a in ancestors(state.queues, q):
            tree[a] = tree.get(a, 0) + n
    for name, queue in state.queues.items():
        if queue.limit_gpus is not None:
            assert tree.get(name, 0) <= queue.limit_gpus, f"queue {name} over its limit"


def pick(seq: list[str], i: int) -> str | None:
    return seq[i % len(seq)] if seq else None


def build(cluster: list[dict[str, Any]], qs: list[dict[str, Any]], levels: tuple[str, ...],
          min_runtime_s: float = 20.0) -> Sim:
    s = Sim(levels=levels, min_runtime_s=min_runtime_s)
    for n in cluster:
        labels = {k: v for k, v in n["labels"].items() if k in levels}
        s.node(n["node_id"], gpus=n["gpus"], model=n["model"], memory_mib=n["memory_mib"], labels=labels,
               links=n["links"])
    for q in qs:
        s.queue(q["name"], weight=q["weight"], guaranteed_gpus=q["guaranteed_gpus"], limit_gpus=q["limit_gpus"],
                parent=q["parent"])
    return s


def play_agents(s: Sim) -> None:
    """Agents: start every placed rank not started; stop what is being stopped."""
    for jid in list(s.state.active):
        job = s.state.jobs[jid]
        book = s.state.ranks.get(jid, {})
        stopping = job.stop is not None or job.status == "preempting"
        for rp in job.placement:
            node = s.state.nodes[rp.node_id]
            if node.failed:
                continue
            r = book.get(rp.rank)
            if stopping and (r is None or r.status != "exited"):
                s.emit(WorkerExited(event_id=s.eid(), occurred_at=s.now, job_id=jid, attempt=job.attempt,
                                    rank=rp.rank, node_id=rp.node_id, exit_code=None, reason="preempted"))
            elif not stopping and r is None:
                s.emit(WorkerStarted(event_id=s.eid(), occurred_at=s.now, job_id=jid, attempt=job.attempt,
                                     rank=rp.rank, node_id=rp.node_id))


def apply_op(s: Sim, op: tuple[Any, ...], counter: list[int]) -> None:
    kind = op[0]
    active = list(s.state.active)
    node_ids = list(s.state.nodes)
    if kind == "submit":
        spec = dict(op[1])
        counter[0] += 1
        s.submit(f"j{counter[0]:03}", **spec)
    elif kind == "burst":
        for spec in op[1]:
            counter[0] += 1
            s.submit(f"j{counter[0]:03}", **dict(spec))
    elif kind == "decide":
        s.decide()  # asserts: nothing it emits is void when folded at once
    elif kind == "agents":
        play_agents(s)
    elif kind == "finish" and (jid := pick(active, op[1])):
        job = s.job(jid)
        if job.status in ("running", "reserved") and job.started == job.spec.ranks:
            s.finish(jid)
    elif kind == "crash" and (jid := pick(active, op[1])):
        job = s.job(jid)
        if job.placement and job.status in ("running", "reserved") and job.started == job.spec.ranks:
            s.exit(jid, rank=op[1] % len(job.placement), code=1, reason="crashed",
                   will_restart=op[2] and job.spec.restart_policy == "rank")
    elif kind == "lose" and (jid := pick(active, op[1])):
        s.exit(jid, rank=0, code=None, reason="lost")
    elif kind == "node_fail" and (nid := pick(node_ids, op[1])):
        s.fail_node(nid)
    elif kind == "node_recover" and (nid := pick(node_ids, op[1])):
        s.recover_node(nid)
    elif kind == "cordon" and (nid := pick(node_ids, op[1])):
        if op[2]:
            s.cordon(nid)
        else:
            s.emit(NodeUncordoned(event_id=s.eid(), occurred_at=s.now, node_id=nid))
    elif kind == "cancel" and (jid := pick(list(s.state.jobs), op[1])):
        s.cancel(jid)
    elif kind == "checkpoint" and (jid := pick(active, op[1])):
        job = s.job(jid)
        s.checkpoint(jid, step=op[1], path=f"/ckpt/{jid}/{op[1]}", rank=op[2] % job.spec.ranks)
    elif kind == "tick":
        s.tick(op[1])
    elif kind == "stale":
        # A decision computed by the old leader lands after a new one is elected: void.
        stale = decide(s.state, s.now, epoch=s.epoch)
        s.elect(s.epoch + 1)
        for e in stale:
            voids = s.state.voids
            s.emit(e)  # type: ignore[arg-type]
            if isinstance(e, (GangReserved, PreemptionRequested)):
                assert s.state.voids == voids + 1
    elif kind == "race":
        # Two schedulers of the same epoch decide on the same state; the log orders them.
        first = decide(s.state, s.now, epoch=s.epoch)
        second = decide(s.state, s.now + 1, epoch=s.epoch)
        for e in first + second:
            s.emit(e)  # type: ignore[arg-type]
    elif kind == "reregister" and (nid := pick(node_ids, op[1])):
        node = s.state.nodes[nid]
        s.emit(NodeRegistered(event_id=s.eid(), occurred_at=s.now, node_id=nid, incarnation=f"i{op[1]}",
                              address=node.address, inventory=inventory(op[2], model="H100",
                                                                        labels=dict(node.inventory.labels))))
    elif kind == "dup" and s.log:
        last = s.log[-1]
        if not isinstance(last, SchedulerElected):
            s.emit(last)


@given(cluster=nodes(), qs=queues(), levels=LEVELS, script=st.lists(ops, min_size=10, max_size=120))
@PROFILE
def test_invariants_hold_after_every_fold(
    cluster: list[dict[str, Any]], qs: list[dict[str, Any]], levels: tuple[str, ...], script: list[tuple[Any, ...]]
) -> None:
    s = build(cluster, qs, levels)
    counter = [0]
    for op in script:
        apply_op(s, op, counter)
        check_invariants(s.state)
    # Drain: the system settles with every invariant intact.
    for _ in range(3):
        s.decide()
        play_agents(s)
        check_invariants(s.state)
    # 3. determinism: fold the log twice from scratch.
    one, two = fold(s.log), fold(s.log)
    assert snapshot(one) == snapshot(two) == snapshot(s.state)


@given(
    node_count=st.integers(1, 3),
    guarantees=st.tuples(st.sampled_from([0, 4, 8]), st.sampled_from([0, 4, 8])),
    limit=st.sampled_from([None, 6, 8, 12, 16]),
    script=st.lists(tight_ops, min_size=10, max_size=80),
)
@PROFILE
def test_invariants_hold_under_contention(
    node_count: int, guarantees: tuple[int, int], limit: int | None, script: list[tuple[Any, ...]]
) -> None:
    """Few GPUs, two teams, many priorities: preemption, reclaim and backfill all happen here."""
    cluster = [{"node_id": f"n{i}", "gpus": 8, "model": "H100", "memory_mib": 81920, "labels": {}, "links": ()}
               for i in range(node_count)]
    qs = [{"name": "a", "weight": 1.0, "guaranteed_gpus": guarantees[0], "limit_gpus": limit, "parent": None},
          {"name": "b", "weight": 1.0, "guaranteed_gpus": guarantees[1], "limit_gpus": None, "parent": None}]
    s = build(cluster, qs, (), min_runtime_s=0.0)  # preempt freely: the hardest case for the plan
    counter = [0]
    for op in script:
        apply_op(s, op, counter)
        check_invariants(s.state)
    one, two = fold(s.log), fold(s.log)
    assert snapshot(one) == snapshot(two) == snapshot(s.state)


@given(cluster=nodes(), levels=LEVELS, jobs=st.lists(st.tuples(st.just("submit"), specs), min_size=1, max_size=40))
@PROFILE
def test_decide_on_a_copy_matches_decide_on_the_original(
    cluster: list[dict[str, Any]], levels: tuple[str, ...], jobs: list[tuple[Any, ...]]
) -> None:
    """decide is pure: same state, same now, same answer; the state is untouched."""
    s = build(cluster, [], levels)
    counter = [0]
    for op in jobs:
        apply_op(s, op, counter)
    before = snapshot(s.state)
    a = decide(s.state, s.now, epoch=1)
    b = decide(s.state.copy(), s.now, epoch=1)
    assert a == b
    assert snapshot(s.state) == before
    for e in a:
        voids = s.state.voids
        evolve(s.state, e)  # type: ignore[arg-type]
        assert s.state.voids == voids
    check_invariants(s.state)


@given(
    running=st.lists(st.tuples(st.sampled_from(["a", "b"]), st.sampled_from([1, 2, 4, 8]), st.integers(0, 3),
                               st.booleans()), min_size=1, max_size=8),
    waiting=st.lists(st.tuples(st.sampled_from(["a", "b"]), st.sampled_from([1, 2, 4]), st.integers(0, 3)),
                     min_size=1, max_size=8),
    limit=st.sampled_from([None, 4, 6, 8, 12]),
    guarantees=st.tuples(st.sampled_from([0, 4, 8]), st.sampled_from([0, 4, 8])),
)
@settings(PROFILE, max_examples=PROFILE.max_examples * 5)  # small examples; the bugs here hide in rare orders
def test_quota_and_preemption_in_one_cycle_are_never_void(
    running: list[tuple[str, int, int, bool]], waiting: list[tuple[str, int, int]], limit: int | None,
    guarantees: tuple[int, int],
) -> None:
    """A full cluster, a queue at its limit, a burst of mixed priorities: every decision folds cleanly."""
    s = Sim()
    s.node("n0")
    s.node("n1")
    s.queue("a", limit_gpus=limit, guaranteed_gpus=guarantees[0])
    s.queue("b", guaranteed_gpus=guarantees[1])
    for i, (q, gpus, prio, preemptible) in enumerate(running):
        s.submit(f"r{i}", queue=q, gpus_per_rank=gpus, priority=prio, preemptible=preemptible)
        s.run(cycles=2)
    s.tick(100)
    for i, (q, gpus, prio) in enumerate(waiting):
        s.submit(f"w{i}", queue=q, gpus_per_rank=gpus, priority=prio)
    for _ in range(4):  # Sim.decide fails on any void decision
        s.agents(s.decide())
        check_invariants(s.state)


@given(cluster=nodes(), qs=queues(), levels=LEVELS, script=st.lists(st.one_of(ops, tight_ops), min_size=10,
                                                                    max_size=100))
@PROFILE
def test_decide_with_memos_kept_from_earlier_calls_matches_a_cold_start(
    cluster: list[dict[str, Any]], qs: list[dict[str, Any]], levels: tuple[str, ...], script: list[tuple[Any, ...]]
) -> None:
    """decide keeps derived views between calls in a Memo (topology.topology_of, freegpus.FreeGpus,
    running.RunningGangs), reused in O(1) for the same state object while the fold's revision counters
    stand still and updated by identity diffs of its records otherwise. Before every op: the answer
    with those memos warm -- last computed for this state object before the previous op -- equals
    the answer for the same state restored from its snapshot (new objects: every memo cold), as
    after a scheduler restart."""
    s = build(cluster, qs, levels)
    counter = [0]
    for op in script:
        warm = decide(s.state, s.now, epoch=s.epoch, memo=s.memo)
        cold = decide(restore(snapshot(s.state)), s.now, epoch=s.epoch)
        assert warm == cold
        decide(s.state, s.now, epoch=s.epoch, memo=s.memo)  # the memos are this state's again for the next op
        apply_op(s, op, counter)
