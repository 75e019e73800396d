"""Logs for the index tests: a simulated workload with preemptions, node failures and requeues.

Written by `corral sim` (the real simulator, the real scheduler core), once per session: a small
cluster (16 nodes) driven past full so jobs are preempted, with node outages so others are requeued.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORRAL = [sys.executable, "-m", "orchestrator.cli"]


@pytest.fixture(scope="session")
def sim_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("simlog")
    subprocess.run([*CORRAL, "sim", "gen", "--out", str(d / "trace.csv"), "--cluster-out", str(d / "cluster.yaml"),
                    "--nodes", "16", "--jobs", "300", "--load", "1.3", "--node-mtbf-days", "3",
                    "--outages-out", str(d / "outages.csv")], check=True, cwd=ROOT, capture_output=True)
    subprocess.run([*CORRAL, "sim", "--trace", str(d / "trace.csv"), "--cluster", str(d / "cluster.yaml"),
                    "--outages", str(d / "outages.csv"), "--out", str(d / "run"), "--no-figures"], check=True,
                   cwd=ROOT, capture_output=True)
    path = d / "run" / "events-corral.jsonl"
    text = path.read_text()
    # What the tests below rely on the workload to hold; a change in the simulator that loses it fails here.
    assert '"Preempted"' in text and '"JobRequeued"' in text and '"NodeFailed"' in text
    return path
