"""Every bench script runs, at its tiniest size, so a change elsewhere cannot leave one broken unnoticed.

A smoke test, not a benchmark: no figure is checked, only that the script exits 0 and prints one JSON
object as its last line (what bench/RESULTS.md quotes). A new script in bench/ needs its tiny size
here: the test for it fails until it has one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"

#: Script -> the arguments of its tiniest run (None: skipped, with the reason in SKIPPED).
TINY: dict[str, list[str] | None] = {
    "big_gangs.py": ["--seeds", "1", "--jobs", "60"],
    # A chaos run needs minutes to mean anything; tests/faults/test_chaos.py runs the same driver at CI's size.
    "chaos.py": None,
    "cli_start.py": ["--runs", "1"],
    "coldread.py": ["--jobs", "30", "--events", "500", "--rounds", "1"],
    "followups.py": ["--nodes", "16", "--fail", "16", "--jobs", "60"],
    "deliveries.py": ["--nodes", "2,4", "--settle-s", "2"],
    "up_scale.py": ["--nodes", "4", "--jobs", "20", "--timeout", "150"],
    "failure_detection.py": ["--nodes", "4", "--rounds", "1", "--heartbeat", "0.5", "--heartbeat-timeout", "2"],
    "gang_starts.py": ["--nodes", "2", "--gangs", "3", "--run-s", "0.1"],
    # Fake GPUs (no driver here); on a GPU machine it runs on the real ones without --fake-gpus.
    "gpu_health_watch.py": ["--seconds", "1", "--poll", "0.2", "--fake-gpus", "8"],
    # Every reader and query once on a 60-job history (each a real `corral` process).
    "history.py": ["--jobs", "60", "--runs", "1", "--timeout", "120"],
    "load.py": ["--jobs", "4", "--clients", "1", "--nodes", "2", "--gpus", "8", "--agent-procs", "1",
                "--timeout", "60"],
    "jct_breakdown.py": ["--jobs", "60", "--load", "1.2", "--set-b", "starvation_bound_factor=1.0", "--log-checkpoints"],
    "locality.py": ["--jobs", "60", "--nodes", "4", "--datasets", "4"],
    "policy_variant.py": ["--jobs", "60", "--load", "1.2", "--set", "starvation_bound_factor=1.0", "--log-checkpoints"],
    "rebuild.py": ["--events", "2000", "--tail", "100", "--rounds", "1"],
    "replay.py": ["--events", "2000", "--rounds", "1"],
    "scale.py": ["--nodes", "4", "--waiting", "20", "--duration", "2"],
    "scheduler.py": ["--nodes", "8", "--jobs", "40", "--fold-events", "2000", "--burst", "20", "--latency-s", "0.2"],
    "scheduler_e2e.py": ["--nodes", "8", "--latency-s", "0.2", "--rate", "20", "--burst", "20"],
    "sim.py": ["--jobs", "60", "--policies", "corral,fifo", "--no-logs"],
    "sim_speed.py": ["--nodes", "32", "--queues", "2", "--jobs", "60", "--rounds", "1"],
    "staging.py": ["--mb", "4", "--rounds", "1"],
    "sweep.py": ["--jobs", "60", "--loads", "0.5,1.2", "--policies", "corral,fifo"],
    # The web UI on a 60-job history: first bytes, 0/1/3 live browsers, the scheduler with 0/3/0 browsers.
    "ui.py": ["--jobs", "60", "--seconds", "2", "--clients", "3", "--requests", "3", "--up-jobs", "5",
              "--up-rate", "10"],
    # Needs Chromium and a minute of a 4-node `corral up`; its output is the README's screenshots, and
    # tests/cli/test_webui.py drives the same pages in the same browser.
    "ui_screenshots.py": None,
}


@pytest.mark.parametrize("script", sorted(p.name for p in BENCH.glob("*.py")))
def test_bench_script_runs_at_its_tiniest_size(script: str, tmp_path: Path) -> None:
    assert script in TINY, f"bench/{script} has no tiny size in tests/test_bench_smoke.py: give it one"
    args = TINY[script]
    if args is None:
        pytest.skip(f"bench/{script}: a long run by nature, tested elsewhere (see TINY)")
    proc = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True, text=True,
                          cwd=tmp_path, timeout=180)
    assert proc.returncode == 0, f"bench/{script} exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    lines = proc.stdout.strip().splitlines()
    assert lines, f"bench/{script} printed nothing"
    figures = json.loads(lines[-1])
    assert isinstance(figures, dict) and figures, f"bench/{script}: last line is not one JSON object: {lines[-1]}"
    if script == "history.py":  # acceptance 4 of #28: the restarted agent holds what a fresh fold does
        assert figures["readers"]["agent"]["digest"]["equal"] is True, figures["readers"]["agent"]
