"""A local dataset edited between two jobs, and `corral datasets evict` (#41), through the CLI against `corral up`.

`corral submit` fingerprints a local directory without a digest (events/fingerprint.py), so the second job,
submitted after a file of it changed, gets a new cache key and reads the new content (before, the nodes kept
serving the copy cached by its path, without a word). `corral datasets evict NAME` asks the node to drop every
cached version of it: the entries leave the node's disk and the log, and the next job stages it again.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from orchestrator.cli.errors import NOT_FOUND
from tests.cli.conftest import Up, assert_one_line_error, corral, corral_json, state_of, wait_state

READ = "import os; print('read:', open(os.path.join(os.environ['CORRAL_DATASET_D'], 'v.txt')).read())"


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    cluster = Up(tmp_path / "corral", ["--nodes", "1", "--gpus-per-node", "1"])
    cluster.start()
    try:
        yield cluster
    finally:
        assert cluster.stop() == 0


def run_job(url: str, spec: Path, job_id: str) -> str:
    """Submit `spec` as `job_id`, wait for it to complete, and return what it printed."""
    corral("submit", str(spec), "--id", job_id, "--wait", url=url)
    return corral("logs", job_id, url=url).stdout


def cached(url: str) -> dict[str, list[str]]:
    """Cache key -> the nodes holding it, as `corral datasets --json` says."""
    return {d["key"]: [n["node_id"] for n in d["nodes"]] for d in corral_json("datasets", url=url)["datasets"]}


def test_an_edited_local_dataset_reaches_the_next_job_and_evict_drops_the_cache(up: Up, tmp_path: Path) -> None:
    url = up.url
    data = tmp_path / "set"
    data.mkdir()
    (data / "v.txt").write_text("first")
    (data / "sub").mkdir()
    (data / "sub" / "other.bin").write_bytes(b"\0" * 1000)
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({"name": "reader", "command": [sys.executable, "-c", READ],
                                    "datasets": [{"name": "d", "source": str(data), "mount": "/data/d"}]}))
    cache = up.data_dir / "agents" / "node-0" / "datasets"

    # 1. The first job stages the directory and reads it.
    assert "read: first" in run_job(url, spec, "ds-1")
    (first_key,) = cached(url)
    assert (cache / first_key / "data" / "v.txt").read_text() == "first"

    # 2. Edited (same size: only the time stamps tell): the next job reads the new content, from a new entry.
    (data / "v.txt").write_text("secnd")
    assert "read: secnd" in run_job(url, spec, "ds-2")
    keys = cached(url)
    assert set(keys) >= {first_key} and len(keys) == 2, keys
    (second_key,) = set(keys) - {first_key}
    assert (cache / second_key / "data" / "v.txt").read_text() == "secnd"
    job = corral_json("job", "ds-2", url=url)
    assert json.dumps(job).count("stat:") >= 1  # the spec in the log keeps the fingerprint it was staged by

    # 3. Unchanged: the third job is a cache hit on the second entry.
    corral("submit", str(spec), "--id", "ds-3", "--wait", url=url)
    items = state_of(url).jobs["ds-3"].staging
    assert items is not None and [(i.key, i.cached) for i in items.items] == [(second_key, True)]

    # 4. Evict by name: both versions leave the node's disk and the log.
    out = corral("datasets", "evict", "d", "--reason", "rebuilt", url=url).stdout
    assert out.count("node-0: evict") == 2 and first_key in out and second_key in out, out
    wait_state(url, lambda s: not s.nodes["node-0"].datasets and not s.nodes["node-0"].evict_requests, 30,
               "the evictions")
    assert cached(url) == {}
    assert not (cache / first_key).exists() and not (cache / second_key).exists()
    assert [p.name for p in cache.iterdir() if p.name != ".tmp"] == []
    tail = corral("tail", "--no-follow", url=url).stdout
    assert "evict asked" in tail and "DatasetEvicted" in tail

    # 5. The next job stages it again (no cache hit) and reads what is there now.
    assert "read: secnd" in run_job(url, spec, "ds-4")
    items = state_of(url).jobs["ds-4"].staging
    assert items is not None and [(i.key, i.cached) for i in items.items] == [(second_key, False)]
    assert (cache / second_key / "data" / "v.txt").is_file()

    # 6. Nothing to evict: a one-line error, exit 4.
    assert_one_line_error(corral("datasets", "evict", "nosuch", url=url, check=None), NOT_FOUND)
    assert_one_line_error(corral("datasets", "evict", "d", "--node", "node-9", url=url, check=None), NOT_FOUND)
