"""A trace small enough to schedule by hand: JCTs and queueing delays per policy, worked out below.

Cluster: 2 nodes x 1 GPU (n0000, n0001), queues a and b (weight 1, no
guarantees, so nothing is preempted). Jobs (time limit = user estimate; a
limit's end as the core sees it adds grace 30 s + margin 10 s):

    job  submit  run  GPUs  queue  limit  -> ends at the latest (if started at submit)
    j1      0    100    1    a      200       240
    j2     10     50    2    a      100       (needs both GPUs)
    j3     20     30    1    b       60       120
    j4     30     10    1    b      300       370

fifo (strict): j1 runs 0-100. j2 blocks at 10 and holds every free GPU, so
  j3 and j4 wait behind it. j2 runs 100-150, then j3 150-180 and j4 150-160.
fifo-backfill: j2 holds n0001 until j1's limit ends (t=240). j3 would end by
  20+60+40 = 120 <= 240, so it backfills at 20 (ends 50); j4 would end by
  30+340 (or 50+340) > 240, so it waits for j2: 150-160.
corral: j2 blocks at 10 and takes the backfill reservation (n0001, until
  j1's limit ends at 240). At 20 queue b holds nothing and a holds 1, so b
  goes first: j3 ends by 120 <= 240 and backfills at 20 (ends 50). At 50
  (j3 done) the reservation stays with j2 (it is sticky: the holder is looked
  at before the fair-share order, until it starts), and j4 would end by 390 >
  240, so it waits for j2: 150-160. (Before the reservation was sticky, b's
  lower share put j4 first at 50 and moved the reservation.)
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from orchestrator.policies import DEFAULT_POLICIES
from orchestrator.sim.engine import SimConfig, simulate
from orchestrator.sim.metrics import summarize
from orchestrator.sim.trace import TraceJob
from tests.sim.conftest import scenario, tiny_cluster

JOBS = [
    TraceJob("j1", 0, 100, 1, "a", time_limit=200),
    TraceJob("j2", 10, 50, 2, "a", time_limit=100),
    TraceJob("j3", 20, 30, 1, "b", time_limit=60),
    TraceJob("j4", 30, 10, 1, "b", time_limit=300),
]

#: policy -> job -> (start, end)
EXPECTED = {
    "fifo": {"j1": (0, 100), "j2": (100, 150), "j3": (150, 180), "j4": (150, 160)},
    "fifo-backfill": {"j1": (0, 100), "j2": (100, 150), "j3": (20, 50), "j4": (150, 160)},
    "corral": {"j1": (0, 100), "j2": (100, 150), "j3": (20, 50), "j4": (150, 160)},
}


@pytest.mark.parametrize("policy", sorted(EXPECTED))
def test_start_and_end_times_match_the_hand_schedule(policy: str) -> None:
    result = simulate(scenario(tiny_cluster(), JOBS), policy, SimConfig(strict=True))
    tl = result.timeline
    got = {j: (tl.first_start[j], tl.end[j]) for j in tl.submit}
    assert got == EXPECTED[policy]
    assert all(s == "completed" for s in tl.status.values())


@pytest.mark.parametrize(
    ("policy", "avg_jct", "avg_delay"),
    [
        # JCTs 100, 140, 160, 130; delays 0, 90, 130, 120.
        ("fifo", (100 + 140 + 160 + 130) / 4, (0 + 90 + 130 + 120) / 4),
        # JCTs 100, 140, 30, 130; delays 0, 90, 0, 120.
        ("fifo-backfill", (100 + 140 + 30 + 130) / 4, (0 + 90 + 0 + 120) / 4),
        # The same schedule as fifo-backfill (see above).
        ("corral", (100 + 140 + 30 + 130) / 4, (0 + 90 + 0 + 120) / 4),
    ],
)
def test_metrics_of_the_hand_schedule(policy: str, avg_jct: float, avg_delay: float) -> None:
    m = summarize(simulate(scenario(tiny_cluster(), JOBS), policy))
    assert m["jct_s"]["avg"] == pytest.approx(avg_jct)
    assert m["queueing_delay_s"]["avg"] == pytest.approx(avg_delay)
    assert m["makespan_s"] == pytest.approx({"fifo": 180, "fifo-backfill": 160, "corral": 160}[policy])
    assert m["longest_wait_32plus_s"] is None  # no gang that big here
    assert m["preemptions"] == 0
    assert m["priority_jobs"] == 0 and math.isnan(m["priority_queueing_delay_s"]["avg"])  # one priority: none
    assert m["total_wait_s"]["avg"] == pytest.approx(avg_delay)  # nobody preempted: the same as the delay


def test_share_error_of_the_corral_schedule() -> None:
    """The hand schedule under corral, the instants at which a queue has pending work (2 GPUs, weights 1:1;
    fair share is water-filled over held + pending GPUs):

        10-20   a holds 1 (j1), j2 waits (2): a's demand 3, b's 0 -> a's fair 2; |1 - 2| = 1
        20-30   a 1 + 2 pending, b 1 (j3): fair 1 and 1; a off by 0
        30-50   j4 queues: a and b both hold 1 of fair 1; off by 0
        50-100  j3 done: b holds 0 of fair 1 (j4 waits for j2's reservation); a 1 of 1
        100-150 j2 runs on both GPUs, a has nothing pending; b holds 0 of fair 1

    a: off 1 x 10 s over fair 2 x 10 + 1 x 10 + 1 x 20 + 1 x 50 = 100 -> 0.1;
    b: off 1 x 50 + 1 x 50 over 1 x 20 + 1 x 50 + 1 x 50 = 120 -> 0.833.
    """
    m = summarize(simulate(scenario(tiny_cluster(), JOBS), "corral"))
    assert m["queues"]["share_error"] == [pytest.approx(0.1), pytest.approx(100 / 120)]
    assert m["share_error"]["mean"] == pytest.approx((0.1 + 100 / 120) / 2)
    assert m["share_error"]["worst"] == pytest.approx(100 / 120)


def test_allocation_of_the_fifo_schedule() -> None:
    """fifo holds 1 GPU over 0-100, 2 over 100-180 but only 1 over 160-180: (100 + 2*60 + 20) / (2*180)."""
    m = summarize(simulate(scenario(tiny_cluster(), JOBS), "fifo"))
    assert m["gpu_allocation"]["mean_whole_run"] == pytest.approx((100 + 2 * 60 + 20) / (2 * 180))
    # The arrival window is 0-30, when only j1 held a GPU: half the cluster.
    assert m["gpu_allocation"]["mean"] == pytest.approx(0.5)


def test_preemption_loses_work_since_the_checkpoint_plus_the_restart() -> None:
    """1 GPU. low (300 s) runs from 0; high (priority 10, 50 s) arrives at 250 and preempts it.

    Checkpoints every 100 s of work: low resumes from 200 at 300, pays the 20 s
    restart overhead and needs 100 s more: it ends at 420. Lost: 50 GPU-s of
    work since the checkpoint plus the 20 s overhead.
    """
    cluster = tiny_cluster(nodes=1, queues=[{"name": "a"}])
    jobs = [TraceJob("low", 0, 300, 1, "a"), TraceJob("high", 250, 50, 1, "a", priority=10)]
    cfg = SimConfig(checkpoint_interval_s=100, restart_overhead_s=20, strict=True)
    result = simulate(scenario(cluster, jobs), "corral", cfg)
    tl = result.timeline
    assert (tl.first_start["high"], tl.end["high"]) == (250, 300)
    assert tl.end["low"] == 420
    assert result.state.jobs["low"].resume_from == "sim://low/step-200"
    m = summarize(result)
    assert m["preemptions"] == 1
    assert m["gpu_hours_lost_to_preemption"] * 3600 == pytest.approx(50 + 20)
    assert (m["priority_jobs"], m["priority_queueing_delay_s"]["avg"]) == (1, 0)
    # The baselines never preempt: high waits for low.
    fifo = simulate(scenario(cluster, jobs), "fifo", cfg)
    assert (fifo.timeline.first_start["high"], fifo.timeline.end["low"]) == (300, 300)
    assert summarize(fifo)["priority_queueing_delay_s"]["avg"] == 300 - 250


def test_a_preempted_job_waits_behind_the_job_that_queued_while_it_ran() -> None:
    """1 GPU. low (300 s) runs from 0; mid (50 s) queues at 100; high (priority 10) preempts low at 250.

    low rejoins the line at 250, behind mid (queued at 100): high runs 250-300,
    mid 300-350, then low resumes from step 200 with the 20 s overhead and
    needs 100 s more: 350 + 20 + 100 = 470. (With low keeping its submit-time
    place, low would end at 420 and mid at 470.)
    """
    cluster = tiny_cluster(nodes=1, queues=[{"name": "a"}])
    jobs = [TraceJob("low", 0, 300, 1, "a"), TraceJob("mid", 100, 50, 1, "a"),
            TraceJob("high", 250, 50, 1, "a", priority=10)]
    cfg = SimConfig(checkpoint_interval_s=100, restart_overhead_s=20, strict=True)
    tl = simulate(scenario(cluster, jobs), "corral", cfg).timeline
    assert (tl.first_start["high"], tl.end["high"]) == (250, 300)
    assert (tl.first_start["mid"], tl.end["mid"]) == (300, 350)
    assert tl.end["low"] == 470
    # Total wait counts low's 250-350 after its preemption; the queueing delay only submit -> first start.
    m = summarize(simulate(scenario(cluster, jobs), "corral", cfg))
    assert m["total_wait_s"]["avg"] == pytest.approx((100 + 200 + 0) / 3)
    assert m["queueing_delay_s"]["avg"] == pytest.approx((0 + 200 + 0) / 3)
    assert m["preemptions_per_job"] == {"max": 1, "p99": pytest.approx(0.98)}  # [0, 0, 1] at p99
    # Lost: 50 s of work since the checkpoint at 200 + the 20 s restart; delivered: the GPU was held 0-470.
    assert m["lost_to_preemption_fraction"] == pytest.approx(70 / 470)
    assert m["gpu_hours_delivered"] * 3600 == pytest.approx(470)
    # A what-if record runs under the policy's name. Without preemption low runs to 300, and mid, which has
    # held the backfill reservation since 100, starts before high.
    what_if = replace(DEFAULT_POLICIES, preemption_searches=0)
    tl = simulate(scenario(cluster, jobs), "corral", cfg, policies=what_if).timeline
    assert (tl.end["low"], tl.first_start["mid"], tl.first_start["high"]) == (300, 300, 350)


def test_node_failure_requeues_from_the_checkpoint() -> None:
    """j runs on n0000 from 0 (300 s of work, checkpoint every 100 s); n0000 fails at 150 for 1000 s.

    The core requeues j; it restarts at once on n0001 from step 100 with a
    20 s overhead: 150 + 20 + 200 = 370. Lost: 50 s of work + 20 s overhead.
    """
    from orchestrator.sim.trace import Outage

    cluster = tiny_cluster(nodes=2, queues=[{"name": "a"}])
    result = simulate(scenario(cluster, [TraceJob("j", 0, 300, 1, "a")], [Outage("n0000", 150, 1000)]),
                      "corral", SimConfig(checkpoint_interval_s=100, restart_overhead_s=20, strict=True))
    tl = result.timeline
    assert tl.end["j"] == 370
    assert result.state.jobs["j"].placement[0].node_id == "n0001"
    assert tl.requeues == 1
    assert summarize(result)["gpu_hours_lost_to_failures"] * 3600 == pytest.approx(70)
    assert result.state.nodes["n0000"].failed is False  # registered again at 1150
    assert result.state.nodes["n0000"].incarnation == "2"


def test_time_limit_kills_a_job_that_runs_past_it() -> None:
    cluster = tiny_cluster(nodes=1, queues=[{"name": "a"}])
    result = simulate(scenario(cluster, [TraceJob("j", 0, 500, 1, "a", time_limit=100)]), "corral",
                      SimConfig(strict=True))
    assert result.timeline.status["j"] == "failed"
    assert result.timeline.end["j"] == 100  # stopped at its limit; the simulated workers die at once
    assert result.stats.time_limit_kills == 1


def test_a_job_that_can_never_fit_is_rejected_once_the_cluster_settled() -> None:
    """8 GPUs required inside one leaf of 4: it waits while nodes may still join (30 s), then is rejected."""
    cluster = tiny_cluster(nodes=2, gpus_per_node=4, queues=[{"name": "a"}], topology=[{"level": "leaf", "size": 1}])
    jobs = [TraceJob("big", 0, 10, 8, "a", topology=("leaf", "require"))]
    result = simulate(scenario(cluster, jobs), "corral", SimConfig(strict=True))
    assert result.timeline.status["big"] == "rejected"
    assert result.timeline.end["big"] == 30.0
    assert result.stats.unfinished == 0
