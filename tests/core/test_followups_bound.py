"""One cycle's follow-ups are bounded, and every attempt that ran says so in the log (issue #40).

`Policies.followups_per_cycle` (core/react.py): a mass NodeFailed once made one call requeue every
gang it hit (4,239 events at 4,096 nodes: bench/followups.py). Past the cap the rest wait for the
next calls, the requeues oldest gang first, and a capped call decides nothing else. A gang whose
ranks started and ended between two cycles gets its JobRunning before its end. A burst whose
placements stop at `placements_per_cycle` tells the new jobs it did not judge nothing, so no job
is told it waits at the instant it is placed.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.core.decide import Decision, decide_cycle
from orchestrator.core.model.facts import SETTLE_S
from orchestrator.core.model.state import Job
from orchestrator.policies import DEFAULT_POLICIES, Policies
from orchestrator.policies.reject import unfit_reasons
from schemas.events import (
    CancelRequested,
    Event,
    GangReserved,
    GangRestarted,
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobRejected,
    JobRequeued,
    JobRunning,
    JobWaiting,
    Preempted,
    PreemptionRequested,
    WorkerStarted,
)
from tests.core.harness import Sim, of_type
from tests.core.strategies import PROFILE
from tests.core.test_properties import check_invariants

#: What stage 1 (core/react.py) appends.
FOLLOW_UPS = (JobRequeued, JobRunning, JobCompleted, JobFailed, JobCancelled, Preempted, GangRestarted,
              CancelRequested)


def call(s: Sim) -> Decision:
    """One decide call at the harness's `now`, folded (never void), with the orders and the agents' answers."""
    d = decide_cycle(s.state, s.now, epoch=s.epoch, policies=s.policies, memo=s.memo)
    for e in d.events:
        before = s.state.voids
        s.emit(e)  # type: ignore[arg-type]
        assert s.state.voids == before, f"decide emitted a void decision: {s.state.last_void}"
    s.orders()
    s.agents(d.events)
    return d


def settled(policies: Policies = DEFAULT_POLICIES, nodes: int = 4) -> Sim:
    s = Sim(policies=policies)
    for n in range(nodes):
        s.node(f"n{n:02}")
    s.tick(SETTLE_S + 1)
    return s


def running_gangs(s: Sim) -> list[Job]:
    return [j for j in s.state.jobs.values() if j.status in ("reserved", "running")]


@given(
    node_count=st.integers(2, 24),
    shapes=st.lists(st.tuples(st.integers(1, 3), st.sampled_from([1, 2, 4, 8])), min_size=4, max_size=60),
    failing=st.data(),
    cap=st.integers(1, 12),
    cancels=st.integers(0, 6),
    finishing=st.integers(0, 6),
)
@PROFILE
def test_a_mass_node_failure_requeues_every_hit_gang_over_bounded_cycles_oldest_first(
    node_count: int, shapes: list[tuple[int, int]], failing: Any, cap: int, cancels: int, finishing: int
) -> None:
    s = settled(replace(DEFAULT_POLICIES, followups_per_cycle=cap), nodes=node_count)
    for i, (ranks, per_rank) in enumerate(shapes):
        s.submit(f"j{i:03}", ranks=ranks, gpus_per_rank=per_rank, preemptible=False)
    for _ in range(200):  # fill the cluster: every placed gang running
        if not call(s).events:
            break
    held = running_gangs(s)
    failed = failing.draw(st.sets(st.sampled_from([f"n{n:02}" for n in range(node_count)]), min_size=1))
    hit = {j.job_id: j.attempt for j in held if any(rp.node_id in failed for rp in j.placement)}
    pending = [jid for jid in s.state.pending][:cancels]
    s.tick(5.0)
    for nid in sorted(failed):
        s.fail_node(nid)
    for jid in pending:
        s.cancel(jid)  # ends of pending jobs compete for the same cycles
    done = [j.job_id for j in held if j.job_id not in hit][:finishing]
    for jid in done:
        s.finish(jid)  # and completions, which go first
    requeued: list[list[str]] = []
    for _ in range(400):
        d = call(s)
        check_invariants(s.state)
        follow = [e for e in d.events if isinstance(e, FOLLOW_UPS)]
        assert len(follow) <= cap + 1  # a JobRunning is never parted from the end it precedes
        requeued.append([e.job_id for e in of_type(d.events, JobRequeued)])
        if not d.events:
            break
    flat = [j for r in requeued for j in r]
    assert sorted(flat) == sorted(hit)  # none lost, none twice
    for jid, attempt in hit.items():
        assert s.job(jid).attempt == attempt + 1
    seq = {jid: s.job(jid).submit_seq for jid in hit}
    batches = [r for r in requeued if r]
    for a, b in pairwise(batches):
        assert max(seq[j] for j in a) < min(seq[j] for j in b)  # oldest first, across calls
    for jid in pending:
        assert s.job(jid).status == "cancelled"
    for jid in done:
        assert s.job(jid).status == "completed"
    if len(hit) > cap:
        assert len(batches) > 1


def test_a_capped_cycle_decides_nothing_else_and_is_not_complete() -> None:
    s = settled(replace(DEFAULT_POLICIES, followups_per_cycle=2), nodes=1)
    for i in range(4):
        s.submit(f"a{i}", gpus_per_rank=2)
    call(s)  # all four placed and started
    assert [type(e) for e in call(s).events] == [JobRunning, JobRunning]  # two per call
    assert [type(e) for e in call(s).events] == [JobRunning, JobRunning]
    assert all(s.job(f"a{i}").status == "running" for i in range(4))
    for i in range(4):
        s.finish(f"a{i}")
    s.submit("next", gpus_per_rank=8)
    d = call(s)
    assert [type(e) for e in d.events] == [JobCompleted, JobCompleted]
    assert d.more and not d.complete
    d = call(s)
    assert [type(e) for e in d.events] == [JobCompleted, JobCompleted, GangReserved]
    assert s.job("next").status == "reserved"


def test_a_gang_that_started_and_ended_between_two_cycles_gets_its_jobrunning_first() -> None:
    s = settled(nodes=1)
    s.submit("short", ranks=2, gpus_per_rank=1)
    s.decide()
    s.tick(1.0)
    s.start("short")
    started = s.now
    s.tick(2.0)
    s.finish("short")  # no cycle between its start and its end
    s.tick(3.0)
    events = s.decide()
    assert [type(e) for e in events] == [JobRunning, JobCompleted]
    assert events[0].occurred_at == started  # dated when its last rank started
    assert s.job("short").status == "completed" and s.job("short").running_at == started


def test_a_failed_attempt_that_ran_is_shown_running_and_one_that_never_started_is_not() -> None:
    s = settled(nodes=1)
    s.submit("crash", gpus_per_rank=1, restart_policy="never")
    s.submit("never", gpus_per_rank=1, restart_policy="never")
    s.decide()
    s.start("crash")
    s.exit("crash", code=1, reason="failed")
    s.exit("never", code=None, reason="unstartable")  # it could not start: it never ran
    events = s.decide()
    assert [(type(e), getattr(e, "job_id", "")) for e in events] == [(JobRunning, "crash"), (JobFailed, "crash"),
                                                      (JobFailed, "never")]


def test_a_gang_on_a_failed_node_that_ran_unseen_says_so_before_its_requeue() -> None:
    s = settled(nodes=2)
    s.submit("g", ranks=2, gpus_per_rank=8)
    s.decide()
    s.start("g")
    s.fail_node("n00")
    events = s.decide()
    assert [type(e) for e in events[:2]] == [JobRunning, JobRequeued]
    assert s.job("g").attempt == 2


def test_one_rank_short_of_a_start_gets_no_jobrunning() -> None:
    s = settled(nodes=1)
    s.submit("half", ranks=2, gpus_per_rank=1, restart_policy="never")
    s.decide()
    rank0 = s.job("half").placement[0]
    s.emit(WorkerStarted(event_id=s.eid(), occurred_at=s.now, job_id="half", attempt=1, rank=0, node_id=rank0.node_id))
    s.exit("half", rank=0, code=1, reason="failed")
    s.exit("half", rank=1, code=None, reason="unstartable")
    assert not of_type(s.decide(), JobRunning)


def test_a_capped_burst_tells_no_job_it_waits_in_the_instant_it_is_placed() -> None:
    checks: list[str] = []

    def counting(job: Job, facts: Any) -> tuple[str, ...]:
        checks.append(job.job_id)
        return unfit_reasons(job, facts)

    s = settled(replace(DEFAULT_POLICIES, placements_per_cycle=3, reject=counting), nodes=2)
    ids = [f"j{i:02}" for i in range(20)]
    for jid in ids:
        s.submit(jid, gpus_per_rank=1)  # 16 fit at once, 4 wait
    told: dict[str, list[type[Event]]] = {}
    for _ in range(20):
        d = call(s)
        for e in d.events:
            if isinstance(e, (JobWaiting, GangReserved, JobRejected)):
                told.setdefault(e.job_id, []).append(type(e))
        if not d.more:
            break
    placed = [jid for jid in ids if s.job(jid).status in ("reserved", "running")]
    assert len(placed) == 16
    for jid in placed:
        assert told[jid] == [GangReserved]  # not told it waits in the instant it was placed
    for jid in ids:
        if jid not in placed:
            assert told[jid] == [JobWaiting]  # the others are told, at the same instant
            assert not s.state.unexplained
    assert sorted(checks) == ids  # each new job checked once, though the capped calls left it new


def test_a_pending_job_asked_to_stop_while_its_end_waits_is_never_placed() -> None:
    s = settled(replace(DEFAULT_POLICIES, followups_per_cycle=1), nodes=1)
    for i in range(3):
        s.submit(f"p{i}", gpus_per_rank=8)
    call(s)  # p0 placed and started, p1 and p2 wait
    s.finish("p0")  # its end, with its JobRunning, fills a cycle; the cancels' ends wait their turn
    s.cancel("p1")
    s.cancel("p2")
    for _ in range(10):
        if not call(s).events:
            break
    assert s.job("p1").status == "cancelled" and s.job("p2").status == "cancelled"
    assert not of_type(s.log, GangReserved)[1:]


def test_a_preemption_victim_cut_short_by_the_cap_ends_in_a_later_cycle() -> None:
    s = settled(replace(DEFAULT_POLICIES, followups_per_cycle=1), nodes=1)
    s.submit("low", gpus_per_rank=8, priority=0)
    call(s)
    call(s)
    s.submit("high", gpus_per_rank=8, priority=5)
    events = [e for _ in range(10) for e in call(s).events]
    assert of_type(events, PreemptionRequested) and of_type(events, Preempted)
    assert s.job("high").status in ("reserved", "running")
