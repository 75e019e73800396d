"""Issue #29 acceptance 3 in miniature: an isolated queue, no time limits, no users -- the learned order beats FIFO.

One 4-GPU node, one queue limited to its guarantee. First one job of each kind completes
(a 1-GPU job of 10 min, a 2-GPU job of 5 h): the log learns their run times by (queue,
GPU count). Then a 4-GPU blocker holds the node while the backlog arrives: five 2-GPU
jobs of 5 h, then twenty 1-GPU jobs of 10 min. In arrival order the short jobs wait out
the long ones; ordered by their learned claims (1 GPU x 600 s against 2 GPUs x 18,000 s)
they go first. Checked on the simulated starts themselves (the timeline), and on the
average JCT against FIFO's (acceptance 3: <= 0.8x).
"""

from __future__ import annotations

from orchestrator.sim.engine import simulate
from orchestrator.sim.metrics import summarize
from orchestrator.sim.trace import TraceJob
from tests.sim.conftest import scenario, tiny_cluster

SHORT, LONG, BLOCK = 600.0, 18_000.0, 3_600.0


def _jobs() -> list[TraceJob]:
    jobs = [TraceJob(job_id="w1", submit_time=0.0, duration=SHORT, num_gpus=1, queue="q"),
            TraceJob(job_id="w2", submit_time=0.0, duration=LONG, num_gpus=2, queue="q"),
            TraceJob(job_id="blk", submit_time=LONG + 100, duration=BLOCK, num_gpus=4, queue="q")]
    t = LONG + 200
    jobs += [TraceJob(job_id=f"l{i}", submit_time=t + i, duration=LONG, num_gpus=2, queue="q") for i in range(5)]
    jobs += [TraceJob(job_id=f"s{i:02d}", submit_time=t + 10 + i, duration=SHORT, num_gpus=1, queue="q")
             for i in range(20)]
    return jobs


def _run(policy: str) -> tuple[float, dict[str, float]]:
    """(avg JCT, first start per job) under `policy`."""
    cluster = tiny_cluster(nodes=1, gpus_per_node=4, queues=[{"name": "q", "guaranteed_gpus": 4, "limit_gpus": 4}])
    result = simulate(scenario(cluster, _jobs()), policy)
    metrics = summarize(result)
    assert metrics["completed"] == len(_jobs())
    return float(metrics["jct_s"]["avg"]), dict(result.timeline.first_start)


def test_learned_claims_put_the_short_jobs_first_and_beat_fifo() -> None:
    corral, starts = _run("corral")
    fifo, fifo_starts = _run("fifo")
    shorts = [starts[f"s{i:02d}"] for i in range(20)]
    longs = [starts[f"l{i}"] for i in range(5)]
    # Once the blocker ends, the twenty 10-minute jobs run four at a time (50 min) before any 5-h job.
    assert max(shorts) < min(longs), (shorts, longs)
    assert max(fifo_starts[f"s{i:02d}"] for i in range(20)) > min(fifo_starts[f"l{i}"] for i in range(5))
    assert corral < 0.8 * fifo, (corral, fifo)
