"""Dataset staging in the simulator (issue #33): staging time from size and bandwidth, node caches (LRU),
warm-node placement against none, and the inputs that carry datasets (trace columns, `sim gen`, the CLI)."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli.sim import main
from orchestrator.sim.baselines import policies_for
from orchestrator.sim.cluster import setup_events
from orchestrator.sim.engine import Scenario, SimConfig, simulate
from orchestrator.sim.gen import GenConfig, generate, standard_cluster
from orchestrator.sim.locality import compare_locality
from orchestrator.sim.replay import from_log, read_log
from orchestrator.sim.specs import sim_jobs
from orchestrator.sim.trace import TraceError, TraceJob, load_trace, parse_datasets, write_trace
from schemas.events import DatasetEvicted, DatasetReady, WorkerStarted
from tests.sim.conftest import scenario, tiny_cluster


def job(jid: str, t: float, gpus: int, duration: float, datasets: tuple[tuple[str, float], ...] = (),
        locality: str = "prefer") -> TraceJob:
    return TraceJob(jid, t, duration, gpus, "a", datasets=datasets, locality=locality, time_limit=None)


def _run(jobs: list[TraceJob], *, prefer_warm: bool = True, **config: Any) -> tuple[Any, list[Any]]:
    sc = scenario(tiny_cluster(2, 8, queues=[{"name": "a"}]), jobs)
    buf = io.BytesIO()
    pol = replace(policies_for("corral"), prefer_warm=prefer_warm)
    r = simulate(sc, "corral", SimConfig(strict=True, **config), log=buf, policies=pol)
    return r, _events(buf.getvalue())


def _events(raw: bytes) -> list[Any]:
    from schemas.codec import decode

    return [decode(line) for line in raw.splitlines() if line]


WARM_SETUP = [
    job("f0", 0, 7, 100_000),                        # n0 keeps 1 GPU free
    job("a", 1, 2, 1000, (("imagenet", 100),)),     # -> n1, stages 100 GB at 1 GB/s: starts at 101
    job("f1", 2, 4, 100_000),                        # -> n1: it is no longer idle
    job("b", 2000, 1, 1000, (("imagenet", 100),)),  # best fit: n0 (1 free, cold); warm: n1 (4 free)
]


def test_staging_delays_the_start_and_counts_in_jct() -> None:
    r, events = _run(WARM_SETUP)
    tl = r.timeline
    started = {e.job_id: e.occurred_at for e in events if isinstance(e, WorkerStarted)}
    assert started["a"] == pytest.approx(101.0)
    assert tl.end["a"] - tl.submit["a"] == pytest.approx(1100.0)  # 100 s staging + 1000 s of work
    ready = [e for e in events if isinstance(e, DatasetReady) and e.job_id == "a"]
    assert [(e.node_id, e.cached, e.staged_bytes) for e in ready] == [("n0001", False, 100 * 10**9)]
    assert r.state.nodes["n0001"].datasets == (ready[0].key,)
    assert r.staging is not None and r.staging.bytes_staged == 2 * 100 * 10**9 - 100 * 10**9  # b hit the cache


def test_warm_node_saves_the_staging_that_best_fit_would_pay() -> None:
    warm, events = _run(WARM_SETUP)
    b = [e for e in events if isinstance(e, DatasetReady) and e.job_id == "b"]
    assert [(e.node_id, e.cached) for e in b] == [("n0001", True)]
    assert warm.timeline.end["b"] - warm.timeline.submit["b"] == pytest.approx(1000.0)
    cold, events = _run(WARM_SETUP, prefer_warm=False)
    b = [e for e in events if isinstance(e, DatasetReady) and e.job_id == "b"]
    assert [(e.node_id, e.cached) for e in b] == [("n0000", False)]
    assert cold.timeline.end["b"] - cold.timeline.submit["b"] == pytest.approx(1100.0)
    assert cold.staging is not None and warm.staging is not None
    assert cold.staging.seconds == pytest.approx(200.0) and warm.staging.seconds == pytest.approx(100.0)


def test_one_link_per_node_and_one_copy_per_dataset() -> None:
    """Two jobs on one node: the second dataset waits for the first on the node's link; a third job asking for
    a dataset in flight waits for that copy instead of making another."""
    r, events = _run([job("x", 0, 1, 500, (("d1", 50),)), job("y", 0.5, 1, 500, (("d2", 30),)),
                      job("z", 0.7, 1, 500, (("d1", 50),))])
    started = {e.job_id: e.occurred_at for e in events if isinstance(e, WorkerStarted)}
    nodes = {e.job_id: e.node_id for e in events if isinstance(e, WorkerStarted)}
    assert len(set(nodes.values())) == 1  # best fit keeps the three 1-GPU jobs on one node
    assert sorted(started.values()) == pytest.approx([50.0, 50.0, 80.0])
    assert r.staging is not None and r.staging.bytes_staged == 80 * 10**9 and r.staging.hits == 1


def test_lru_evicts_the_least_recently_used_unused_dataset_and_never_one_in_use() -> None:
    r, events = _run([job("x", 0, 1, 100, (("d1", 100),)), job("y", 1000, 1, 100, (("d2", 100),)),
                      job("p", 2000, 1, 5000, (("d2", 100),)), job("q", 2001, 1, 5000, (("d3", 100),))],
                     cache_gb=150)
    evicted = [(e.node_id, e.key, e.occurred_at) for e in events if isinstance(e, DatasetEvicted)]
    keys = {e.dataset: e.key for e in events if isinstance(e, DatasetReady)}
    # d2 landing evicts d1 (unused); d3 lands while p runs on d2: over the size, but d2 stays.
    assert [(k, at) for _, k, at in evicted] == [(keys["d1"], 1100.0)]
    node = evicted[0][0]
    assert set(r.state.nodes[node].datasets) == {keys["d2"], keys["d3"]}


def test_traces_without_datasets_stage_nothing() -> None:
    r, events = _run([job("x", 0, 1, 100), job("y", 5, 8, 100)])
    assert r.staging is None
    assert not any(isinstance(e, (DatasetReady, DatasetEvicted)) for e in events)


def test_trace_columns_round_trip_and_bad_ones_are_told(tmp_path: Path) -> None:
    assert parse_datasets("imagenet:150; tokens:40.5") == (("imagenet", 150.0), ("tokens", 40.5))
    jobs = [job("x", 0, 1, 100, (("imagenet", 150.0),), "require"), job("y", 1, 1, 100)]
    p = tmp_path / "t.csv"
    with p.open("w") as f:
        write_trace(jobs, f)
    assert load_trace(p).jobs[0].datasets == (("imagenet", 150.0),) and load_trace(p).jobs[0].locality == "require"
    plain = tmp_path / "plain.csv"
    with plain.open("w") as f:
        write_trace([job("y", 1, 1, 100)], f)
    assert "datasets" not in plain.read_text()  # a trace without datasets keeps its columns
    bad = tmp_path / "bad.csv"
    bad.write_text("job_id,submit_time,duration,num_gpus,queue,datasets,locality\n"
                   "a,0,10,1,q,9lives:10,prefer\nb,0,10,1,q,x:-1,\nc,0,10,1,q,x:1,sometimes\n")
    with pytest.raises(TraceError) as e:
        load_trace(bad)
    assert len(e.value.problems) == 3 and "bad.csv:2" in e.value.problems[0]


def test_gen_datasets_come_from_a_shared_pool_and_leave_other_traces_alone() -> None:
    cluster = standard_cluster(nodes=4, queues=2, leaf_nodes=2, block_leaves=2)
    plain = generate(cluster, GenConfig(jobs=200, seed=3))
    with_data = generate(cluster, GenConfig(jobs=200, seed=3, datasets=5, dataset_gb=50))
    assert [j._replace(datasets=(), locality="prefer") for j in with_data.jobs] == list(plain.jobs)
    names = [j.datasets[0][0] for j in with_data.jobs]
    assert len(set(names)) <= 5 and len(names) == 200  # reuse: 200 jobs on at most 5 datasets
    assert names.count("ds000") > names.count("ds004")  # popular ones more often


def test_locality_comparison_and_the_log_replays_with_sizes(tmp_path: Path) -> None:
    cluster = standard_cluster(nodes=8, queues=2, leaf_nodes=2, block_leaves=2)
    trace = generate(cluster, GenConfig(jobs=150, seed=2, datasets=6, dataset_gb=300, load=0.8))
    sc = Scenario(tuple(setup_events(cluster)), tuple(sim_jobs(trace.jobs, cluster)))
    c = compare_locality(sc, "corral", SimConfig(cache_gb=600))
    f = c.figures()
    assert f["locality"]["completed"] == f["no_locality"]["completed"] == 150
    assert f["locality"]["cache_hit_rate"] > f["no_locality"]["cache_hit_rate"]
    assert f["locality"]["tb_staged"] < f["no_locality"]["tb_staged"]
    assert "avg JCT without locality / with" in c.table()
    # A run's log carries the sizes: re-run from it, the staging is the same.
    log = tmp_path / "events.jsonl"
    with log.open("wb") as fh:
        first = simulate(sc, "corral", SimConfig(cache_gb=600), log=fh)
    again = simulate(from_log(log).scenario, "corral", SimConfig(cache_gb=600))
    assert first.staging is not None and again.staging is not None
    assert again.staging.bytes_staged == first.staging.bytes_staged
    assert any(isinstance(e, DatasetReady) for e in read_log(log))


def test_cli_gen_with_datasets_then_locality_compare(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace, cluster = tmp_path / "t.csv", tmp_path / "c.yaml"
    assert main(["gen", "--nodes", "4", "--queues", "2", "--jobs", "80", "--seed", "4", "--datasets", "4",
                 "--dataset-gb", "200", "--out", str(trace), "--cluster-out", str(cluster)]) == 0
    capsys.readouterr()
    out = tmp_path / "out"
    assert main(["--trace", str(trace), "--cluster", str(cluster), "--out", str(out), "--locality-compare",
                 "--staging-gbps", "0.5", "--cache-gb", "400", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert figures["jobs"] == 80 and figures["avg_jct_no_locality_over_locality"] is not None
    assert json.loads((out / "locality.json").read_text()) == figures
    assert main(["--trace", str(trace), "--cluster", str(cluster), "--out", str(out), "--no-figures",
                 "--no-locality"]) == 0
    assert "dataset cache hit rate (%)" in capsys.readouterr().out
    assert main(["--trace", str(trace), "--cluster", str(cluster), "--out", str(out), "--staging-gbps", "0"]) == 2
    assert "--staging-gbps must be > 0" in capsys.readouterr().err
