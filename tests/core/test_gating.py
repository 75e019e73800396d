"""Holds, dependencies and job arrays (orchestrator/core/gating.py), folded and decided.

The property test checks, after every step of random sequences, with its own
bookkeeping rather than the gating module's: a held job or one whose
dependencies are not met is never placed, every placed job's dependencies had
ended as asked when its reservation landed, and an array never holds GPUs in
more elements than its limit.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core.decide import decide
from orchestrator.core.evolve import evolve
from orchestrator.core.evolve_jobs import reservation_problem
from orchestrator.core.gating import NEVER_SATISFIED, gate_reason
from orchestrator.core.model.state import HOLDING, TERMINAL, ClusterState, restore, snapshot
from orchestrator.policies import Policies
from orchestrator.sim.baselines import policies_for
from schemas.events import (
    AnyEvent,
    GangReserved,
    JobCancelled,
    JobFailed,
    JobHeld,
    JobReleased,
    JobSubmitted,
    JobWaiting,
    PreemptionRequested,
)
from schemas.jobspec import ArrayElement, Gates, JobSpec
from tests.core.harness import Sim, of_type
from tests.core.test_properties import check_invariants, play_agents


def _sim(nodes: int = 2) -> Sim:
    s = Sim()
    for i in range(nodes):
        s.node(f"n{i}", gpus=8)
    return s


def _submit(s: Sim, job_id: str, **gates: Any) -> None:
    s.submit(job_id, gpus_per_rank=1, gates=Gates(**gates))


def _array(s: Sim, array_id: str, n: int, limit: int) -> list[str]:
    ids = [f"{array_id}_{i}" for i in range(n)]
    for i, jid in enumerate(ids):
        _submit(s, jid, array=ArrayElement(array_id=array_id, index=i, limit=limit, indexes=f"0-{n - 1}", count=n))
    return ids


def _hold(s: Sim, job_id: str) -> None:
    s.emit(JobHeld(event_id=s.eid(), occurred_at=s.now, job_id=job_id, requested_by="alice"))


def _release(s: Sim, job_id: str) -> None:
    s.emit(JobReleased(event_id=s.eid(), occurred_at=s.now, job_id=job_id, requested_by="alice"))


def _reserved(events: list[Any]) -> set[str]:
    return {e.job_id for e in of_type(events, GangReserved)}


def test_a_held_job_waits_for_its_release() -> None:
    s = _sim()
    s.submit("a", gpus_per_rank=1)
    _hold(s, "a")
    assert "a" not in _reserved(s.run())
    assert s.job("a").status == "pending" and gate_reason(s.state, s.job("a")) == "held (`corral release a` lets it start)"
    _release(s, "a")
    assert "a" in _reserved(s.run())


def test_submitted_held_and_holding_twice_is_holding_once() -> None:
    s = _sim()
    _submit(s, "a", hold=True)
    _hold(s, "a")
    assert not s.run()
    _release(s, "a")
    assert _reserved(s.run()) == {"a"}
    _hold(s, "a")  # a job holding GPUs is not held (as Slurm's scontrol hold)
    assert not s.job("a").held


def test_a_placement_decided_before_the_hold_landed_is_void() -> None:
    s = _sim()
    s.submit("a", gpus_per_rank=1)
    stale = [e for e in decide(s.state, s.now, epoch=s.epoch) if isinstance(e, GangReserved)]
    _hold(s, "a")
    voids = s.state.voids
    s.emit(stale[0])
    assert s.state.voids == voids + 1 and "gated: held" in s.state.last_void
    assert s.job("a").status == "pending"


def test_decisions_for_a_job_held_since_change_nothing() -> None:
    """A preemption for it and a backfill reservation told to it, decided before its hold landed."""
    s = Sim(min_runtime_s=0.0)
    s.node("n0", gpus=8)
    s.submit("lo", gpus_per_rank=8, time_limit_s=3600.0)
    s.run()
    s.submit("hi", gpus_per_rank=8, priority=100)
    s.submit("big", gpus_per_rank=8)
    decided = decide(s.state, s.now, epoch=s.epoch)
    assert {type(e).__name__ for e in decided} >= {"PreemptionRequested"}, decided
    _hold(s, "hi")
    for e in decided:
        s.emit(e)  # type: ignore[arg-type]
    assert s.job("lo").status == "running" and not s.state.earmarks and not s.job("hi").earmark
    assert "preemptor hi is gated: held" in s.state.last_void
    # Without "hi", "big" is the backfill head: its reservation, decided before its hold, is not kept.
    decided = [e for e in decide(s.state, s.now, epoch=s.epoch) if isinstance(e, JobWaiting)]
    assert [e.code for e in decided if e.job_id == "big"] == ["backfill_head"], decided
    _hold(s, "big")
    for e in decided:
        s.emit(e)
    w = s.job("big").waiting
    assert "big" not in s.state.holders and w is not None and w.code == "capacity" and not w.hold_ranks


def test_after_ok_starts_once_the_job_completed() -> None:
    s = _sim()
    s.submit("a", gpus_per_rank=1)
    _submit(s, "b", after_ok=("a",))
    assert _reserved(s.run()) == {"a"}
    assert gate_reason(s.state, s.job("b")) == "waiting for a to complete ok"
    s.finish("a")
    assert "b" in _reserved(s.run())


def test_after_ok_on_a_failed_job_ends_it_with_the_reason() -> None:
    s = _sim()
    s.submit("a", gpus_per_rank=1, restart_policy="never")
    _submit(s, "b", after_ok=("a",))
    _submit(s, "c", after_any=("a",))
    _submit(s, "d", after_ok=("b",))  # a chain: b never runs, so neither does d
    s.run()
    s.exit("a", code=1, reason="crashed")
    out = s.run()
    assert s.job("a").status == "failed"
    assert s.job("b").status == "cancelled" and s.job("b").end_reason == f"{NEVER_SATISFIED}: job a failed"
    assert s.job("d").status == "cancelled" and s.job("d").end_reason == f"{NEVER_SATISFIED}: job b cancelled"
    assert "c" in _reserved(out)  # after-any: a ended, however


def test_a_dependency_on_an_unknown_or_failed_job_is_never_satisfied() -> None:
    s = _sim()
    s.submit("bad", gpus_per_rank=99)  # rejected: no node has 99 GPUs
    s.run()
    assert s.job("bad").status == "rejected"
    _submit(s, "x", after_ok=("nope",))
    _submit(s, "y", after_ok=("bad",))
    _submit(s, "z", after_any=("bad",))
    out = s.run()
    ends = {e.job_id: e.reason for e in of_type(out, JobCancelled)}
    assert ends == {"x": f"{NEVER_SATISFIED}: job nope does not exist", "y": f"{NEVER_SATISFIED}: job bad rejected"}
    assert "z" in _reserved(out)


def test_an_array_never_holds_more_than_its_limit() -> None:
    s = _sim()
    ids = _array(s, "arr", 5, 2)
    out = s.run()
    assert _reserved(out) == {"arr_0", "arr_1"}
    assert gate_reason(s.state, s.job("arr_2")) == "array 0-4%2: 2 running"
    s.finish("arr_0")
    assert _reserved(s.run()) == {"arr_2"}
    # Holding a pending element gives its slot to the next; it waits for its release, then a slot.
    s.finish("arr_1")
    s.finish("arr_2")
    _hold(s, "arr_3")
    assert _reserved(s.run()) == {"arr_4"}
    _release(s, "arr_3")
    assert _reserved(s.run()) == {"arr_3"}
    assert [s.job(j).status for j in ids] == ["completed"] * 3 + ["running"] * 2


def test_a_requeued_element_keeps_its_slot() -> None:
    s = _sim()
    _array(s, "arr", 3, 1)
    s.run()
    s.fail_node(s.job("arr_0").placement[0].node_id)
    out = s.run()
    assert _reserved(out) <= {"arr_0"}
    assert sum(1 for j in ("arr_0", "arr_1", "arr_2") if s.job(j).status in HOLDING) <= 1


def test_gated_jobs_get_no_pending_reason_and_survive_a_snapshot() -> None:
    s = _sim(nodes=1)
    _array(s, "arr", 4, 1)
    _submit(s, "h", hold=True)
    _submit(s, "d", after_any=("arr_3",))
    out = s.run()
    told = {e.job_id for e in of_type(out, JobWaiting)}
    assert not told & {"arr_1", "arr_2", "arr_3", "h", "d"}
    back = restore(snapshot(s.state))
    assert snapshot(back) == snapshot(s.state)
    assert set(back.gated) == {"arr_1", "arr_2", "arr_3", "h", "d"}


def test_a_log_without_gates_folds_as_before() -> None:
    """No gate field is written for a job without gates: its JobSubmitted has no `gates` key."""
    from schemas import encode

    e = JobSubmitted(event_id="e", occurred_at=1.0, job_id="j", spec=JobSpec(name="j"))
    assert b"gates" not in encode(e)


# --- properties ----------------------------------------------------------------------------------


_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.integers(1, 4), st.integers(0, 30), st.integers(0, 30), st.booleans()),
        st.tuples(st.just("array"), st.integers(2, 6), st.integers(0, 3)),
        st.tuples(st.just("arraydep"), st.integers(0, 10), st.booleans(), st.booleans()),
        st.tuples(st.just("hold"), st.integers(0, 60)),
        st.tuples(st.just("release"), st.integers(0, 60)),
        st.tuples(st.just("cancel"), st.integers(0, 60)),
        st.tuples(st.just("finish"), st.integers(0, 60)),
        st.tuples(st.just("crash"), st.integers(0, 60)),
        st.tuples(st.just("node"), st.integers(0, 3), st.booleans()),
        st.just(("decide",)),
        st.just(("agents",)),
        st.tuples(st.just("tick"), st.integers(1, 120)),
        st.tuples(st.just("stale"), st.integers(0, 60)),
        st.tuples(st.just("prio"), st.integers(1, 8)),
    ),
    max_size=60,
)


class Checker:
    """What the test itself records of the log: holds, dependencies, arrays (independent of gating.py)."""

    def __init__(self) -> None:
        self.held: set[str] = set()
        self.deps: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
        self.arrays: dict[str, tuple[int, list[str]]] = {}
        #: Every array's elements, and the jobs that depend on whole arrays: (array, after-ok?).
        self.members: dict[str, list[str]] = {}
        self.array_deps: dict[str, tuple[str, bool]] = {}

    def before(self, s: Sim, e: AnyEvent) -> None:
        """Check a GangReserved against the log so far, before it is folded (a void one changes nothing)."""
        if not isinstance(e, GangReserved):
            return
        if reservation_problem(s.state, e) is not None:
            return
        assert e.job_id not in self.held, f"held job {e.job_id} placed"
        ok, any_ = self.deps.get(e.job_id, ((), ()))
        for t in ok:
            assert s.state.jobs[t].status == "completed", f"{e.job_id} placed before {t} completed"
        for t in any_:
            assert s.state.jobs[t].status in TERMINAL, f"{e.job_id} placed before {t} ended"
        if e.job_id in self.array_deps:
            arr, ok_ = self.array_deps[e.job_id]
            done = {s.state.jobs[j].status for j in self.members[arr]}
            assert done <= ({"completed"} if ok_ else TERMINAL), f"{e.job_id} placed before array {arr}: {done}"

    def after(self, s: Sim) -> None:
        for limit, members in self.arrays.values():
            holding = [j for j in members if s.state.jobs[j].status in HOLDING]
            assert len(holding) <= limit, f"array over its limit {limit}: {holding}"
        # A job waiting for an array waits exactly while the array's verdict is not in, and is doomed once an
        # element ended other than completed under after-ok (never only after the rest ran).
        for jid, (arr, ok_) in self.array_deps.items():
            job = s.state.jobs[jid]
            if job.status != "pending":
                continue
            ends = [s.state.jobs[j].status for j in self.members[arr]]
            failed = ok_ and any(x in TERMINAL and x != "completed" for x in ends)
            assert bool(job.doomed) == failed, (jid, arr, ends, job.doomed)
            assert (arr in job.blocked_on_arrays) == (not failed and not all(x in TERMINAL for x in ends)), (
                jid, arr, ends)


class GatedSim(Sim):
    """The harness, checking every event against the Checker before it is folded."""

    def __init__(self, policies: Policies) -> None:
        self.chk = Checker()
        super().__init__(policies=policies)

    def emit(self, event: AnyEvent) -> None:
        self.chk.before(self, event)
        super().emit(event)
        if isinstance(event, JobHeld) and (job := self.state.jobs.get(event.job_id)) is not None and job.held:
            self.chk.held.add(event.job_id)
        if isinstance(event, JobReleased):
            self.chk.held.discard(event.job_id)


def _pick(ids: list[str], i: int) -> str:
    return ids[i % len(ids)] if ids else "none"


@pytest.mark.parametrize("policy", ["corral", "las"])  # las: its own line order (Policies.job_key)
@settings(max_examples=100, deadline=None)
@given(ops=_OPS)
def test_gates_are_never_passed(policy: str, ops: list[tuple[Any, ...]]) -> None:
    s = GatedSim(policies_for(policy))
    s.node("n0", gpus=8)
    s.node("n1", gpus=8)
    chk = s.chk
    n = 0
    for op in ops:
        ids = list(s.state.jobs)
        kind = op[0]
        if kind == "submit":
            n += 1
            jid = f"j{n}"
            ok = (_pick(ids, op[2]),) if op[2] % 3 == 0 else ()
            any_ = (_pick(ids, op[3]),) if op[3] % 3 == 0 else ()
            _submit_gated(s, jid, op[1], ok, any_, op[4])
            chk.deps[jid] = (ok, any_)
            if op[4]:
                chk.held.add(jid)
        elif kind == "array":
            n += 1
            members = _array(s, f"a{n}", op[1], op[2])
            chk.members[f"a{n}"] = members
            if op[2] > 0:
                chk.arrays[f"a{n}"] = (op[2], members)
        elif kind == "arraydep" and chk.members:
            n += 1
            arr = _pick(sorted(chk.members), op[1])
            gates = Gates(after_ok_arrays=(arr,)) if op[2] else Gates(after_any_arrays=(arr,))
            s.emit(JobSubmitted(event_id=s.eid(), occurred_at=s.now, job_id=f"d{n}",
                                spec=JobSpec(name="d", gpus_per_rank=1 + op[3], restart_policy="never",
                                             gates=gates)))
            chk.array_deps[f"d{n}"] = (arr, op[2])
        elif kind == "hold":
            _hold(s, _pick(ids, op[1]))
        elif kind == "release":
            _release(s, _pick(ids, op[1]))
        elif kind == "cancel" and ids:
            s.cancel(_pick(ids, op[1]))
        elif kind in ("finish", "crash") and ids:
            jid = _pick(ids, op[1])
            job = s.job(jid)
            if job.status in ("running", "reserved") and job.started == job.spec.ranks:
                s.exit(jid, code=0 if kind == "finish" else 1, reason="completed" if kind == "finish" else "crashed")
        elif kind == "node":
            nid = f"n{op[1] % 2}"
            if op[2]:
                s.fail_node(nid)
            else:
                s.recover_node(nid)
        elif kind == "decide":
            s.decide()
        elif kind == "agents":
            play_agents(s)
        elif kind == "tick":
            s.tick(op[1])
        elif kind == "stale":
            # Decided, then a hold lands before the decisions: they must not pass the hold.
            decided = decide(s.state, s.now, epoch=s.epoch, policies=s.policies)
            named = [getattr(e, "preemptor_job_id", None) or e.job_id  # type: ignore[attr-defined]
                     for e in decided if isinstance(e, (GangReserved, JobWaiting, PreemptionRequested))]
            _hold(s, _pick(named or ids, op[1]))
            for e in decided:
                s.emit(e)  # type: ignore[arg-type]
        elif kind == "prio":
            # A high-priority gang that may preempt the running ones (its earmark must not outlive a hold).
            n += 1
            s.submit(f"p{n}", gpus_per_rank=op[1], priority=100, restart_policy="never")
        chk.after(s)
        check_invariants(s.state)
        _check_gate_indexes(s)
    # Folding the same log again gives the same state.
    state = ClusterState()
    for e in s.log:
        evolve(state, e)
    assert snapshot(state) == snapshot(s.state)


def _submit_gated(s: Sim, jid: str, gpus: int, ok: tuple[str, ...], any_: tuple[str, ...], hold: bool) -> None:
    s.emit(JobSubmitted(event_id=s.eid(), occurred_at=s.now, job_id=jid,
                        spec=JobSpec(name=jid, gpus_per_rank=gpus, restart_policy="never",
                                     gates=Gates(after_ok=ok, after_any=any_, hold=hold))))


def _check_gate_indexes(s: Sim) -> None:
    st_ = s.state
    assert set(st_.gated) <= set(st_.pending)
    for jid in st_.pending:
        job = st_.jobs[jid]
        if job.held or job.blocked_on or job.doomed:
            assert jid in st_.gated, f"{jid} blocked but in its line"
    assert set(st_.doomed) <= set(st_.gated)
    assert not set(st_.holders) & set(st_.gated), "a gated job holds a backfill reservation"
    marked = {j for marks in st_.earmarks.values() for j in marks if j}
    assert not marked & set(st_.gated), "GPUs earmarked for a gated job"
    for arr, slots in st_.array_slots.items():
        for jid in slots:
            job = st_.jobs[jid]
            assert (job.status == "pending" and jid not in st_.gated) or job.status in HOLDING, (arr, jid)


def test_a_failed_dependency_cascades_through_decide() -> None:
    """JobFailed of the job depended on: every after-ok job behind it ends, after-any ones run."""
    s = _sim()
    s.submit("a", gpus_per_rank=1, restart_policy="never")
    _submit(s, "b", after_ok=("a",))
    s.run()
    s.emit(JobFailed(event_id=s.eid(), occurred_at=s.now, job_id="a", attempt=1, reason="x"))
    assert set(s.state.doomed) == {"b"}
    s.run()
    assert s.job("b").status == "cancelled" and not s.state.doomed and "b" not in s.state.pending
