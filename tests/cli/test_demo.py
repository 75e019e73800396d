"""`corral up --demo` tells the truth: a failed job makes it exit non-zero, naming the job; a crash is a restart.

`corral up --worker-env WORKER_FAIL_AT_STEP` gives every worker that variable of
its environment (workers get nothing else of it: README, "What a worker gets"),
which makes every one of them crash: each job restarts (never
"resumes from its checkpoint": it never checkpointed) until its restarts run
out and it fails. Run from a directory outside the checkout, as a user would.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli.errors import FAILURE

pytestmark = pytest.mark.slow


def test_a_demo_whose_workers_fail_exits_non_zero_naming_the_failed_jobs(tmp_path: Path) -> None:
    env = {**os.environ, "CORRAL_LOG_LEVEL": "warning", "WORKER_FAIL_AT_STEP": "3"}
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "up", "--demo", "--port", "0", "--nodes", "2",
         "--gpus-per-node", "2", "--duration", "150", "--data-dir", str(tmp_path / "corral"),
         "--worker-env", "WORKER_FAIL_AT_STEP"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=200)
    out = proc.stdout
    assert proc.returncode == FAILURE, out[-3000:] + proc.stderr[-2000:]
    demo_lines = [ln for ln in out.splitlines() if ln.startswith("demo:")]
    verdict = next((ln for ln in demo_lines if ln.startswith("demo: failed:")), "")
    assert "demo-ddp-2node (JobFailed)" in verdict and "demo-urgent-eval (JobFailed)" in verdict, demo_lines
    assert "every job finished" not in out and "jobs completed" not in out, demo_lines
    assert "demo-ddp-2node restarted as attempt 2 after a crash" in out, demo_lines
    assert not any("resumed" in ln for ln in demo_lines), demo_lines
