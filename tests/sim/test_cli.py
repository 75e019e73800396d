"""`sim gen` then `sim` end to end through the argparse entry point (tiny sizes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.sim.__main__ import main
from orchestrator.sim.replay import fold_log


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
