"""`corral sim --load`: a load sweep through the CLI's parser, in-process (tiny cluster, a few hundred jobs) (#20)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli.sim import main
from orchestrator.sim.cluster import parse_cluster, setup_events
from orchestrator.sim.engine import Scenario
from orchestrator.sim.replay import read_log
from orchestrator.sim.specs import sim_jobs
from orchestrator.sim.sweep import SWEEP_FIGURES, at_load, offered_load, parse_loads
from orchestrator.sim.trace import Outage, TraceJob
from schemas import JobSubmitted

#: Figures that time the simulator, not what it decided.
TIMED = {"sim_wall_s", "jobs_per_s"}
POLICIES = "corral,fifo"


def _decided(figures: dict[str, Any]) -> dict[str, Any]:
    """A single run's `--json` (or one load of a sweep's) without the wall-clock figures."""
    return {name: {k: v for k, v in f.items() if k not in TIMED} if name != "comparison" else f
            for name, f in figures.items()}


def _json(capsys: pytest.CaptureFixture[str]) -> Any:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text("nodes: 4\ngpus_per_node: 8\nqueues: [{name: a, weight: 2}, {name: b}]\nmin_runtime_s: 60\n")
    return path


def test_each_load_of_a_generated_sweep_is_the_single_run_of_that_load(
        tmp_path: Path, cluster: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep"
    assert main(["--generate", "200", "--seed", "3", "--cluster", str(cluster), "--load", "0.6,1.1",
                 "--policy", POLICIES, "--out", str(out), "--no-logs", "--json"]) == 0
    swept = _json(capsys)
    assert swept["loads"] == [0.6, 1.1] and set(swept["per_load"]) == {"0.6", "1.1"}
    assert json.loads((out / "metrics.json").read_text()) == swept
    for load in ("0.6", "1.1"):
        trace = tmp_path / f"t{load}.csv"
        assert main(["gen", "--cluster", str(cluster), "--jobs", "200", "--seed", "3", "--load", load,
                     "--out", str(trace)]) == 0
        capsys.readouterr()
        assert main(["--trace", str(trace), "--cluster", str(cluster), "--policy", POLICIES, "--no-figures",
                     "--no-logs", "--out", str(tmp_path / f"single{load}"), "--json"]) == 0
        single = _json(capsys)
        assert _decided(swept["per_load"][load]) == _decided(single), load
        assert json.loads((out / f"load-{load}" / "metrics.json").read_text())["comparison"] == \
            json.loads((tmp_path / f"single{load}" / "metrics.json").read_text())["comparison"]
    # Each policy's figures over the loads are the per-load figures, in the order of --load.
    for policy in ("corral", "fifo"):
        assert swept["sweep"][policy]["avg_jct_h"] == [swept["per_load"][k][policy]["avg_jct_h"] for k in ("0.6", "1.1")]
    for name, *_ in SWEEP_FIGURES:
        assert (out / name).stat().st_size > 0, name
    for name in ("jct_cdf.png", "allocation.png", "table.txt", "metrics.json"):
        assert (out / "load-0.6" / name).stat().st_size > 0, name


def _trace(tmp_path: Path, cluster: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    trace = tmp_path / "t.csv"
    assert main(["gen", "--cluster", str(cluster), "--jobs", "150", "--seed", "4", "--out", str(trace)]) == 0
    capsys.readouterr()
    return trace


def test_a_trace_is_scaled_to_each_load_and_each_load_reruns_from_its_log(
        tmp_path: Path, cluster: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace, out = _trace(tmp_path, cluster, capsys), tmp_path / "sweep"
    assert main(["--trace", str(trace), "--cluster", str(cluster), "--load", "1.2,0.5", "--policy", POLICIES,
                 "--out", str(out), "--no-figures"]) == 0
    text = capsys.readouterr().out
    assert text.index("load 1.2 (offered 1.200)") < text.index("load 0.5 (offered 0.500)") < text.index("\nsweep\n")
    assert "avg JCT (h)" in text and "share err mean" in text
    swept = json.loads((out / "metrics.json").read_text())
    assert swept["offered"] == [1.2, 0.5]
    # The arrivals were scaled about the first one: every gap between arrivals by the same factor.
    submitted = [e.occurred_at for e in read_log(out / "load-0.5" / "events-corral.jsonl")
                 if isinstance(e, JobSubmitted)]
    fast = [e.occurred_at for e in read_log(out / "load-1.2" / "events-corral.jsonl")
            if isinstance(e, JobSubmitted)]
    factor = (submitted[-1] - submitted[0]) / (fast[-1] - fast[0])
    assert submitted[0] == fast[0] and factor > 1
    assert all(s - submitted[0] == pytest.approx(factor * (f - fast[0]), abs=1e-3 * (1 + factor))  # each to the ms
               for s, f in zip(submitted, fast, strict=True))
    # A single run of one load's log decides what the sweep did at that load.
    assert main(["--from-log", str(out / "load-0.5" / "events-corral.jsonl"), "--policy", POLICIES,
                 "--no-figures", "--no-logs", "--out", str(tmp_path / "rerun"), "--json"]) == 0
    assert _decided(_json(capsys)) == _decided(swept["per_load"]["0.5"])
    assert not any(out.glob("*.png"))
    # A rerun with other loads removes what the first wrote for loads it does not have.
    (out / "load-1.2" / "notes.txt").write_text("mine")
    assert main(["--trace", str(trace), "--cluster", str(cluster), "--load", "0.8", "--policy", "fifo",
                 "--out", str(out), "--no-figures", "--no-logs"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["load-0.8", "load-1.2", "metrics.json", "table.txt"]
    assert [p.name for p in (out / "load-1.2").iterdir()] == ["notes.txt"]


@pytest.mark.parametrize(("load", "message"), [
    ("", "--load needs one or more offered loads"),
    ("0.5,abc", "--load: 'abc' is not a number"),
    ("0.5,,1", "--load: an empty item in '0.5,,1'"),
    ("0", "each load must be a number > 0"),
    ("-0.5", "each load must be a number > 0"),
    ("nan", "each load must be a number > 0"),
    ("1e9", "each load must be a number > 0 and <= 100"),
    ("0.8,0.80", "--load: 0.80 is given twice"),
    ("50", "load 50 is out of reach for these jobs on 32 GPUs"),
])
def test_a_bad_load_is_a_usage_error_before_anything_runs(
        load: str, message: str, tmp_path: Path, cluster: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace, out = _trace(tmp_path, cluster, capsys), tmp_path / "out"
    assert main(["--trace", str(trace), "--cluster", str(cluster), "--load", load, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("corral sim: error: ") and err.count("\n") == 1 and message in err, err
    assert not out.exists()


def test_generate_makes_the_workload_alone_and_seed_goes_with_it(tmp_path: Path, cluster: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _trace(tmp_path, cluster, capsys)
    assert main(["--generate", "10", "--trace", str(trace), "--cluster", str(cluster), "--load", "1"]) == 2
    assert "--generate makes the workload: give it without --trace" in capsys.readouterr().err
    assert main(["--generate", "0", "--load", "1"]) == 2
    assert "--generate needs at least 1 job, got 0" in capsys.readouterr().err
    assert main(["--trace", str(trace), "--cluster", str(cluster), "--seed", "2", "--load", "1"]) == 2
    assert "--seed goes with --generate JOBS" in capsys.readouterr().err
    # Without --cluster, `sim gen`'s standard cluster: 20 jobs cannot keep its 2,816 GPUs half busy.
    assert main(["--generate", "20", "--load", "0.5", "--policy", "fifo", "--out", str(tmp_path / "o"),
                 "--no-figures", "--no-logs"]) == 0
    assert "corral sim: warning: load 0.5: 20 jobs offer 0." in capsys.readouterr().err


def _scenario(times: list[float], durations: list[float], outages: tuple[Outage, ...] = ()) -> Scenario:
    spec = parse_cluster({"nodes": 1, "gpus_per_node": 4, "queues": [{"name": "q"}]})
    jobs = [TraceJob(job_id=f"j{i}", submit_time=t, duration=d, num_gpus=2, queue="q")
            for i, (t, d) in enumerate(zip(times, durations, strict=True))]
    return Scenario(tuple(setup_events(spec)), tuple(sim_jobs(jobs, spec)), outages)


def test_at_load_scales_the_arrivals_to_the_load() -> None:
    outage = Outage("n0000", 50.0, 10.0)
    base = _scenario([100.0, 200.0, 200.0, 700.0], [300.0, 50.0, 900.0, 100.0], (outage,))
    for load in (0.1, 0.5, 1.0, 1.3):
        scaled = at_load(base, load)
        assert math.isclose(offered_load(scaled), load, rel_tol=1e-4), load
        times = [j.submit_time for j in scaled.jobs]
        assert times[0] == 100.0 and times[1] == times[2] and times == sorted(times)
        assert [j.job_id for j in scaled.jobs] == ["j0", "j1", "j2", "j3"] and scaled.outages == (outage,)
    # Squeezed, their 2-GPU gangs run to the window's end from arrivals at 0, 100, 100 and 600 s of 600: 4/3 of 4 GPUs.
    with pytest.raises(ValueError, match="out of reach"):
        at_load(base, 1.34)
    with pytest.raises(ValueError, match="all arrive at one instant"):
        at_load(_scenario([5.0, 5.0], [60.0, 60.0]), 0.5)


def test_parse_loads_keeps_the_order_given() -> None:
    assert parse_loads(" 1.2, 0.5 ,1") == [1.2, 0.5, 1.0]

