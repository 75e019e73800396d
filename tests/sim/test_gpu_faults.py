"""GPU faults in the simulator (issue #32): from the outage trace into the log, their cost in the metrics."""

from __future__ import annotations

import io
import math
from pathlib import Path

import pytest

from orchestrator.sim.engine import SimConfig, simulate
from orchestrator.sim.gen import GenConfig, generate, standard_cluster
from orchestrator.sim.metrics import summarize
from orchestrator.sim.replay import from_log
from orchestrator.sim.trace import Outage, TraceJob, read_outages, write_outages
from schemas import decode
from tests.faults.gpu_fault_check import work_on_faulted_gpus
from tests.sim.conftest import scenario, tiny_cluster


def test_a_gpu_fault_requeues_its_gang_from_the_checkpoint_and_takes_the_gpu_out_until_it_ends() -> None:
    """j (8 GPUs, 300 s of work, checkpoint every 100 s) runs on the only node from 0; GPU 3 fails at 150 for
    1000 s. j is requeued at once with 100 s saved, waits for GPU 3 (no 8 free GPUs), restarts at 1150 with a
    20 s overhead: 1150 + 20 + 200 = 1370. k (1 GPU, submitted at 200) runs beside it on a healthy GPU.
    Lost: (50 s of work + 20 s overhead) x 8 GPUs; out of service: 1000 GPU-seconds.
    """
    cluster = tiny_cluster(nodes=1, gpus_per_node=8, queues=[{"name": "a"}])
    jobs = [TraceJob("j", 0, 300, 8, "a"), TraceJob("k", 200, 100, 1, "a")]
    result = simulate(scenario(cluster, jobs, [Outage("n0000", 150, 1000, gpu=3)]), "corral",
                      SimConfig(checkpoint_interval_s=100, restart_overhead_s=20, strict=True))
    tl = result.timeline
    assert tl.end["j"] == 1370 and tl.requeues == 1
    assert result.state.jobs["j"].restarts == 0
    assert tl.first_start["k"] == 200 and 3 not in result.state.jobs["k"].placement[0].gpus
    m = summarize(result)
    assert m["gpu_faults"] == 1
    assert m["gpu_hours_lost_to_gpu_faults"] * 3600 == pytest.approx(70 * 8)
    assert m["gpu_hours_out_of_service"] * 3600 == pytest.approx(1000)
    assert m["gpu_hours_lost_to_failures"] == 0


def test_gpu_faults_round_trip_through_the_outages_csv() -> None:
    outs = [Outage("n0000", 5.0, 60.0), Outage("n0001", 7.5, math.inf, gpu=2)]
    buf = io.StringIO()
    write_outages(outs, buf)
    assert buf.getvalue().splitlines()[0] == "node_id,time,duration,gpu"
    back = read_outages(io.StringIO(buf.getvalue()))
    assert [(o.node_id, o.time, o.duration, o.gpu) for o in back] == [(o.node_id, o.time, o.duration, o.gpu)
                                                                        for o in outs]
    plain = io.StringIO()
    write_outages(outs[:1], plain)
    assert plain.getvalue().splitlines()[0] == "node_id,time,duration"  # files without GPU faults as before
    with pytest.raises(ValueError, match="gpu must be a GPU index"):
        read_outages(io.StringIO("node_id,time,duration,gpu\nn0,1,2,x\n"))


@pytest.mark.slow
def test_two_thousand_jobs_with_twenty_gpu_faults_report_the_hours_lost_and_never_use_a_faulted_gpu(
        tmp_path: Path) -> None:
    """Acceptance 5: the standard generator's 2,000 jobs on 16 nodes x 8 GPUs, 20 GPU faults."""
    cluster = standard_cluster(16, 8, 4)
    trace = generate(cluster, GenConfig(jobs=2000, load=0.9, seed=7, gpu_faults=20))
    assert sum(o.gpu is not None for o in trace.outages) == 20
    log = io.BytesIO()
    result = simulate(scenario(cluster, trace.jobs, trace.outages), "corral", log=log)
    m = summarize(result)
    assert m["gpu_faults"] == 20
    assert m["gpu_hours_out_of_service"] > 0 and m["gpu_hours_lost_to_gpu_faults"] > 0
    assert m["unfinished"] == 0
    events = [(n, decode(line)) for n, line in enumerate(log.getvalue().splitlines(), 1)]
    assert sum(type(e).__name__ == "GpuUnhealthy" for _, e in events) == 20
    assert not work_on_faulted_gpus(events)
    # `corral sim --from-log` re-runs the same GPU faults.
    path = tmp_path / "events.jsonl"
    path.write_bytes(log.getvalue())
    again = from_log(path).scenario.outages
    assert sorted((o.node_id, o.gpu, o.time, round(o.duration, 3)) for o in again) == sorted(
        (o.node_id, o.gpu, o.time, round(o.duration, 3)) for o in trace.outages)
    print(f"2000 jobs, 20 GPU faults: {m['gpu_hours_lost_to_gpu_faults']:.0f} GPU-h of work lost, "
          f"{m['gpu_hours_out_of_service']:.0f} GPU-h out of service, avg JCT {m['jct_s']['avg'] / 3600:.2f} h")
