"""The demo never touches a cluster it did not make (#41).

`corral demo` against a cluster whose log holds a user's queues (a `research` with a guarantee of 1 and a limit
of 3, the demo's own queue name defined otherwise, and a `team-a`) and a user's job refuses with one line
(exit 2) and writes nothing: the queue definitions are byte-identical before and after, and the log did not
grow. `corral up --demo` on that data dir refuses the same way. (On a cluster of its own the demo runs:
tests/cli/test_demo_cluster.py, test_demo_again.py.)
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.cli.demo import demo_queues, not_the_demos
from orchestrator.cli.errors import USAGE
from orchestrator.core.model.state import ClusterState, Job, Queue
from schemas import JobSpec
from tests.cli.conftest import CORRAL, ROOT, Up, assert_one_line_error, corral, corral_json

DEFINITION_KEYS = ("queue", "defined", "weight", "guaranteed_gpus", "limit_gpus", "parent")


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    cluster = Up(tmp_path / "corral", ["--nodes", "2", "--gpus-per-node", "2"])
    cluster.start()
    try:
        yield cluster
    finally:
        if cluster.proc is not None and cluster.proc.poll() is None:
            assert cluster.stop() == 0


def definitions(url: str) -> tuple[int, str]:
    """(log position, the queue definitions as JSON text) from `corral queues --json`."""
    got = corral_json("queues", url=url)
    return got["seq"], json.dumps([{k: q[k] for k in DEFINITION_KEYS} for q in got["queues"]], sort_keys=True)


def test_demo_refuses_a_cluster_with_a_users_queues_and_jobs_and_changes_nothing(up: Up, tmp_path: Path) -> None:
    url = up.url
    corral("queue", "set", "research", "--guarantee", "1", "--limit", "3", url=url)
    corral("queue", "set", "team-a", "--weight", "2", url=url)
    corral("run", "--id", "mine", "--queue", "team-a", "--", "true", url=url)  # attached: ends before the reads
    seq, before = definitions(url)

    refused = corral("demo", "--wait", "10", "--duration", "30", url=url, check=None)
    said = assert_one_line_error(refused, USAGE)
    assert "the demo runs only on a cluster of its own" in said
    assert "queue(s) team-a" in said and "research (weight 1, guarantee 1, limit 3)" in said and "job of" in said
    assert "corral up --demo" in said
    assert refused.stdout == ""  # nothing narrated: not the cluster's history, not a demo

    after_seq, after = definitions(url)
    assert after == before  # byte-identical definitions
    assert after_seq == seq  # nothing written at all: no QueueDefined, no job
    assert not [j for j in corral_json("jobs", "--all", url=url)["jobs"] if j["job_id"].startswith("demo-")]

    # `corral up --demo` on this data dir (a cluster of the user's) refuses the same way.
    assert up.stop() == 0
    env = {**os.environ, "CORRAL_LOG_LEVEL": "warning"}
    proc = subprocess.run([*CORRAL, "up", "--demo", "--port", "0", "--nodes", "2", "--gpus-per-node", "2",
                           "--duration", "60", "--data-dir", str(up.data_dir)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == USAGE, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "corral: error: the demo runs only on a cluster of its own" in proc.stderr
    assert "demo: submitting" not in proc.stdout


def test_what_the_demo_counts_as_its_own() -> None:
    mine = demo_queues((4, None))
    state = ClusterState()
    assert not_the_demos(state, mine) == []
    state.queues["prod"] = Queue(name="prod", weight=2.0, guaranteed_gpus=4)
    state.queues["research"] = Queue(name="research", weight=1.0)
    state.jobs["demo-ddp-2node"] = Job(job_id="demo-ddp-2node", spec=JobSpec(name="d"), submitted_at=0.0,
                                       submitted_by="demo")
    assert not_the_demos(state, mine) == []  # an earlier demo's: a new run goes ahead
    assert not_the_demos(state, demo_queues(None)) == [
        "its queue names defined otherwise: prod (weight 2, guarantee 4, limit none), research (weight 1, "
        "guarantee 0, limit none)"]  # the full workload would redefine them
    state.queues["prod"] = Queue(name="prod", weight=2.0, guaranteed_gpus=8, limit_gpus=24)
    state.jobs["x"] = Job(job_id="x", spec=JobSpec(name="x"), submitted_at=0.0, submitted_by="alice")
    assert not_the_demos(state, mine) == [
        "its queue names defined otherwise: prod (weight 2, guarantee 8, limit 24)", "1 job of alice"]
