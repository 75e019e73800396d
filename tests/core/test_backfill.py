"""Backfill: a big gang holds what it will start on; short jobs may slip in front, long ones may not."""

from __future__ import annotations

from schemas.events import GangReserved, JobWaiting
from tests.core.harness import Sim, of_type


def test_64_gpu_gang_is_not_starved_by_a_stream_of_1_gpu_jobs() -> None:
    s = Sim()
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
    s = Sim()
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
    s = Sim()
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


def test_reservation_goes_to_the_longest_waiting_blocked_head_and_stays_until_it_starts() -> None:
    """With reservation_order=longest_waiting: fair share puts queue b first (it holds less), but a's
    older gang gets the reservation, and keeps it."""
    from dataclasses import replace

    from orchestrator.policies import DEFAULT_POLICIES
    from orchestrator.policies.backfill import longest_waiting

    s = Sim(policies=replace(DEFAULT_POLICIES, reservation_order=longest_waiting))
    s.queue("a")
    s.queue("b")
    for n in ("n0", "n1", "n2"):
        s.node(n)
    s.submit("a-run", queue="a", gpus_per_rank=8, time_limit_s=100)  # one node until ~t+140
    s.submit("a-run2", queue="a", gpus_per_rank=8, time_limit_s=1000)
    s.submit("b-run", queue="b", gpus_per_rank=4, time_limit_s=1000)
    s.run()
    assert s.holding("a") == 16 and s.holding("b") == 4
    s.submit("big-a", queue="a", ranks=2, gpus_per_rank=8)
    s.tick(1)
    s.submit("big-b", queue="b", ranks=2, gpus_per_rank=8)
    events = s.decide()
    waits = {e.job_id: e for e in of_type(events, JobWaiting)}
    assert waits["big-a"].code == "backfill_head"  # waited longest, although b goes first by share
    assert waits["big-b"].code == "capacity"
    assert s.state.holder == "big-a"
    # Shares move (b's job ends, so b holds nothing): the reservation stays where it is.
    s.tick(5)
    s.finish("b-run")
    events = s.run()
    assert s.state.holder == "big-a"
    assert not [e for e in of_type(events, JobWaiting) if e.code == "backfill_head" and e.job_id != "big-a"]
    # Once a-run is done, big-a starts on what it held; then big-b may hold.
    s.finish("a-run")
    events = s.run()
    assert [g.job_id for g in of_type(events, GangReserved)] == ["big-a"]
    assert s.state.holder == "big-b"


def test_by_default_the_reservation_is_sticky_once_given_in_fair_share_order() -> None:
    """Default: b's gang (b holds less) is first blocked in fair-share order and takes it; a later
    change of shares does not move it."""
    s = Sim()
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
    assert s.state.holder == "big-b"
    # b now holds more than a would after a's next start; the holder stays.
    s.submit("b-more", queue="b", gpus_per_rank=4, time_limit_s=10)
    s.run()
    assert s.state.holder == "big-b"
