"""The generator: deterministic by seed, with the shape it promises."""

from __future__ import annotations

import math

from orchestrator.sim.gen import DAY_S, GenConfig, generate, standard_cluster, window_load

CLUSTER = standard_cluster()  # 352 x 8 GPUs, 11 teams


def test_same_seed_same_trace_other_seed_other_trace() -> None:
    a = generate(CLUSTER, GenConfig(jobs=500, seed=3, node_mtbf_days=30))
    assert a == generate(CLUSTER, GenConfig(jobs=500, seed=3, node_mtbf_days=30))
    assert a.jobs != generate(CLUSTER, GenConfig(jobs=500, seed=4)).jobs


def test_shape_most_jobs_one_gpu_most_gpu_time_in_big_gangs() -> None:
    trace = generate(CLUSTER, GenConfig(jobs=20_000, seed=1))
    jobs = trace.jobs
    assert sum(j.num_gpus == 1 for j in jobs) / len(jobs) > 0.5
    work = [j.num_gpus * j.duration for j in jobs]
    big = sum(w for w, j in zip(work, jobs, strict=True) if 8 <= j.num_gpus <= 128)
    assert big / sum(work) > 0.7
    durations = sorted(j.duration for j in jobs)
    assert durations[len(durations) // 2] < 3600  # most jobs run minutes ...
    assert durations[-1] > DAY_S  # ... a few run days
    assert all(j.time_limit is not None and j.time_limit >= j.duration for j in jobs)
    # Bigger gangs run longer (training runs against short single-GPU debugging runs).
    def median(gpus: set[int]) -> float:
        ds = sorted(j.duration for j in jobs if j.num_gpus in gpus)
        return ds[len(ds) // 2]

    assert median({64, 128}) > 5 * median({1})
    teams = {j.queue for j in jobs}
    assert len(teams) == 11
    counts = sorted((sum(j.queue == q for j in jobs) for q in teams), reverse=True)
    assert counts[0] > 2 * counts[-1]  # teams with different loads


def test_offered_load_is_the_load_inside_the_arrival_window_and_daily_cycle() -> None:
    trace = generate(CLUSTER, GenConfig(jobs=20_000, seed=2, load=0.9))
    jobs = trace.jobs
    assert math.isclose(window_load(trace, CLUSTER.total_gpus), 0.9, rel_tol=0.01)
    # All the work over the window is more: day-long gangs run on after the last arrival.
    span = jobs[-1].submit_time - jobs[0].submit_time
    assert sum(j.num_gpus * j.duration for j in jobs) / (span * CLUSTER.total_gpus) > 0.95
    # The rate peaks in the first half of each day (the sine is positive there).
    first_half = sum(1 for j in jobs if (j.submit_time % DAY_S) < DAY_S / 2)
    assert first_half / len(jobs) > 0.55
