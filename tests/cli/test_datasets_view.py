"""`corral datasets` and `corral nodes --datasets` (issue #33): which node caches what, read from a log.

The log is a simulated one (orchestrator/sim: its agents stage datasets and tell DatasetReady and
DatasetEvicted), read with `--log` as any exported log is; the expected contents are worked out from the
log's own events, not from the fold under test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.sim.engine import SimConfig, simulate
from orchestrator.sim.replay import read_log
from orchestrator.sim.trace import TraceJob
from schemas.events import DatasetEvicted, DatasetReady
from tests.sim.conftest import scenario, tiny_cluster


def corral(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(list(args))
    out = capsys.readouterr()
    assert int(exit_.value.code or 0) == 0, out.err
    return out.out


@pytest.fixture
def log(tmp_path: Path) -> Path:
    jobs = [TraceJob("x", 0, 100, 1, "a", datasets=(("imagenet", 100.0),)),
            TraceJob("y", 1000, 100, 1, "a", datasets=(("tokens", 40.0),)),
            TraceJob("z", 2000, 100, 1, "a", datasets=(("books", 30.0),)),
            TraceJob("w", 3000, 100, 8, "a", datasets=(("imagenet", 100.0),))]
    path = tmp_path / "events.jsonl"
    with path.open("wb") as f:
        simulate(scenario(tiny_cluster(2, 8, queues=[{"name": "a"}]), jobs), "corral", SimConfig(cache_gb=150), log=f)
    return path


def expected(log: Path) -> dict[str, dict[str, tuple[int, float]]]:
    """node -> key -> (size, last use), replayed from the log's DatasetReady / DatasetEvicted by hand."""
    held: dict[str, dict[str, tuple[int, float]]] = {}
    for e in read_log(log):
        if isinstance(e, DatasetReady):
            held.setdefault(e.node_id, {})[e.key] = (e.size_bytes, e.occurred_at)
        elif isinstance(e, DatasetEvicted):
            held.get(e.node_id, {}).pop(e.key, None)
    return held


def test_datasets_lists_each_cached_dataset_with_its_nodes_size_and_last_use(
        log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    got = json.loads(corral(capsys, "datasets", "--log", str(log), "--json"))["datasets"]
    want = expected(log)
    assert any(want.values()) and any(isinstance(e, DatasetEvicted) for e in read_log(log))  # the cache was full
    flat = {(n["node_id"], d["key"]): (n["size_bytes"], n["last_used"]) for d in got for n in d["nodes"]}
    assert flat == {(node, key): v for node, keys in want.items() for key, v in keys.items()}
    names = {d["key"]: d["names"] for d in got}
    ready = {e.key: e.dataset for e in read_log(log) if isinstance(e, DatasetReady)}
    assert all(names[k] == [ready[k]] for k in names)
    text = corral(capsys, "datasets", "--log", str(log))
    assert "DATASET" in text and "imagenet" in text and "100.0 GB" in text and "ago" in text


def test_nodes_datasets_adds_each_nodes_cache(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = json.loads(corral(capsys, "nodes", "--log", str(log), "--json", "--datasets"))["nodes"]
    want = expected(log)
    for n in nodes:
        assert {d["key"]: (d["size_bytes"], d["last_used"]) for d in n["datasets"]} == want.get(n["node_id"], {})
    plain = json.loads(corral(capsys, "nodes", "--log", str(log), "--json"))["nodes"]
    # Without --datasets: only the keys each node's record holds (Node.datasets), the same caches.
    assert all(set(n["datasets"]) == set(want.get(n["node_id"], {})) for n in plain)
    text = corral(capsys, "nodes", "--log", str(log), "--datasets")
    assert "DATASETS" in text.splitlines()[0] and "GB)" in text
