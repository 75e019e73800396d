"""A burst of new jobs is checked and explained a bounded batch per cycle; no job loses its place for it.

Issue #34: one call met 50,000 new jobs and checked and explained them all
(1.3 CPU s holding the scheduler's loop past its lease). `Policies.fresh_per_cycle`
bounds it (core/backlog.py); these tests pin what the bound must not break.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from orchestrator.core.decide import decide_cycle
from orchestrator.core.model.facts import SETTLE_S
from orchestrator.policies import DEFAULT_POLICIES, Policies
from schemas.events import Event, GangReserved, JobRejected, JobWaiting
from tests.core.harness import Sim, of_type


def judged(events: list[Event]) -> list[str]:
    return [e.job_id for e in events if isinstance(e, (JobWaiting, GangReserved, JobRejected))]


def settled_sim(policies: Policies, nodes: int = 1) -> Sim:
    s = Sim(policies=policies)
    for n in range(nodes):
        s.node(f"n{n}")
    s.tick(SETTLE_S + 1)  # capacity verdicts are due at once
    return s


def test_a_burst_is_explained_in_bounded_batches_in_arrival_order() -> None:
    # One blocked head per cycle: admission itself meets j0-j2 only.
    s = settled_sim(replace(DEFAULT_POLICIES, fresh_per_cycle=3, heads_per_queue=1), nodes=2)
    ids = [f"j{i}" for i in range(10)]
    for jid in ids:
        s.submit(jid, gpus_per_rank=8)
    seen: list[list[str]] = []
    for n in range(4):
        cycle = decide_cycle(s.state, s.now, epoch=s.epoch, policies=s.policies, memo=s.memo)
        s.emit_all(cycle.events)  # type: ignore[arg-type]
        seen.append(sorted(judged(cycle.events)))
        assert cycle.more == (n < 3)
        assert not (cycle.more and cycle.complete)
    assert seen == [ids[0:3], ids[3:6], ids[6:9], ids[9:]]
    assert not s.state.unexplained
    assert [s.job(j).status for j in ids[:2]] == ["reserved", "reserved"]


def test_a_head_past_the_batch_is_checked_where_admission_meets_it() -> None:
    s = settled_sim(replace(DEFAULT_POLICIES, fresh_per_cycle=1))
    s.submit("a0", gpus_per_rank=1)
    s.submit("never", ranks=2, gpus_per_rank=8, priority=3)  # 16 GPUs on one 8-GPU node: can never fit
    s.submit("fits", gpus_per_rank=1, priority=5)  # the line's head, submitted last
    events = s.decide()
    # Not in the batch (a0 is), yet rejected, not told "capacity" (which would spare it the check for good).
    assert [e.job_id for e in of_type(events, JobRejected)] == ["never"]
    assert s.job("never").status == "rejected"
    assert sorted(e.job_id for e in of_type(events, GangReserved)) == ["a0", "fits"]


def test_the_bound_moves_no_placement() -> None:
    """The same workload, bound 2 and unbounded: the same gangs start in the same cycles."""

    def starts(policies: Policies) -> list[list[str]]:
        s = settled_sim(policies, nodes=2)
        for i in range(24):
            s.submit(f"j{i:02d}", gpus_per_rank=1 + i % 8, priority=i % 3, preemptible=False)
        out: list[list[str]] = []
        for _ in range(60):
            events = s.decide()
            s.agents(events)
            out.append([e.job_id for e in of_type(events, GangReserved)])
            running = sorted((j for j in s.state.jobs.values() if j.status == "running"), key=lambda j: j.job_id)
            if running:
                s.finish(running[0].job_id)
            s.tick(5.0)
        assert all(j.status == "completed" for j in s.state.jobs.values())
        return out

    assert starts(replace(DEFAULT_POLICIES, fresh_per_cycle=2, heads_per_queue=2)) == starts(
        replace(DEFAULT_POLICIES, heads_per_queue=2))


def test_under_the_bound_every_new_job_is_explained_in_one_cycle() -> None:
    s = settled_sim(replace(DEFAULT_POLICIES, fresh_per_cycle=3, heads_per_queue=1), nodes=1)
    for i in range(3):
        s.submit(f"j{i}", gpus_per_rank=8)
    cycle = decide_cycle(s.state, s.now, epoch=s.epoch, policies=s.policies, memo=s.memo)
    assert sorted(judged(cycle.events)) == ["j0", "j1", "j2"] and not cycle.more


def test_placements_stop_at_the_cap_and_the_next_cycle_goes_on_in_the_same_order() -> None:
    def placed(policies: Policies) -> list[list[str]]:
        s = settled_sim(policies, nodes=2)
        s.queue("a")
        s.queue("b")
        for i in range(12):
            s.submit(f"j{i:02d}", gpus_per_rank=1 + i % 3, queue="ab"[i % 2], priority=i % 4)
        out: list[list[str]] = []
        for _ in range(8):
            cycle = decide_cycle(s.state, s.now, epoch=s.epoch, policies=s.policies, memo=s.memo)
            s.emit_all(cycle.events)  # type: ignore[arg-type]
            s.agents(cycle.events)
            out.append([e.job_id for e in of_type(cycle.events, GangReserved)])
            assert not (cycle.more and cycle.complete)
            if not cycle.more:
                break
        return [ids for ids in out if ids]

    capped = placed(replace(DEFAULT_POLICIES, placements_per_cycle=3))
    whole = placed(DEFAULT_POLICIES)
    assert [len(ids) for ids in capped] == [3, 3, 3] and len(whole) == 1 and len(whole[0]) == 9
    assert [j for ids in capped for j in ids] == whole[0]


def test_a_bound_below_one_is_refused() -> None:
    for name in ("fresh_per_cycle", "placements_per_cycle"):
        with pytest.raises(ValueError, match=name):
            replace(DEFAULT_POLICIES, **{name: 0})
