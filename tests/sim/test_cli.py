"""`sim gen` then `sim` end to end through the argparse entry point (tiny sizes)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.cli.sim import main
from orchestrator.sim.baselines import POLICY_NAMES, parse_policies
from orchestrator.sim.cluster import parse_cluster, setup_events
from orchestrator.sim.replay import fold_log
from orchestrator.sim.specs import DURATION_ENV
from orchestrator.sim.table import ROWS
from orchestrator.sim.trace import load_trace
from schemas import JobSpec, JobSubmitted
from schemas.codec import encode


def test_gen_then_sim_writes_logs_metrics_table_and_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace, cluster, outages = tmp_path / "t.csv", tmp_path / "c.yaml", tmp_path / "o.csv"
    assert main(["gen", "--nodes", "4", "--queues", "3", "--jobs", "60", "--seed", "5", "--out", str(trace),
                 "--cluster-out", str(cluster), "--node-mtbf-days", "2", "--outages-out", str(outages)]) == 0
    assert "60 jobs" in capsys.readouterr().out
    out = tmp_path / "out"
    code = main(["--trace", str(trace), "--cluster", str(cluster), "--outages", str(outages),
                 "--policy", "corral,fifo", "--out", str(out), "--json"])
    assert code == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(figures) == {"corral", "fifo", "comparison"}
    assert figures["comparison"]["avg_jct_fifo_over_corral"] > 0
    for name in ("events-corral.jsonl", "events-fifo.jsonl", "metrics.json", "table.txt", "jct_cdf.png",
                 "allocation.png", "queue_shares.png", "share_vs_fair.png"):
        assert (out / name).stat().st_size > 0, name
    assert fold_log(out / "events-fifo.jsonl").jobs.keys() == fold_log(out / "events-corral.jsonl").jobs.keys()
    # And a re-run of the corral log under drf, from the log alone.
    code = main(["--from-log", str(out / "events-corral.jsonl"), "--policy", "drf", "--out", str(tmp_path / "rerun"),
                 "--no-figures"])
    assert code == 0
    assert "drf" in capsys.readouterr().out


def test_bad_input_exits_2_with_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,submit_time,duration,num_gpus,queue\nj,0,ten,1,q\n")
    cluster = tmp_path / "c.yaml"
    cluster.write_text("nodes: 1\nqueues: [{name: q}]\n")
    assert main(["--trace", str(trace), "--cluster", str(cluster), "--out", str(tmp_path / "o")]) == 2
    assert f"{trace}:2: duration must be a number of seconds, got 'ten'" in capsys.readouterr().err
    assert main(["--trace", str(trace), "--cluster", str(cluster), "--policy", "sjf"]) == 2
    assert "unknown policy sjf" in capsys.readouterr().err


def test_help_describes_the_formats(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "job_id,submit_time,duration,num_gpus,queue" in text
    assert "--from-log" in text and "--checkpoint-interval" in text


def _log_with_an_unknown_queue(path: Path) -> Path:
    """A log whose one job asks for a queue the cluster lacks: the scheduler rejects it at run time."""
    cluster = parse_cluster({"nodes": 1, "gpus_per_node": 4, "queues": [{"name": "a"}], "min_runtime_s": 0})
    job = JobSubmitted(event_id="s", occurred_at=1.0, job_id="j1", submitted_by="t",
                       spec=JobSpec(name="j1", queue="nope", env={DURATION_ENV: "60"}))
    path.write_bytes(b"".join(encode(e) + b"\n" for e in [*setup_events(cluster), job]))
    return path


def _strict_json(text: str) -> Any:
    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_rejected_jobs_are_counted_and_nothing_is_nan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = _log_with_an_unknown_queue(tmp_path / "log.jsonl")
    out = tmp_path / "out"
    assert main(["--from-log", str(log), "--policy", "fifo", "--out", str(out), "--no-figures"]) == 0
    captured = capsys.readouterr()
    assert re.search(r"^jobs rejected +1$", captured.out, re.M) and re.search(r"^avg JCT \(h\) +-$", captured.out, re.M)
    assert "fifo: 0 jobs completed, 1 rejected, no JCT (no job completed)," in captured.err
    assert "nan" not in captured.err
    metrics = _strict_json((out / "metrics.json").read_text())
    assert metrics["policies"]["fifo"]["rejected"] == 1 and metrics["policies"]["fifo"]["jct_s"]["avg"] is None
    assert main(["--from-log", str(log), "--policy", "fifo", "--out", str(out), "--no-figures", "--json"]) == 0
    figures = _strict_json(capsys.readouterr().out)["fifo"]
    assert (figures["completed"], figures["rejected"], figures["failed"], figures["unfinished"]) == (1 - 1, 1, 0, 0)
    assert figures["avg_jct_h"] is None


def test_json_has_every_row_of_the_table_as_a_number(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace, cluster = tmp_path / "t.csv", tmp_path / "c.yaml"
    trace.write_text("job_id,submit_time,duration,num_gpus,queue\na,0,3600,2,q\nb,60,1800,2,q\n")
    cluster.write_text("nodes: 1\ngpus_per_node: 2\nqueues: [{name: q}]\n")
    assert main(["--trace", str(trace), "--cluster", str(cluster), "--out", str(tmp_path / "o"), "--no-figures",
                 "--json"]) == 0
    figures = _strict_json(capsys.readouterr().out)["corral"]
    assert list(figures) == [row.key for row in ROWS]
    assert all(v is None or isinstance(v, (int, float)) for v in figures.values())
    assert (figures["completed"], figures["median_jct_h"], figures["makespan_d"]) == (2, 1.242, 0.0625)
    # a runs 0-3600 s, b waits for its GPUs from 60 s and runs 3600-5400 s: JCTs 1 h and 1.483 h.


def test_from_log_is_checked_like_a_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = _log_with_an_unknown_queue(tmp_path / "log.jsonl")
    cluster = tmp_path / "c.yaml"
    cluster.write_text("nodes: 2\ngpus_per_node: 4\nqueues: [{name: a}, {name: b, limit_gpus: 2}]\n")
    assert main(["--from-log", str(log), "--cluster", str(cluster), "--out", str(tmp_path / "o")]) == 2
    assert f"{log}:5: job j1: queue 'nope' is not in the cluster spec" in capsys.readouterr().err
    assert main(["--from-log", str(log), "--trace", str(log), "--out", str(tmp_path / "o")]) == 2
    assert "give --trace FILE or --from-log FILE, not both" in capsys.readouterr().err
    assert main(["--from-log", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "o")]) == 4
    assert capsys.readouterr().err == f"corral sim: error: --from-log {tmp_path / 'nope.jsonl'}: no such file\n"


def test_a_corrupt_log_line_is_reported_not_skipped_silently(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    log = _log_with_an_unknown_queue(tmp_path / "log.jsonl")
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join([*lines[:2], b'{"type": "JobSub\n', *lines[2:]]))
    assert main(["--from-log", str(log), "--out", str(tmp_path / "o"), "--no-figures"]) == 0
    assert (f"corral sim: warning: {log}: 1 line(s) are not events this version reads (corrupt JSON or a newer "
            "event type), left out of the re-run: line 3") in capsys.readouterr().err


def test_out_reuse_removes_only_what_an_earlier_run_wrote(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = _log_with_an_unknown_queue(tmp_path / "log.jsonl")
    out = tmp_path / "out"
    out.mkdir()
    for name in ("events-las.jsonl", "events-fifo.jsonl", "jct_cdf.png", "notes.txt", "events-mine.jsonl"):
        (out / name).write_text("old")
    assert main(["--from-log", str(log), "--policy", "drf", "--out", str(out), "--no-figures"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["events-drf.jsonl", "events-mine.jsonl", "metrics.json",
                                                     "notes.txt", "table.txt"]
    capsys.readouterr()
    assert main(["--from-log", str(log), "--out", str(out / "notes.txt")]) == 2
    assert capsys.readouterr().err == f"corral sim: error: --out {out / 'notes.txt'}: is a file, not a directory\n"


def test_policy_all_stands_alone(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--policy", "all,fifo"]) == 2
    assert "'all' stands alone (every policy); got 'all,fifo'" in capsys.readouterr().err
    assert parse_policies(" all ") == list(POLICY_NAMES)


def test_guarantees_over_the_cluster_are_warned_about(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace, cluster = tmp_path / "t.csv", tmp_path / "c.yaml"
    trace.write_text("job_id,submit_time,duration,num_gpus,queue\na,0,60,1,q\n")
    cluster.write_text("nodes: 1\ngpus_per_node: 2\nqueues: [{name: q, guaranteed_gpus: 2}, {name: r, guaranteed_gpus: 2}]\n")
    assert main(["--trace", str(trace), "--cluster", str(cluster), "--out", str(tmp_path / "o"), "--no-figures"]) == 0
    assert f"corral sim: warning: {cluster}: the queues' guarantees add up to 4 GPUs" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "message"), [
    (["--queues", "0"], "--queues must be >= 1, got 0"),
    (["--nodes", "0"], "--nodes must be >= 1, got 0"),
    (["--node-mtbf-days", "2"], "--node-mtbf-days needs --outages-out FILE"),
])
def test_gen_refuses_what_it_cannot_make(args: list[str], message: str, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gen", "--jobs", "5", "--out", str(tmp_path / "t.csv"), *args]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "t.csv").exists()


def test_gen_spreads_a_few_jobs_on_a_big_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """50 jobs cannot keep 2,816 GPUs 90% busy: the span used to shrink to nothing (every job at 0.0)."""
    trace = tmp_path / "t.csv"
    assert main(["gen", "--jobs", "50", "--out", str(trace)]) == 0
    times = [j.submit_time for j in load_trace(trace).jobs]
    assert len(set(times)) == 50 and times[-1] > 600
    assert "50 jobs are too few to keep 2816 GPUs 90% busy" in capsys.readouterr().err


def test_help_points_to_the_readme_whose_cluster_example_loads(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert 'the README, section "Simulating a workload"' in text and "cluster.py" not in text
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## Simulating a workload", 1)[1].split("\n## ", 1)[0]
    example = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert example is not None
    spec = parse_cluster(yaml.safe_load(example.group(1)))
    assert spec.total_gpus == 8 and [q.limit_gpus for q in spec.queues] == [None, 6]
    for words in ("leaf:require", "preemptible` (default true)", "incl. drain", "received / fair", "jobs rejected"):
        assert words in section, words
