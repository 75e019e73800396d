"""An agent killed -9 at random points of staging a dataset (#33): never a cache entry with wrong content, and
every job still completes.

Real processes: nats-server, `corral scheduler`, `corral agent` (process runtime), `python -m http.server`.
Ten jobs, each with its own dataset (its own URL, so its own cache key): the agent is killed while it stages
that job's dataset, once its temporary directory holds a random share of the bytes (the HTTP server is
stopped with SIGSTOP first, so the staging cannot finish between that look and the kill), then started
again. After every kill the test sums every cache entry's files itself (hashlib, tests/dataset_source.py).
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import subprocess
from pathlib import Path

import pytest

from events.bus import Bus
from events.sdk import Client
from schemas import DatasetReady, JobSpec
from schemas.datasets import Dataset
from tests.dataset_source import make_tar, make_tree, start_http_server, stop_http_server, tree_sum
from tests.faults.services import kill, observer, scheduler_proc, stop_all, until
from tests.integration.harness import start_corral

MB = 1 << 20
SIZE = 1024 * MB if os.environ.get("CORRAL_STAGE_BIG") == "1" else 24 * MB
KILLS = 10
KEY_RE = re.compile(r"(sha256|src)-[0-9a-f]+")


def agent(url: str, data: Path) -> subprocess.Popen[bytes]:
    return start_corral("--nats", url, "agent", "--node-id", "n0", "--runtime", "process", "--fake-gpus", "8",
                        "--labels", "block=b0,leaf=l0", "--data-dir", str(data), "--address", "127.0.0.1",
                        "--heartbeat", "0.5", "--dataset-cache", str(data / "cache"), "--log-level", "info",
                        log=data / "agent.log")


def staged_bytes(tmp: Path) -> int:
    total = 0
    for d, _, files in os.walk(tmp):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(d, f))
            except OSError:
                pass
    return total


def check_entries(cache: Path, want: str) -> list[str]:
    """Every entry the cache would serve holds exactly the tree (the test's own checksum); their keys."""
    keys = []
    for p in cache.iterdir() if cache.exists() else ():
        if KEY_RE.fullmatch(p.name) and (p / "entry.json").exists():
            assert tree_sum(p / "data") == want, f"cache entry {p.name} holds wrong content"
            keys.append(p.name)
    return keys


@pytest.mark.slow
async def test_agent_killed_mid_staging_leaves_no_corrupt_entry_and_jobs_complete(
        bus: Bus, nats_server: object, tmp_path: Path) -> None:
    url = nats_server.url  # type: ignore[attr-defined]
    want = make_tree(tmp_path / "tree", SIZE)
    www = tmp_path / "www"
    www.mkdir()
    make_tar(tmp_path / "tree", www / "set-0.tar")
    for i in range(1, KILLS):
        os.link(www / "set-0.tar", www / f"set-{i}.tar")  # the same bytes under ten URLs: ten cache keys
    http, base = start_http_server(www)
    data = tmp_path / "agent"
    data.mkdir()
    cache = data / "cache"
    rng = random.Random(33)
    sched = scheduler_proc(url, "s1", tmp_path, min_runtime=0.0)
    ag = agent(url, data)
    mid_staging = 0
    try:
        async with observer(bus) as obs:
            for i in range(KILLS):
                ds = Dataset(name="pile", source=f"{base}/set-{i}.tar", mount="/data")
                spec = JobSpec(name=f"k{i}", gpus_per_rank=8, datasets=(ds,), max_restarts=0,
                               command=("sh", "-c", 'test "$(ls "$CORRAL_DATASET_PILE/a" | wc -l)" = 4'))
                await Client(bus).submit(spec, job_id=f"k{i}")
                share = rng.uniform(0.0, 0.9)
                target = int(share * SIZE)
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 120
                while (cache / ds.key).exists() is False:
                    if (cache / ".tmp").exists() and staged_bytes(cache / ".tmp") >= target:
                        break
                    assert ag.poll() is None, "the agent died by itself"
                    assert loop.time() < deadline, f"job k{i}'s staging never began"
                    await asyncio.sleep(0.002)
                http.send_signal(signal.SIGSTOP)
                mid_staging += not (cache / ds.key).exists()
                kill(ag)
                http.send_signal(signal.SIGCONT)
                check_entries(cache, want)
                ag = agent(url, data)
                await until(obs, lambda s, j=f"k{i}": s.jobs[j].status in ("completed", "failed"), 120,
                            f"job k{i} to end after the kill", alive=[sched, ag])
                job = obs.state.jobs[f"k{i}"]
                assert job.status == "completed", job.end_reason
            keys = check_entries(cache, want)
            assert sorted(keys) == sorted(Dataset(name="pile", source=f"{base}/set-{i}.tar",
                                                  mount="/data").key for i in range(KILLS))
    finally:
        stop_all([ag, sched])
        stop_http_server(http)
    events = [env.event async for batch in bus.replay() for env in batch]
    assert sum(isinstance(e, DatasetReady) for e in events) == KILLS
    print(f"{mid_staging} of {KILLS} kills landed mid-staging (the others just after its rename)")
