"""Fair share, guarantees, limits and hierarchy."""

from __future__ import annotations

from schemas.events import GangReserved, JobWaiting
from tests.core.harness import Sim, of_type


def busy_cluster(sim: Sim, nodes: int = 4) -> None:
    for i in range(nodes):
        sim.node(f"n{i}")


def churn(s: Sim, rounds: int, finish_per_round: int) -> list[tuple[int, int]]:
    """Each round: the oldest running jobs finish, decide refills; returns (a, b) holdings per round."""
    seen = []
    for _ in range(rounds):
        running = [j for j in s.state.active if s.state.jobs[j].status == "running"]
        for jid in sorted(running, key=lambda j: s.state.jobs[j].reserved_at)[:finish_per_round]:
            s.finish(jid)
        s.tick(10)
        s.run(cycles=3)
        seen.append((s.holding("a"), s.holding("b")))
    return seen


def test_two_equal_teams_each_get_half_of_a_full_cluster_over_time() -> None:
    s = Sim()
    busy_cluster(s)
    s.queue("a")
    s.queue("b")
    for i in range(60):
        s.submit(f"a{i:02}", queue="a")
    s.tick(1)
    for i in range(60):
        s.submit(f"b{i:02}", queue="b")  # later, yet not behind all of a's
    s.run()
    assert (s.holding("a"), s.holding("b")) == (16, 16)
    for a, b in churn(s, rounds=10, finish_per_round=5):
        assert a + b == 32 and abs(a - b) <= 1


def test_weights_split_the_cluster_proportionally() -> None:
    s = Sim()
    busy_cluster(s)
    s.queue("a", weight=3.0)
    s.queue("b", weight=1.0)
    for i in range(40):
        s.submit(f"a{i:02}", queue="a")
        s.submit(f"b{i:02}", queue="b")
    s.run()
    assert (s.holding("a"), s.holding("b")) == (24, 8)


def test_third_team_gets_its_guarantee_back_by_reclaim() -> None:
    s = Sim()
    busy_cluster(s)
    s.queue("a", guaranteed_gpus=8)
    s.queue("b", guaranteed_gpus=8)
    s.queue("c", guaranteed_gpus=8)
    for i in range(20):
        s.submit(f"a{i:02}", queue="a")
        s.submit(f"b{i:02}", queue="b")
    s.run()
    assert (s.holding("a"), s.holding("b")) == (16, 16)  # idle GPUs lent out
    s.tick(120)
    for i in range(10):
        s.submit(f"c{i:02}", queue="c")
    s.run(cycles=4)  # preempt, victims exit, reclaimed GPUs start
    assert s.holding("c") == 8
    assert s.holding("a") >= 8 and s.holding("b") >= 8
    assert s.holding("a") + s.holding("b") + s.holding("c") == 32


def test_queue_never_exceeds_its_limit_and_says_so() -> None:
    s = Sim()
    busy_cluster(s, 1)
    s.queue("x", limit_gpus=4)
    for i in range(6):
        s.submit(f"x{i}", queue="x")
    events = s.run()
    assert len(of_type(events, GangReserved)) == 4 and s.holding("x") == 4
    waits = {e.job_id: e for e in of_type(events, JobWaiting)}
    assert waits["x4"].code == "quota"
    assert waits["x4"].message == "queue x at its limit 4: holds 4, needs 1 more"


def test_a_gang_blocked_by_its_queues_limit_keeps_the_quota_that_frees() -> None:
    """Queue x (limit 8) runs two 4-GPU jobs; its 8-GPU gang waits for the quota, 1-GPU jobs behind it.
    When one job ends, the 4 GPUs of quota it frees are kept for the gang -- the small jobs do not take
    them (before #20 they did, each time, and the gang waited longer than under FIFO) -- and the gang
    starts when the second ends."""
    s = Sim()
    busy_cluster(s, 2)
    s.queue("x", limit_gpus=8)
    s.submit("run1", queue="x", gpus_per_rank=4)
    s.submit("run2", queue="x", gpus_per_rank=4)
    s.run()
    s.tick(1)
    s.submit("gang", queue="x", gpus_per_rank=8)
    s.tick(1)
    for i in range(4):
        s.submit(f"small{i}", queue="x")
    s.run()
    s.tick(10)
    s.finish("run1")
    events = s.run()
    assert not of_type(events, GangReserved)
    assert s.holding("x") == 4 and s.job("small0").status == "pending"
    s.tick(300)  # a reason of the same kind is told again once the last one is REFRESH_S old
    waits = {e.job_id: e for e in of_type(s.run(), JobWaiting)}
    assert waits["small0"].message == "queue x's quota is kept for job gang, first blocked by its limit"
    s.tick(10)
    s.finish("run2")
    assert [g.job_id for g in of_type(s.run(), GangReserved)] == ["gang"]


def test_child_usage_counts_toward_parent_limit() -> None:
    s = Sim()
    busy_cluster(s, 2)
    s.queue("org", limit_gpus=6)
    s.queue("t1", parent="org")
    s.queue("t2", parent="org")
    for i in range(5):
        s.submit(f"t1-{i}", queue="t1")
        s.submit(f"t2-{i}", queue="t2")
    s.run()
    assert s.holding("t1") + s.holding("t2") == 6
    assert s.state.usage["org"].tree_gpus == 6


def test_decayed_usage_puts_recent_heavy_users_last() -> None:
    s = Sim(half_life_s=600)
    busy_cluster(s, 1)
    s.queue("a")
    s.queue("b")
    s.submit("a-old", queue="a", gpus_per_rank=8)
    s.run()
    s.tick(1200)  # a held 8 GPUs for two half-lives
    s.finish("a-old")
    s.run()
    s.submit("a-new", queue="a", gpus_per_rank=8)
    s.submit("b-new", queue="b", gpus_per_rank=8)
    (g,) = of_type(s.decide(), GangReserved)
    assert g.job_id == "b-new"


def test_a_custom_job_order_is_a_policy_function() -> None:
    """Swapping `job_key` (here: strict submit order, priority ignored) changes who goes first."""
    import dataclasses

    from orchestrator.policies import DEFAULT_POLICIES

    fifo = dataclasses.replace(DEFAULT_POLICIES, job_key=lambda job: (job.submitted_at, job.job_id))
    for policies, first in ((DEFAULT_POLICIES, "late-urgent"), (fifo, "early")):
        s = Sim(policies=policies)
        busy_cluster(s, 1)
        s.submit("early", gpus_per_rank=8)
        s.tick(1)
        s.submit("late-urgent", gpus_per_rank=8, priority=5)
        (g,) = of_type(s.decide(), GangReserved)
        assert g.job_id == first
