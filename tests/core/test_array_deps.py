"""Dependencies on a whole job array (orchestrator/core/array_deps.py): one dependency, settled from counters.

The property test drives arrays, jobs that depend on them, element ends of every
kind, restarts and decide cycles in random orders, and checks with its own
bookkeeping (not the fold's counters): a dependent is placed only once every
element completed (after-ok) or ended (after-any); it is doomed exactly when an
element ended otherwise under after-ok, and blocked exactly while the verdict
is not in; the counters restored from a snapshot and those of a replay agree.
"""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core.evolve import evolve
from orchestrator.core.evolve_jobs import reservation_problem
from orchestrator.core.gating import INVALID_SPEC, NEVER_SATISFIED, gate_reason
from orchestrator.core.model.arrays import ArrayTally
from orchestrator.core.model.state import TERMINAL, ClusterState, restore, snapshot
from schemas.events import AnyEvent, GangReserved, JobCancelled, JobRejected, JobSubmitted
from schemas.jobspec import ArrayElement, Gates, JobSpec
from tests.core.harness import Sim, of_type
from tests.core.test_properties import play_agents


def _sim(nodes: int = 2) -> Sim:
    s = Sim()
    for i in range(nodes):
        s.node(f"n{i}", gpus=8)
    return s


def _array(s: Sim, aid: str, n: int, *, count: int | None = None, submit: int | None = None) -> list[str]:
    ids = [f"{aid}_{i}" for i in range(n)]
    for i, jid in enumerate(ids[:submit]):
        el = ArrayElement(array_id=aid, index=i, indexes=f"0-{n - 1}", count=n if count is None else count)
        s.submit(jid, gpus_per_rank=1, restart_policy="never", gates=Gates(array=el))
    return ids


def _dep(s: Sim, jid: str, gpus: int = 1, **gates: Any) -> None:
    s.submit(jid, gpus_per_rank=gpus, restart_policy="never", gates=Gates(**gates))


def _reserved(events: list[Any]) -> set[str]:
    return {e.job_id for e in of_type(events, GangReserved)}


def test_after_ok_on_an_array_waits_for_every_element_and_says_how_far() -> None:
    s = _sim()
    ids = _array(s, "A", 5)
    _dep(s, "d", after_ok_arrays=("A",))
    _dep(s, "e", after_any_arrays=("A",))
    assert _reserved(s.run()) == set(ids)
    assert gate_reason(s.state, s.job("d")) == "waiting for array A to complete ok: 0 of 5 tasks done"
    for jid in ids[:4]:
        s.finish(jid)
    assert not _reserved(s.run())
    assert gate_reason(s.state, s.job("e")) == "waiting for array A to end: 4 of 5 tasks done"
    s.finish(ids[4])
    assert _reserved(s.run()) == {"d", "e"}
    assert s.state.arrays["A"] == ArrayTally(declared=5, submitted=5, ended=5, succeeded=5)
    assert "A" not in s.state.array_dependents  # every dependent settled: nothing left to look at


def test_a_failed_element_ends_an_after_ok_dependent_at_once() -> None:
    s = _sim()
    ids = _array(s, "A", 4)
    _dep(s, "d", after_ok_arrays=("A",))
    _dep(s, "e", after_any_arrays=("A",))
    s.run()
    s.exit(ids[2], code=1, reason="crashed")
    out = s.run()
    ends = {e.job_id: e.reason for e in of_type(out, JobCancelled)}
    assert ends == {"d": f"{NEVER_SATISFIED}: array A: task A_2 failed"}  # not after the 3 others ran
    assert s.job("e").status == "pending"
    for jid in (ids[0], ids[1], ids[3]):
        s.finish(jid)
    assert _reserved(s.run()) == {"e"}
    # Submitted once the verdict is in: at once, either way.
    _dep(s, "late-ok", after_ok_arrays=("A",))
    _dep(s, "late-any", after_any_arrays=("A",))
    out = s.run()
    assert {e.job_id for e in of_type(out, JobCancelled)} == {"late-ok"} and "late-any" in _reserved(out)


def test_an_unknown_array_and_an_elements_own_array_are_never_satisfied() -> None:
    s = _sim()
    _dep(s, "x", after_ok_arrays=("nope",))
    el = ArrayElement(array_id="B", index=0, indexes="0-1", count=2)
    s.submit("B_0", gpus_per_rank=1, gates=Gates(array=el, after_any_arrays=("B",)))
    out = s.run()
    ends = {e.job_id: e.reason for e in of_type(out, JobCancelled)}
    assert ends == {"x": f"{NEVER_SATISFIED}: array nope does not exist",
                    "B_0": f"{NEVER_SATISFIED}: array B is its own array"}


def test_the_declared_count_is_waited_for_even_before_every_element_is_submitted() -> None:
    s = _sim()
    ids = _array(s, "A", 3, submit=2)
    _dep(s, "d", after_any_arrays=("A",))
    s.run()
    s.finish(ids[0])
    s.finish(ids[1])
    s.run()
    assert gate_reason(s.state, s.job("d")) == "waiting for array A to end: 2 of 3 tasks done, 2 submitted"
    s.submit(ids[2], gpus_per_rank=1, gates=Gates(array=ArrayElement(array_id="A", index=2, count=3)))
    s.run()
    s.finish(ids[2])
    assert "d" in _reserved(s.run())


def test_a_dependency_on_a_2000_task_array_is_one_reference_and_too_many_are_rejected_at_once() -> None:
    s = _sim()
    ids = _array(s, "big", 2000)
    _dep(s, "one", after_ok_arrays=("big",))
    _dep(s, "many", after_ok=tuple(ids))  # the old way: 2,000 job ids, over the limit
    out = s.decide()
    rejected = {e.job_id: e.reasons for e in of_type(out, JobRejected)}
    assert list(rejected) == ["many"], rejected  # now, not after the array ran
    (reason,) = rejected["many"]
    assert reason.startswith(f"{INVALID_SPEC}gates.after_ok: must name at most 1000 job ids, got 2000")
    assert "name the array's id" in reason
    assert s.job("one").status == "pending" and s.job("one").blocked_on_arrays == ("big",)
    assert not s.state.dependents  # no 2,000 edges: one reference, counters
    assert s.state.array_dependents == {"big": ("one",)}


def test_counters_survive_a_snapshot_and_an_old_snapshot_counts_its_arrays() -> None:
    s = _sim()
    ids = _array(s, "A", 3)
    _dep(s, "d", after_ok_arrays=("A",))
    s.run()
    s.finish(ids[0])
    s.exit(ids[1], code=1, reason="crashed")
    s.run()
    back = restore(snapshot(s.state))
    assert snapshot(back) == snapshot(s.state)
    # A snapshot written before arrays were counted has no `arrays`: counted again from its jobs on load.
    old = msgspec.msgpack.decode(snapshot(s.state))
    del old["arrays"], old["array_dependents"]
    rebuilt = restore(msgspec.msgpack.encode(old))
    assert rebuilt.arrays == s.state.arrays


def test_a_log_from_before_counts_folds_as_before() -> None:
    """An element without `count` (older clients) counts the elements submitted, and encodes without it."""
    from schemas import encode

    el = ArrayElement(array_id="A", index=0, indexes="0-1")
    assert b"count" not in encode(JobSubmitted(event_id="e", occurred_at=1.0, job_id="A_0",
                                               spec=JobSpec(name="x", gates=Gates(array=el))))
    s = _sim()
    for i in range(2):
        s.submit(f"A_{i}", gpus_per_rank=1, gates=Gates(array=ArrayElement(array_id="A", index=i)))
    assert s.state.arrays["A"].total == 2


# --- properties ----------------------------------------------------------------------------------

_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("array"), st.integers(1, 5), st.integers(0, 2)),
        st.tuples(st.just("dep"), st.integers(0, 9), st.booleans(), st.booleans()),
        st.tuples(st.just("end"), st.integers(0, 40), st.sampled_from(["ok", "fail", "cancel"])),
        st.tuples(st.just("late"), st.integers(0, 9)),
        st.just(("decide",)),
        st.just(("agents",)),
        st.just(("restore",)),
    ),
    max_size=50,
)


class Watch:
    """The test's own record: each array's elements, each dependent's array and kind."""

    def __init__(self) -> None:
        self.members: dict[str, list[str]] = {}
        self.unsubmitted: dict[str, list[tuple[int, str]]] = {}
        self.deps: dict[str, tuple[str, bool]] = {}

    def ends(self, s: Sim, aid: str) -> list[str]:
        return [s.state.jobs[j].status if j in s.state.jobs else "unsubmitted" for j in self.members[aid]]

    def before(self, s: Sim, e: AnyEvent) -> None:
        if isinstance(e, GangReserved) and e.job_id in self.deps and reservation_problem(s.state, e) is None:
            aid, ok = self.deps[e.job_id]
            done = set(self.ends(s, aid))
            assert done <= ({"completed"} if ok else TERMINAL), f"{e.job_id} placed before array {aid}: {done}"

    def after(self, s: Sim) -> None:
        for jid, (aid, ok) in self.deps.items():
            job = s.state.jobs[jid]
            if job.status != "pending":
                continue
            ends = self.ends(s, aid)
            failed = ok and any(x in TERMINAL and x != "completed" for x in ends)
            assert bool(job.doomed) == failed, (jid, aid, ends, job.doomed)
            waiting = not failed and not all(x in TERMINAL for x in ends)
            assert (aid in job.blocked_on_arrays) == waiting, (jid, aid, ends)


class WatchedSim(Sim):
    def __init__(self) -> None:
        self.watch = Watch()
        super().__init__()

    def emit(self, event: AnyEvent) -> None:
        self.watch.before(self, event)
        super().emit(event)


@settings(max_examples=150, deadline=None)
@given(ops=_OPS)
def test_array_dependencies_hold_whatever_the_order(ops: list[tuple[Any, ...]]) -> None:
    s = WatchedSim()
    s.node("n0", gpus=8)
    s.node("n1", gpus=8)
    w = s.watch
    n = 0
    for op in ops:
        kind = op[0]
        arrays = sorted(w.members)
        if kind == "array":
            n += 1
            aid = f"a{n}"
            now = max(1, op[1] - op[2])  # the rest are submitted later ("late"); an array exists from its first
            ids = _array(s, aid, op[1], submit=now)
            w.members[aid] = ids
            w.unsubmitted[aid] = [(i, ids[i]) for i in range(now, op[1])]
        elif kind == "dep" and arrays:
            n += 1
            aid = arrays[op[1] % len(arrays)]
            _dep(s, f"d{n}", 1 + 7 * op[3], **({"after_ok_arrays": (aid,)} if op[2] else {"after_any_arrays": (aid,)}))
            w.deps[f"d{n}"] = (aid, op[2])
        elif kind == "late" and arrays:
            aid = arrays[op[1] % len(arrays)]
            if w.unsubmitted[aid]:
                i, jid = w.unsubmitted[aid].pop(0)
                el = ArrayElement(array_id=aid, index=i, count=len(w.members[aid]))
                s.submit(jid, gpus_per_rank=1, restart_policy="never", gates=Gates(array=el))
        elif kind == "end":
            live = [j for j in s.state.jobs if s.state.jobs[j].status not in TERMINAL]
            if live:
                jid = live[op[1] % len(live)]
                job = s.state.jobs[jid]
                if op[2] == "cancel":
                    s.cancel(jid)
                elif job.status == "running" and job.started == job.spec.ranks:
                    s.exit(jid, code=0 if op[2] == "ok" else 1, reason="completed" if op[2] == "ok" else "crashed")
        elif kind == "decide":
            s.decide()
        elif kind == "agents":
            play_agents(s)
        elif kind == "restore":  # what a restarted scheduler starts from
            back = restore(snapshot(s.state))
            assert (back.arrays, back.array_dependents) == (s.state.arrays, s.state.array_dependents)
            assert {j: b.blocked_on_arrays for j, b in back.jobs.items()} == {
                j: b.blocked_on_arrays for j, b in s.state.jobs.items()}
        w.after(s)
    state = ClusterState()
    for e in s.log:
        evolve(state, e)
    assert snapshot(state) == snapshot(s.state)
