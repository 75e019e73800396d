"""Preemption, reclaim, minimal victim sets, earmarks, guarantees and the anti-thrash rule."""

from __future__ import annotations

from orchestrator.core.node_work import node_work
from orchestrator.policies.backfill import longest_waiting
from schemas.events import GangReserved, JobWaiting, Preempted, PreemptionRequested
from tests.core.harness import Sim, of_type


def victims(events: list) -> list[str]:
    return sorted(e.job_id for e in of_type(events, PreemptionRequested))


def test_urgent_job_preempts_experiment_which_resumes_from_its_checkpoint() -> None:
    s = Sim()
    s.node("n0")
    s.submit("exp", gpus_per_rank=8, checkpoint_dir="/ckpt/exp")
    s.run()
    s.checkpoint("exp", step=10, path="/ckpt/exp/10")
    s.tick(100)
    s.submit("urgent", gpus_per_rank=8, priority=10)
    events = s.decide()
    (p,) = of_type(events, PreemptionRequested)
    assert (p.job_id, p.preemptor_job_id, p.grace_s) == ("exp", "urgent", 30.0)
    assert p.earmark and p.earmark[0].node_id == "n0"
    (w,) = of_type(events, JobWaiting)
    assert (w.job_id, w.code) == ("urgent", "preempting")
    assert set(node_work(s.state, "n0").values()) == {"checkpoint"}  # the agent signals and waits
    # The experiment checkpoints on the signal, then exits.
    s.checkpoint("exp", step=20, path="/ckpt/exp/20")
    s.exit("exp", code=None, reason="preempted")
    events = s.decide()
    (pre,) = of_type(events, Preempted)
    assert pre.resume_from == "/ckpt/exp/20"
    (g,) = of_type(s.decide(), GangReserved)
    assert g.job_id == "urgent"
    s.start("urgent")
    s.decide()
    s.finish("urgent")
    events = s.decide()
    (g,) = of_type(events, GangReserved)
    assert (g.job_id, g.attempt) == ("exp", 2)
    exp = s.job("exp")
    assert exp.resume_from == "/ckpt/exp/20"
    assert node_work(s.state, "n0") == {("exp", 2, 0): "run"}


def test_victim_that_ignores_the_signal_is_preempted_after_grace() -> None:
    s = Sim()
    s.node("n0")
    s.submit("exp", gpus_per_rank=8, grace_period_s=20)
    s.run()
    s.submit("urgent", gpus_per_rank=8, priority=1)
    s.decide()
    s.tick(20 + s.policies.stop_margin_s)
    (pre,) = of_type(s.decide(), Preempted)
    assert pre.job_id == "exp" and s.job("exp").attempt == 2


def test_minimal_victim_set_adds_back_unneeded_victims() -> None:
    s = Sim()
    s.node("n0")
    s.node("n1")
    s.submit("keep", gpus_per_rank=4, preemptible=False)  # n0 half busy for good
    s.run()
    s.tick(1)
    s.submit("b", gpus_per_rank=8)  # n1
    s.run()
    s.tick(1)
    s.submit("a", gpus_per_rank=4)  # n0's other half, newest: first candidate
    s.run()
    s.submit("urgent", gpus_per_rank=8, priority=5)
    # Candidates newest first: a (frees 4 on n0: not enough), then b (frees n1: fits).
    # Adding a back still fits, so only b is preempted.
    assert victims(s.decide()) == ["b"]


def _small_and_big(s: Sim, *, small_priority: int = 0) -> None:
    """Two 8-GPU gangs on n0 and n1, then a 4x8 gang on n2..n5, the newest."""
    for n in range(6):
        s.node(f"n{n}")
    for name in ("s0", "s1"):
        s.submit(name, gpus_per_rank=8, priority=small_priority)
        s.run()
        s.tick(1)
    s.submit("big", ranks=4, gpus_per_rank=8)
    s.run()
    assert s.job("big").status == "running" and not s.state.pending


def test_a_small_preemptor_stops_a_small_gang_not_the_big_newest_one() -> None:
    """Newest first alone would stop all 32 GPUs of `big` to free 8; one 8-GPU gang costs a quarter."""
    s = Sim()
    _small_and_big(s)
    s.submit("urgent", gpus_per_rank=8, priority=5)
    assert victims(s.decide()) == ["s1"]  # the newest of the cheapest


def test_the_cheaper_victims_are_never_more_important_ones() -> None:
    """Fewer GPUs lost does not buy preempting a higher priority than needed: lowest priority goes first."""
    s = Sim()
    _small_and_big(s, small_priority=3)
    s.submit("urgent", gpus_per_rank=8, priority=5)
    assert victims(s.decide()) == ["big"]


def test_a_multi_node_preemptor_gathers_whole_nodes_from_the_cheapest_gangs() -> None:
    """A 2x8 job takes the two 8-GPU gangs' nodes (16 GPUs stopped), not the 4-node gang (32)."""
    s = Sim()
    _small_and_big(s)
    s.submit("urgent", ranks=2, gpus_per_rank=8, priority=5)
    events = s.decide()
    assert victims(events) == ["s0", "s1"]
    # Each victim's reason says what the whole set costs: "why me" next to "why anyone".
    assert {p.reason for p in of_type(events, PreemptionRequested)} == {
        "priority 5 > 0 in queue default; stops 2 gangs (16 GPUs) to make room for 16 GPUs"}
    (p, _) = of_type(events, PreemptionRequested)
    assert sorted(rp.node_id for rp in p.earmark) == ["n0", "n1"]


def test_minimum_runtime_protects_fresh_jobs() -> None:
    s = Sim(min_runtime_s=60)
    s.node("n0")
    s.submit("fresh", gpus_per_rank=8)
    s.run()
    s.tick(30)
    s.submit("urgent", gpus_per_rank=8, priority=9)
    assert victims(s.decide()) == []
    s.tick(30)
    assert victims(s.decide()) == ["fresh"]


def test_non_preemptible_and_equal_priority_are_never_victims() -> None:
    s = Sim()
    s.node("n0")
    s.submit("pinned", gpus_per_rank=4, preemptible=False)
    s.submit("peer", gpus_per_rank=4, priority=5)
    s.run()
    s.submit("urgent", gpus_per_rank=8, priority=5)
    assert victims(s.decide()) == []


def test_earmarked_gpus_are_kept_for_the_preemptor() -> None:
    s = Sim()
    s.node("n0")
    s.submit("exp", gpus_per_rank=8)
    s.run()
    s.submit("urgent", gpus_per_rank=8, priority=10)
    s.decide()
    s.tick(1)
    s.submit("sneaky", gpus_per_rank=1, priority=20)  # higher priority, but not a preemptor
    s.exit("exp", code=None, reason="preempted")
    s.decide()  # Preempted
    events = s.decide()
    assert [g.job_id for g in of_type(events, GangReserved)] == ["urgent"]
    assert s.job("sneaky").status == "pending"


def test_reclaim_never_pushes_a_victim_queue_below_its_guarantee() -> None:
    s = Sim()
    s.node("n0")
    s.node("n1")
    s.queue("a", guaranteed_gpus=8)
    s.queue("b", guaranteed_gpus=0)
    s.queue("c", guaranteed_gpus=8)
    for i in range(8):
        s.submit(f"a{i}", queue="a")
        s.submit(f"b{i}", queue="b")
    s.run()
    assert (s.holding("a"), s.holding("b")) == (8, 8)
    s.tick(100)
    for i in range(8):
        s.submit(f"c{i}", queue="c")
    events = s.run(cycles=6)
    assert all(v.startswith("b") for v in victims(events))
    assert (s.holding("a"), s.holding("b"), s.holding("c")) == (8, 0, 8)


def test_anti_thrash() -> None:
    """A victim never preempts its preemptor back (proof: orchestrator/policies/victims.py docstring).

    Priority case: the urgent job preempts the experiment; the requeued experiment
    then waits, it does not preempt back. Reclaim case: team c reclaims its
    guarantee from borrower b; b's requeued jobs do not reclaim from c.
    """
    s = Sim()
    s.node("n0")
    s.queue("b", guaranteed_gpus=4)
    s.queue("c", guaranteed_gpus=4)
    s.submit("exp", queue="b", gpus_per_rank=8)
    s.run()
    s.tick(10)
    s.submit("urgent", queue="b", gpus_per_rank=4, priority=10)
    s.submit("claim", queue="c", gpus_per_rank=4)
    seen: list[tuple[str, str]] = []
    for _ in range(12):
        events = s.decide()
        seen += [(e.job_id, e.preemptor_job_id) for e in of_type(events, PreemptionRequested)]
        s.agents(events)
        s.tick(5)
    # c is owed 4 but may not take them from exp (b would drop to 0 < its guarantee 4);
    # urgent preempts exp by priority; claim then gets the half urgent does not need.
    assert seen == [("exp", "urgent")]
    assert {s.job("urgent").status, s.job("claim").status} == {"running"}
    assert s.job("exp").status == "pending"  # it waits; it does not take anything back


def test_anti_thrash_reclaim() -> None:
    """After team c reclaims its guarantee from borrower b, b's requeued jobs never reclaim from c."""
    s = Sim()
    s.node("n0")
    s.node("n1")
    s.queue("b", guaranteed_gpus=8)
    s.queue("c", guaranteed_gpus=8)
    for i in range(16):
        s.submit(f"b{i}", queue="b")
    s.run()
    s.tick(100)
    for i in range(8):
        s.submit(f"c{i}", queue="c")
    preempted: list[tuple[str, str]] = []
    for _ in range(20):
        events = s.decide()
        preempted += [(e.job_id, e.preemptor_job_id) for e in of_type(events, PreemptionRequested)]
        s.agents(events)
        s.tick(5)
    assert len(preempted) == 8
    assert all(v.startswith("b") and p.startswith("c") for v, p in preempted)
    assert (s.holding("b"), s.holding("c")) == (8, 8)


def test_limits_count_victims_until_they_are_gone() -> None:
    """A victim still holds its GPUs for its queue's limit until Preempted is folded.

    Queue a (limit 8) runs v (4) and w (4). u (2, higher priority) preempts v
    to fit the limit; x (2) must not be placed in the same cycle on the quota v
    frees later, or the fold would void it (v still counts).
    """
    s = Sim()
    s.node("n0")
    s.node("n1")
    s.queue("a", limit_gpus=8)
    s.submit("v", queue="a", gpus_per_rank=4)
    s.submit("w", queue="a", gpus_per_rank=4, preemptible=False)
    s.run()
    s.tick(1)
    s.submit("u", queue="a", gpus_per_rank=2, priority=9)
    s.submit("x", queue="a", gpus_per_rank=2, priority=1)
    events = s.decide()  # the harness fails the test on any void decision
    assert victims(events) == ["v"]
    assert not of_type(events, GangReserved)


def test_least_attained_service_rule_preempts_the_most_served_gang_and_remembers_service() -> None:
    """LAS through Policies: a new job preempts a gang with a higher service level once it ran min_runtime_s."""
    from dataclasses import replace

    from orchestrator.policies import DEFAULT_POLICIES
    from orchestrator.policies.las import LEAST_ATTAINED_SERVICE, LEVELS_GPU_S, least_attained_first

    s = Sim(min_runtime_s=60.0)
    s.policies = replace(DEFAULT_POLICIES, preemption=LEAST_ATTAINED_SERVICE, job_key=least_attained_first)
    s.node("n0")
    s.submit("long", gpus_per_rank=8, checkpoint_dir="/ckpt/long")
    s.run()
    s.tick(30)
    s.submit("short", gpus_per_rank=8)
    assert not of_type(s.decide(), PreemptionRequested)  # "long" has not run min_runtime_s yet
    s.tick(LEVELS_GPU_S[0] / 8)  # now past the first level: 8 GPUs x 450 s = 1 GPU-hour
    events = s.decide()
    assert victims(events) == ["long"]
    (p,) = of_type(events, PreemptionRequested)
    assert p.preemptor_job_id == "short" and "least attained service" in p.reason
    s.exit("long", code=None, reason="preempted")
    s.decide()
    # Requeued, "long" carries the service it got; "short" (none yet) is not preempted back by it.
    assert s.job("long").attained_s >= LEVELS_GPU_S[0]
    (g,) = of_type(s.decide(), GangReserved)
    assert g.job_id == "short"
    s.start("short")
    s.decide()
    s.tick(120)
    assert not of_type(s.decide(), PreemptionRequested)


def _exp_running_later_waiting() -> Sim:
    """n0 runs exp; 100 s later `later` (same priority) queues behind it, without preempting; 100 s pass."""
    s = Sim()
    s.node("n0")
    s.submit("exp", gpus_per_rank=8)
    s.run()
    s.tick(100)
    s.submit("later", gpus_per_rank=8)
    s.run()
    s.tick(100)
    return s


def test_a_preempted_gang_rejoins_its_line_behind_work_that_queued_before_it_was_preempted() -> None:
    s = _exp_running_later_waiting()
    s.submit("urgent", gpus_per_rank=8, priority=10)
    s.run()
    assert s.job("exp").status == "pending" and s.job("exp").attempt == 2
    assert s.job("exp").waiting_since == s.now and s.job("later").waiting_since < s.now
    assert longest_waiting(s.job("later")) < longest_waiting(s.job("exp"))  # reservations follow the same order
    s.tick(100)
    s.finish("urgent")
    # `later` queued while exp was running: it goes first, though exp was submitted earlier.
    assert [g.job_id for g in of_type(s.run(), GangReserved)] == ["later"]
    assert s.job("exp").status == "pending"


def test_a_gang_requeued_by_a_node_failure_keeps_its_place_in_line() -> None:
    s = _exp_running_later_waiting()
    s.fail_node("n0")
    s.run()
    assert s.job("exp").status == "pending" and s.job("exp").attempt == 2
    assert s.job("exp").waiting_since == s.job("exp").submitted_at
    s.tick(10)
    s.recover_node("n0")
    assert [g.job_id for g in of_type(s.run(), GangReserved)] == ["exp"]
