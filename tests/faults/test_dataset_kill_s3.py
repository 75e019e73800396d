"""An agent killed -9 at random points of staging s3:// datasets (#33, corral[s3]): never a cache entry with wrong
content, and every job still completes.

As tests/faults/test_dataset_kill.py, with S3 as the source: real processes (nats-server, `corral scheduler`,
`corral agent --s3-endpoint-url`, moto's S3 server), each job its own dataset, archive objects and prefixes in
turn; the agent is killed once its temporary directory holds a random share of the bytes (the S3 server stopped
with SIGSTOP first, so the staging cannot finish between that look and the kill), then started again. After
every kill the test sums every cache entry's files itself (hashlib, tests/dataset_source.py).
"""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
from pathlib import Path

import pytest

from events.bus import Bus
from events.sdk import Client
from schemas import DatasetReady, JobSpec
from schemas.datasets import Dataset
from tests.dataset_source import (
    S3_ENV,
    make_tar,
    make_tree,
    put_tree,
    s3_client,
    start_s3_server,
    stop_http_server,
)
from tests.faults.services import kill, observer, scheduler_proc, stop_all, until
from tests.faults.test_dataset_kill import check_entries, staged_bytes
from tests.integration.harness import start_corral

MB = 1 << 20
SIZE = 8 * MB
KILLS = 4


def agent(url: str, data: Path, endpoint: str) -> subprocess.Popen[bytes]:
    return start_corral("--nats", url, "agent", "--node-id", "n0", "--runtime", "process", "--fake-gpus", "8",
                        "--labels", "block=b0,leaf=l0", "--data-dir", str(data), "--address", "127.0.0.1",
                        "--heartbeat", "0.5", "--dataset-cache", str(data / "cache"), "--s3-endpoint-url", endpoint,
                        "--log-level", "info", log=data / "agent.log", env=S3_ENV)


@pytest.mark.slow
async def test_agent_killed_mid_s3_staging_leaves_no_corrupt_entry_and_jobs_complete(
        bus: Bus, nats_server: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = nats_server.url  # type: ignore[attr-defined]
    for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(k, raising=False)
    want = make_tree(tmp_path / "tree", SIZE)
    make_tar(tmp_path / "tree", tmp_path / "set.tar")
    s3, endpoint = start_s3_server()
    c = s3_client(endpoint)
    c.create_bucket(Bucket="sets")
    sources = []
    for i in range(KILLS):  # the same bytes under KILLS names: KILLS cache keys, archives and prefixes in turn
        if i % 2:
            put_tree(c, "sets", f"tree-{i}/", tmp_path / "tree")
            sources.append(f"s3://sets/tree-{i}/")
        else:
            c.upload_file(str(tmp_path / "set.tar"), "sets", f"set-{i}.tar")
            sources.append(f"s3://sets/set-{i}.tar")
    data = tmp_path / "agent"
    data.mkdir()
    cache = data / "cache"
    rng = random.Random(33)
    sched = scheduler_proc(url, "s1", tmp_path, min_runtime=0.0)
    ag = agent(url, data, endpoint)
    mid_staging = 0
    try:
        async with observer(bus) as obs:
            for i, source in enumerate(sources):
                ds = Dataset(name="pile", source=source, mount="/data")
                spec = JobSpec(name=f"k{i}", gpus_per_rank=8, datasets=(ds,), max_restarts=0,
                               command=("sh", "-c", 'test "$(ls "$CORRAL_DATASET_PILE/a" | wc -l)" = 4'))
                await Client(bus).submit(spec, job_id=f"k{i}")
                target = int(rng.uniform(0.0, 0.9) * SIZE)
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 120
                while (cache / ds.key).exists() is False:
                    if (cache / ".tmp").exists() and staged_bytes(cache / ".tmp") >= target:
                        break
                    assert ag.poll() is None, "the agent died by itself"
                    assert loop.time() < deadline, f"job k{i}'s staging never began"
                    await asyncio.sleep(0.002)
                s3.send_signal(signal.SIGSTOP)
                mid_staging += not (cache / ds.key).exists()
                kill(ag)
                s3.send_signal(signal.SIGCONT)
                check_entries(cache, want)
                ag = agent(url, data, endpoint)
                await until(obs, lambda s, j=f"k{i}": s.jobs[j].status in ("completed", "failed"), 120,
                            f"job k{i} to end after the kill", alive=[sched, ag])
                job = obs.state.jobs[f"k{i}"]
                assert job.status == "completed", job.end_reason
            keys = check_entries(cache, want)
            assert sorted(keys) == sorted(Dataset(name="pile", source=s, mount="/data").key for s in sources)
    finally:
        stop_all([ag, sched])
        s3.send_signal(signal.SIGCONT)
        stop_http_server(s3)
    events = [env.event async for batch in bus.replay() for env in batch]
    assert sum(isinstance(e, DatasetReady) for e in events) == KILLS
    print(f"{mid_staging} of {KILLS} kills landed mid-staging (the others just after its rename)")
