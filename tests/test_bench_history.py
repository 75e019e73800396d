"""`bench/history.py --compare`: the issue's targets (#28 acceptance 1) read off two runs' results.

Two hand-written results (the shape history.py prints as its last line), so every verdict below is
known without running a history; the smoke test runs the bench itself (tests/test_bench_smoke.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def result(jobs: int, scale: float, *, job_rc: int = 0, since: bool = True) -> dict[str, Any]:
    def fig(s: float, rc: int = 0) -> dict[str, Any]:
        return {"s": s, "runs": [s], "rc": rc, "lines": 1}

    return {
        "jobs": jobs, "stream_bytes": int(1_000_000 * scale), "bytes_per_job": 5900,
        "asked": {"jobs_all_args": ["--all", "--by-user", "sim", *(["--since", "2026-01-01T00:00:00"] if since else [])]},
        "readers": {"scheduler_cold": {"s": 40.0 * scale}, "jobs_cold": {"s": 30.0 * scale},
                    "scheduler": {"s": 1.0}, "agent": {"s": 2.0 * scale}, "jobs": fig(0.5), "nodes": fig(0.5)},
        "queries": {"usage": fig(0.4), "explain": fig(0.9 * scale), "job": fig(0.3, job_rc), "jobs_all": fig(0.6)},
        "services": {"index": True, "index_ready": {"s": 2.0}},
        "cli_floor": fig(0.3),
    }


def compare(tmp_path: Path, a: dict[str, Any], b: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text("progress line\n" + json.dumps(a) + "\n")
    pb.write_text(json.dumps(b) + "\n")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "history.py"), "--compare", str(pa), str(pb)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    return lines, json.loads(lines[-1])


def test_targets_met_when_every_figure_is_flat_and_small(tmp_path: Path) -> None:
    lines, out = compare(tmp_path, result(50_000, 1.0), result(500_000, 1.0))
    assert out["all_met"] is True
    assert "MET: reader:agent <= 3 s" in lines and "MET: query:explain ratio <= 1.5" in lines
    assert not any(ln.startswith("NOT MET") for ln in lines)
    # Readers that start where no snapshot can exist, and the floor, are reported without a target.
    assert out["ratios"]["reader:scheduler_cold"] == 1.0 and out["ratios"]["cli_floor"] == 1.0
    assert not any("scheduler_cold" in t or "cli_floor" in t for t in out["targets"])


def test_growing_figures_and_unanswered_queries_are_not_met(tmp_path: Path) -> None:
    lines, out = compare(tmp_path, result(50_000, 1.0), result(500_000, 2.0, job_rc=4, since=False))
    assert out["all_met"] is False
    t = out["targets"]
    assert t["reader:agent <= 3 s"] is False  # 4 s
    assert t["reader:agent ratio <= 1.5"] is False  # 2x
    assert t["query:explain <= 1 s"] is False and t["query:explain ratio <= 1.5"] is False  # 1.8 s, 2x
    assert t["stream_bytes ratio <= 1.5"] is False
    assert t["query:job <= 1 s"] is True and t["query:job answered (exit 4)"] is False
    assert t["query:usage <= 1 s"] is True and t["reader:scheduler ratio <= 1.5"] is True
    assert "NOT MET: query:job answered (exit 4)" in lines
    assert any(ln.startswith("NOTE: query:jobs_all ran without --since") for ln in lines)
    assert out["ratios"]["reader:agent"] == 2.0


def test_a_file_that_is_not_a_result_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("not json\n")
    good = tmp_path / "good.json"
    good.write_text(json.dumps(result(50_000, 1.0)) + "\n")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "history.py"), "--compare", str(good), str(bad)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "bad.json" in proc.stderr and "not JSON" in proc.stderr
