"""`corral up --demo` on the data dir of an earlier run runs a new demo and says so; it never replays the old one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli.errors import FAILURE

pytestmark = pytest.mark.slow


def _demo(data: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    # Workers that crash at step 3 (their restarts run out): a demo that ends quickly, with JobFailed verdicts.
    env = {**os.environ, "CORRAL_LOG_LEVEL": "warning", "WORKER_FAIL_AT_STEP": "3"}
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "up", "--demo", "--port", "0", "--nodes", "2",
         "--gpus-per-node", "2", "--duration", "150", "--data-dir", str(data), "--worker-env", "WORKER_FAIL_AT_STEP"],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=200)


def test_a_second_demo_on_the_same_data_dir_is_a_new_run(tmp_path: Path) -> None:
    data = tmp_path / "corral"
    first = _demo(data, tmp_path)
    assert first.returncode == FAILURE and "demo-ddp-2node (JobFailed)" in first.stdout, first.stdout[-3000:]
    assert "earlier demo run" not in first.stdout
    second = _demo(data, tmp_path)
    out = second.stdout
    demo_lines = [ln for ln in out.splitlines() if ln.startswith("demo:")]
    said = next((ln for ln in demo_lines if "already holds an earlier demo run" in ln), "")
    assert "this is a new run (job ids end in -2), narrated from #" in said, demo_lines
    verdict = next((ln for ln in demo_lines if ln.startswith("demo: failed:")), "")
    # Its own jobs ran (and failed, as the workers were told to), not the first run's replayed.
    assert "demo-ddp-2node-2 (JobFailed)" in verdict and "demo-urgent-eval-2 (JobFailed)" in verdict, demo_lines
    assert "demo-ddp-2node (JobFailed)" not in verdict
    assert "demo-ddp-2node-2 restarted as attempt 2 after a crash" in out, demo_lines
    assert second.returncode == FAILURE
