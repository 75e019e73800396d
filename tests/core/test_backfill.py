"""Backfill: a big gang holds what it will start on; short jobs may slip in front, long ones may not."""

from __future__ import annotations

import math
from dataclasses import replace

from orchestrator.core.decide import decide, decide_cycle
from orchestrator.policies import DEFAULT_POLICIES
from schemas.events import GangReserved, JobWaiting
from tests.core.harness import Sim, of_type

#: Reservations for any blocked gang, as before #29 (the default holds them only for gangs past the
#: starvation bound, `Policies.reserve_after_s`): these tests are about the reservations themselves.
RESERVING = replace(DEFAULT_POLICIES, reserve_after_s=0.0)


def test_64_gpu_gang_is_not_starved_by_a_stream_of_1_gpu_jobs() -> None:
    s = Sim(policies=RESERVING)
    for i in range(8):
        s.node(f"n{i}")
    n = 0

    def trickle(count: int) -> None:
        nonlocal n
        for _ in range(count):
            s.submit(f"small{n:04}", gpus_per_rank=1, time_limit_s=300)
            n += 1

    trickle(64)
    s.run()
    s.tick(30)
    s.submit("big", ranks=8, gpus_per_rank=8, time_limit_s=3600)
    started_at = None
    for step in range(60):
        trickle(4)  # a steady stream of small jobs, forever
        # Small jobs finish after 40..100 s, in submit order.
        for jid in list(s.state.active):
            j = s.state.jobs[jid]
            if jid.startswith("small") and j.status == "running" and s.now - j.reserved_at >= 40 + (int(jid[5:]) % 7) * 10:
                s.finish(jid)
        events = s.run(cycles=3)
        if any(g.job_id == "big" for g in of_type(events, GangReserved)):
            started_at = s.now
            break
        s.tick(10)
        del step
    assert started_at is not None, "the big gang starved"
    assert started_at - 1030 <= 130  # every small job running when it arrived had ended by then


def test_short_job_backfills_held_gpus_long_job_waits() -> None:
    s = Sim(policies=RESERVING)
    s.node("n0")
    s.node("n1")
    s.submit("long", gpus_per_rank=8, time_limit_s=1000)  # n0 until ~t+1040
    s.submit("half", gpus_per_rank=4, time_limit_s=1000)  # half of n1
    s.run()
    s.submit("big", ranks=2, gpus_per_rank=8)
    s.tick(1)
    s.submit("unbounded", gpus_per_rank=4)
    s.tick(1)
    s.submit("short", gpus_per_rank=4, time_limit_s=100)
    events = s.decide()
    waits = {e.job_id: e for e in of_type(events, JobWaiting)}
    assert waits["big"].code == "backfill_head"
    assert "holding 4 free" in waits["big"].message
    assert [g.job_id for g in of_type(events, GangReserved)] == ["short"]  # ends before big can start
    assert waits["unbounded"].code == "backfill"
    assert waits["unbounded"].message == "free GPUs are reserved by backfill for job big"


def test_jobs_away_from_the_held_gpus_still_run() -> None:
    s = Sim(policies=RESERVING)
    for i in range(3):
        s.node(f"n{i}")
    s.submit("a", gpus_per_rank=8, time_limit_s=100)  # n0
    s.submit("b", gpus_per_rank=4, time_limit_s=1000)  # half of n1
    s.run()
    s.submit("big", ranks=2, gpus_per_rank=8)  # must wait for a (n0) and hold n2
    s.tick(1)
    s.submit("other", gpus_per_rank=4)  # n1's free half is not held: runs now
    events = s.decide()
    assert [g.job_id for g in of_type(events, GangReserved)] == ["other"]
    assert {r.node_id for r in of_type(events, GangReserved)[0].ranks} == {"n1"}


def test_an_aged_gang_takes_the_reservation_before_fair_share_and_keeps_it_until_it_starts() -> None:
    """Bounded aging (`reservation_aging_s`, here 0 s), one reservation: fair share puts queue c first
    (it holds nothing) and its 1-GPU job is blocked too, but a's older gang, larger than the smallest
    blocked head, gets the reservation, and keeps it while shares move."""
    from dataclasses import replace

    from orchestrator.policies.backfill import longest_waiting

    s = Sim(policies=replace(RESERVING, reservation_order=longest_waiting, reservation_aging_s=0.0,
                             reservations=1))
    for q in ("a", "b", "c"):
        s.queue(q)
    for n in ("n0", "n1", "n2"):
        s.node(n)
    s.submit("a-run", queue="a", gpus_per_rank=8, time_limit_s=100)  # one node until ~t+140
    s.submit("a-run2", queue="a", gpus_per_rank=8, time_limit_s=1000)
    s.submit("b-run", queue="b", gpus_per_rank=8, time_limit_s=1000)
    s.run()
    assert s.holding("a") == 16 and s.holding("b") == 8
    s.submit("big-a", queue="a", ranks=2, gpus_per_rank=8)
    s.tick(1)
    s.submit("big-b", queue="b", ranks=2, gpus_per_rank=8)
    s.submit("small-c", queue="c", gpus_per_rank=1)
    events = s.decide()
    waits = {e.job_id: e for e in of_type(events, JobWaiting)}
    assert waits["big-a"].code == "backfill_head"  # waited longest, although b and c go first by share
    assert waits["big-b"].code == waits["small-c"].code == "capacity"
    assert s.state.holders == ["big-a"]
    # Shares move (b's job ends, so b holds nothing): the reservation stays where it is.
    s.tick(5)
    s.finish("b-run")
    events = s.run()
    assert s.state.holders == ["big-a"]
    assert not [e for e in of_type(events, JobWaiting) if e.code == "backfill_head" and e.job_id != "big-a"]
    # Once a-run is done, big-a starts on what it held; then the aged big-b holds, not small-c.
    s.finish("a-run")
    events = s.run()
    assert [g.job_id for g in of_type(events, GangReserved)] == ["big-a"]
    assert s.state.holders == ["big-b"]

    # Without aging the same reservation goes in fair-share order: c holds nothing, its job is first.
    s = Sim(policies=replace(RESERVING, reservation_aging_s=math.inf, reservations=1))
    for q in ("a", "b", "c"):
        s.queue(q)
    for n in ("n0", "n1", "n2"):
        s.node(n)
    s.submit("a-run", queue="a", gpus_per_rank=8, time_limit_s=100)
    s.submit("a-run2", queue="a", gpus_per_rank=8, time_limit_s=1000)
    s.submit("b-run", queue="b", gpus_per_rank=8, time_limit_s=1000)
    s.run()
    s.submit("big-a", queue="a", ranks=2, gpus_per_rank=8)
    s.tick(1)
    s.submit("big-b", queue="b", ranks=2, gpus_per_rank=8)
    s.submit("small-c", queue="c", gpus_per_rank=1)
    s.decide()
    assert s.state.holders == ["small-c"]


def test_without_a_reservation_order_it_goes_in_fair_share_order_and_is_sticky() -> None:
    """reservation_order=None: b's gang (b holds less) is first blocked in fair-share order and takes
    it; a later change of shares does not move it."""
    from dataclasses import replace


    s = Sim(policies=replace(RESERVING, reservation_order=None, reservations=1))
    s.queue("a")
    s.queue("b")
    for n in ("n0", "n1", "n2"):
        s.node(n)
    s.submit("a-run", queue="a", gpus_per_rank=8, time_limit_s=100)
    s.submit("a-run2", queue="a", gpus_per_rank=8, time_limit_s=1000)
    s.submit("b-run", queue="b", gpus_per_rank=4, time_limit_s=1000)
    s.run()
    s.submit("big-a", queue="a", ranks=2, gpus_per_rank=8)
    s.tick(1)
    s.submit("big-b", queue="b", ranks=2, gpus_per_rank=8)
    s.decide()
    assert s.state.holders == ["big-b"]
    # b now holds more than a would after a's next start; the holder stays.
    s.submit("b-more", queue="b", gpus_per_rank=4, time_limit_s=10)
    s.run()
    assert s.state.holders == ["big-b"]


def test_two_reservations_the_second_planned_around_the_first() -> None:
    """With reservations=2 two blocked gangs hold GPUs at once: the second is planned on GPUs the
    first will not start on, and a job that would outlast either reservation uses neither's GPUs."""
    from dataclasses import replace


    def scenario(reservations: int) -> tuple[Sim, dict[str, JobWaiting], list[str]]:
        s = Sim(policies=replace(RESERVING, reservations=reservations))
        for n in ("n0", "n1", "n2", "n3"):
            s.node(n)
        s.submit("r0", gpus_per_rank=8, time_limit_s=100)  # a node until ~t+140
        s.submit("r1", gpus_per_rank=8, time_limit_s=1000)  # a node until ~t+1040
        s.submit("r2", gpus_per_rank=4, time_limit_s=2000)  # half a node until ~t+2040
        s.run()
        s.submit("big1", ranks=2, gpus_per_rank=8)
        s.tick(1)
        s.submit("big2", ranks=2, gpus_per_rank=8)
        s.tick(1)
        s.submit("medium", gpus_per_rank=4, time_limit_s=500)
        events = s.decide()
        waits = {e.job_id: e for e in of_type(events, JobWaiting)}
        return s, waits, [g.job_id for g in of_type(events, GangReserved)]

    s, waits, started = scenario(2)
    assert waits["big1"].code == waits["big2"].code == "backfill_head"
    assert s.state.holders == ["big1", "big2"]
    assert "holding 8 free" in waits["big1"].message  # the free node; r0's node follows
    assert "holding 4 free" in waits["big2"].message  # not r0's node: big1 starts there
    assert started == []
    assert waits["medium"].message == "free GPUs are reserved by backfill for job big1 and 1 more"
    s.tick(1)
    s.submit("short", gpus_per_rank=4, time_limit_s=50)  # ends before either reservation starts
    assert [g.job_id for g in of_type(s.decide(), GangReserved)] == ["short"]

    s, waits, started = scenario(1)  # EASY: only big1 holds, so medium takes the half node
    assert s.state.holders == ["big1"]
    assert started == ["medium"]


def test_a_told_reservation_is_kept_from_the_log_until_gpus_come_back() -> None:
    """The holder's JobWaiting carries its reservation. Decide keeps that one (a restarted scheduler
    too) while gangs only start -- no earlier start can exist then -- and plans afresh, telling the
    new one, as soon as a gang ends."""
    from dataclasses import replace


    s = Sim(policies=replace(RESERVING, reservations=1))
    for n in ("n0", "n1", "n2", "n3"):
        s.node(n)
    for jid, limit in (("r0", 1000), ("r1", 2000), ("r2", 3000)):
        s.submit(jid, gpus_per_rank=8, time_limit_s=limit)
    s.submit("r3", gpus_per_rank=4, time_limit_s=3000)
    s.run()
    node = {j: s.state.jobs[j].placement[0].node_id for j in ("r0", "r1", "r2")}
    s.submit("big", ranks=2, gpus_per_rank=8)
    told = {e.job_id: e for e in of_type(s.decide(), JobWaiting)}["big"]
    assert told.code == "backfill_head"
    assert {rp.node_id for rp in told.hold_ranks} == {node["r0"], node["r1"]}  # r0, then r1 ends
    assert told.hold_until == s.state.jobs["r1"].reserved_at + 2000 + 30 + 10  # limit, grace, margin
    assert s.state.jobs["big"].waiting is not None and s.state.jobs["big"].waiting.hold_ranks == told.hold_ranks

    # A job starts on the free half node (it would outlast the reservation: not on held GPUs).
    # GPUs only went away, so the told reservation is kept: big is not told anything new.
    s.tick(10)
    s.submit("late", gpus_per_rank=4, time_limit_s=3000)
    events = s.run()
    assert [g.job_id for g in of_type(events, GangReserved)] == ["late"]
    assert not [e for e in of_type(events, JobWaiting) if e.job_id == "big"]
    # r2 ends early: r0's node and r2's are sooner. Planned afresh at once, and told.
    s.tick(10)
    s.finish("r2")
    new = [e for e in of_type(s.run(), JobWaiting) if e.job_id == "big"]
    assert len(new) == 1 and new[0].code == "backfill_head"
    assert {rp.node_id for rp in new[0].hold_ranks} == {node["r0"], node["r2"]}
    assert new[0].hold_until < told.hold_until


def _one_reservation_counting_plans() -> tuple[Sim, list[str]]:
    """Four 8-GPU nodes: r0-r2 fill three (time limits 1000/2000/3000 s), r3 half of n3; one
    reservation at a time, and the ids of the gangs backfill plans for, in order."""
    from dataclasses import replace

    from orchestrator.policies.backfill import earliest_start

    plans: list[str] = []

    def counted(req, *args):  # type: ignore[no-untyped-def]
        plans.append(req.job_id)
        return earliest_start(req, *args)

    s = Sim(policies=replace(RESERVING, reservations=1, backfill=counted))
    for n in ("n0", "n1", "n2", "n3"):
        s.node(n)
    for jid, limit in (("r0", 1000), ("r1", 2000), ("r2", 3000)):
        s.submit(jid, gpus_per_rank=8, time_limit_s=limit)
    s.submit("r3", gpus_per_rank=4, time_limit_s=3000)
    return s, plans


def test_a_reservation_planned_afresh_is_told_again_and_then_kept() -> None:
    """GPUs came back (a gang ended) but not where the holder can use them: the plan comes out the
    same. It is told again all the same, so the cycles after it keep it from the log instead of
    planning it once more each."""
    s, plans = _one_reservation_counting_plans()
    s.submit("tiny", gpus_per_rank=1, time_limit_s=3000)  # n3 too
    s.run()
    s.submit("big", ranks=2, gpus_per_rank=8)
    told = {e.job_id: e for e in of_type(s.run(), JobWaiting)}["big"]
    assert told.code == "backfill_head" and plans == ["big"]

    # tiny ends: one GPU comes back on n3, where r3 still holds half. The same reservation is
    # planned, and told again although nothing in it changed.
    s.tick(10)
    s.finish("tiny")
    again = [e for e in of_type(s.run(), JobWaiting) if e.job_id == "big"]
    assert plans == ["big", "big"]
    assert len(again) == 1 and (again[0].hold_ranks, again[0].hold_until) == (told.hold_ranks, told.hold_until)
    # A job starts: GPUs only went away since, so the cycles keep the told reservation.
    s.tick(10)
    s.submit("late", gpus_per_rank=4, time_limit_s=3000)
    events = s.run()
    assert [g.job_id for g in of_type(events, GangReserved)] == ["late"]
    assert not [e for e in of_type(events, JobWaiting) if e.job_id == "big"]
    assert plans == ["big", "big"]


def test_a_gang_ending_before_the_told_start_leaves_the_reservation_as_told() -> None:
    """A gang expected to end before the told start ends early: the plan had its GPUs back by then, so
    no earlier start exists. The told reservation is confirmed without planning, and told again so
    the next cycles know that end is accounted for. A gang expected to end at or after the start, ending
    early, may start the holder sooner: that one is planned afresh."""
    s, plans = _one_reservation_counting_plans()
    s.submit("short", gpus_per_rank=1, time_limit_s=500)  # n3, expected back long before big starts
    s.submit("long", gpus_per_rank=1, time_limit_s=5000)  # n3, expected back after big starts
    s.run()
    s.submit("big", ranks=2, gpus_per_rank=8)
    told = {e.job_id: e for e in of_type(s.run(), JobWaiting)}["big"]
    assert told.code == "backfill_head" and plans == ["big"]
    assert told.hold_until == s.state.jobs["r1"].reserved_at + 2000 + 30 + 10

    s.tick(10)
    s.finish("short")
    again = [e for e in of_type(s.run(), JobWaiting) if e.job_id == "big"]
    assert plans == ["big"]  # not planned
    assert len(again) == 1 and (again[0].hold_ranks, again[0].hold_until) == (told.hold_ranks, told.hold_until)
    s.tick(10)
    s.submit("late", gpus_per_rank=1, time_limit_s=3000)
    assert [g.job_id for g in of_type(s.run(), GangReserved)] == ["late"]
    assert plans == ["big"]  # the told-again reservation is kept from the log

    s.tick(10)
    s.finish("long")
    s.run()
    assert plans == ["big", "big"]


def test_an_older_head_that_fits_now_starts_before_a_younger_gang_takes_the_free_reservation() -> None:
    """The reservation goes to the longest-waiting blocked head, in that order: a head older than it
    that the free GPUs can take starts first. Otherwise the younger gang's hold takes the very GPUs
    the older head would start on, and the older one waits behind a job submitted after it."""
    from dataclasses import replace


    s = Sim(policies=replace(RESERVING, reservations=1, reservation_aging_s=0.0))
    s.queue("a")
    s.queue("b")
    for n in ("n0", "n1", "n2", "n3"):
        s.node(n)
    s.submit("a-short1", queue="a", gpus_per_rank=8, time_limit_s=100)
    s.submit("a-long", queue="a", gpus_per_rank=8)
    s.submit("b-long", queue="b", gpus_per_rank=8)
    s.submit("a-short2", queue="a", gpus_per_rank=8, time_limit_s=100)
    s.run()
    s.tick(1)
    s.submit("holder", queue="a", gpus_per_rank=8)
    s.decide()
    assert s.state.holders == ["holder"]
    s.tick(1)
    s.submit("old-a", queue="a", gpus_per_rank=8)  # the one reservation is taken: it waits
    s.tick(1)
    s.submit("young-b", queue="b", ranks=2, gpus_per_rank=8)
    s.decide()
    assert s.job("old-a").status == "pending"
    s.tick(100)
    s.finish("a-short1")
    s.finish("a-short2")  # 16 GPUs come back: the holder starts on 8, old-a fits in the other 8
    events = s.decide()
    assert {g.job_id for g in of_type(events, GangReserved)} == {"holder", "old-a"}
    waits = {e.job_id: e for e in of_type(events, JobWaiting)}
    assert waits["young-b"].code == "backfill_head"  # b goes first by share, yet it is younger
    assert s.state.holders == ["young-b"]


def test_a_placement_on_held_gpus_leaves_nothing_for_the_next_cycle_to_decide() -> None:
    """It ends before the reservation starts, so the told reservation stands; the heads judged before it are
    told their reasons on the final plan. Admission is complete: the next round only marks it running."""
    s = Sim(policies=replace(RESERVING, reservations=1), min_runtime_s=60)
    s.node("n0")
    s.node("n1")
    s.submit("long", gpus_per_rank=8, time_limit_s=1000)
    s.submit("half", gpus_per_rank=4, time_limit_s=1000)
    s.agents(s.run())
    s.submit("big", ranks=2, gpus_per_rank=8)
    s.tick(1)
    s.submit("unbounded", gpus_per_rank=4)
    s.tick(1)
    s.submit("short", gpus_per_rank=4, time_limit_s=100)
    cycle = decide_cycle(s.state, s.now, epoch=s.epoch, policies=s.policies)
    assert [g.job_id for g in of_type(cycle.events, GangReserved)] == ["short"]  # on the GPUs held for big
    waits = {e.job_id: e for e in of_type(cycle.events, JobWaiting)}
    assert waits["big"].code == "backfill_head"
    # Judged before `short` took the held GPUs: "reserved by backfill" no longer holds after the cycle.
    assert waits["unbounded"].message == "needs 4 GPUs on one node, the largest free node has 0"
    assert cycle.complete
    s.emit_all(cycle.events)  # type: ignore[arg-type]
    s.start("short")
    full = decide(s.state, s.now, epoch=s.epoch, policies=s.policies)
    assert [type(e).__name__ for e in full] == ["JobRunning"]
    assert decide_cycle(s.state, s.now, epoch=s.epoch, policies=s.policies, after_complete=True).events == full
