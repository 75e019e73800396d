"""`corral submit` refuses (exit 2, with the reasons) a job no set of the registered nodes could ever hold."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.cli.conftest import Up, assert_one_line_error, corral, job, log_of, wait_state


def _spec(tmp_path: Path, name: str, **fields: Any) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job(name, queue="research", **fields)))
    return str(path)


def test_impossible_jobs_are_refused_with_the_reason(cluster: Up, tmp_path: Path) -> None:
    url = cluster.url  # 2 nodes x 4 H100
    cases = {
        "refuse-count": ({"ranks": 9999, "gpus": 1}, "needs 9999 GPUs (9999x1), the whole cluster has 8"),
        "refuse-rank": ({"gpus": 5}, "a rank needs 5 GPUs, the largest node has 4"),
        "refuse-model": ({"gpu_model": "B200"}, "no cluster node has a B200 GPU; it has: H100"),
        "refuse-memory": ({"min_gpu_memory_mib": 10_000_000}, "no cluster node has a GPU with >= 10000000 MiB"),
        "refuse-topology": ({"ranks": 2, "gpus": 4, "topology": {"level": "node", "mode": "require"}},
                            "on one node, the largest node has 4"),
    }
    for name, (fields, reason) in cases.items():
        proc = corral("submit", _spec(tmp_path, name, **fields), "--id", name, url=url, check=None)
        err = assert_one_line_error(proc, 2)
        assert "can never run on this cluster (2 registered nodes): " in err and reason in err, err
        assert "--allow-future-nodes" in err
    submitted = {env.event.job_id for env in log_of(url) if type(env.event).__name__ == "JobSubmitted"}
    assert not submitted & set(cases), "a refused job reached the log"


def test_allow_future_nodes_queues_it_to_wait_for_capacity(cluster: Up, tmp_path: Path) -> None:
    url = cluster.url
    spec = _spec(tmp_path, "future-big", ranks=3, gpus=4)
    assert corral("submit", spec, "--id", "future-big", "--allow-future-nodes", url=url).stdout.strip() == "future-big"
    state = wait_state(url, lambda s: s.jobs["future-big"].waiting is not None, 30, "a verdict on future-big")
    job_ = state.jobs["future-big"]
    assert job_.status == "pending" and job_.spec.waits_for_nodes
    corral("cancel", "future-big", url=url)
