"""Warm-node placement end to end (issue #33, acceptance 2): a real `corral scheduler` process, agents running
real worker processes, over a real nats-server.

Scenario: two free nodes; a first job with a dataset ran on the node registered second (the first was
full), so the log says that node holds the dataset (its DatasetReady) -- without the preference best fit
would take the first node. A 1-node job naming the dataset goes to the warm node. Then a `locality:
require` job, with the warm node full and the cold one free, waits, and `corral explain` says which
dataset and which node; once the warm node frees it starts on a node holding the dataset. A `prefer`
job submitted meanwhile starts on the cold node at once.
The dataset is a real directory, so agents that stage (the agent side of #33) stage it; the test also
tells the first job's DatasetReady itself, so the cache state is in the log whether or not they do.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from events.bus import Bus
from events.follow import Follower
from events.sdk import Client
from events.server import NatsServer
from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import ClusterState
from schemas import GangReserved, JobSpec, JobWaiting
from schemas.datasets import Dataset
from schemas.events import DatasetReady
from tests.integration.harness import CORRAL, agents, processes, start_corral, stop, wait_until

ROOT = Path(__file__).resolve().parents[2]
WORKER = str(ROOT / "examples" / "worker.py")


def worker(steps: int, step_ms: float = 5) -> tuple[str, ...]:
    return (sys.executable, WORKER, "--steps", str(steps), "--step-ms", str(step_ms))


@pytest.fixture
async def follower(bus: Bus) -> AsyncIterator[Follower[ClusterState]]:
    f = Follower(bus, evolve, ClusterState())
    task = asyncio.create_task(f.follow())
    yield f
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def status(s: ClusterState, job_id: str) -> str | None:
    j = s.jobs.get(job_id)
    return j.status if j is not None else None


async def job_events(bus: Bus, job_id: str) -> list[object]:
    return [env.event async for batch in bus.replay(subjects=[f"corral.job.{job_id}.>"]) for env in batch]


def explain(url: str, job_id: str) -> str:
    out = subprocess.run([CORRAL, "--nats", url, "explain", job_id, "--no-index"], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "CORRAL_LOG_FORMAT": "json"})
    assert out.returncode == 0, out.stderr
    return out.stdout


async def test_warm_node_wins_and_require_waits_for_it(nats_server: NatsServer, bus: Bus,
                                                       follower: Follower[ClusterState], tmp_path: Path) -> None:
    sched = start_corral("--nats", nats_server.url, "scheduler", "--id", "s1", "--tick", "0.2",
                         "--heartbeat-timeout", "60", "--log-level", "warning", log=tmp_path / "scheduler.log")
    try:
        async with agents(bus, 2, tmp_path / "agents", gpus=8, runtime=processes):
            await wait_until(follower, lambda s: s.epoch >= 1 and len(s.nodes) == 2, 30, "a leader and 2 nodes")
            data = tmp_path / "imagenet"
            data.mkdir()
            (data / "part-0").write_bytes(b"x" * 4096)
            imagenet = Dataset(name="imagenet", source=str(data), mount="/data/imagenet")
            client = Client(bus, user="test")
            # 0. The first node full, a job with the dataset runs on the second: it holds the dataset now.
            await client.submit(JobSpec(name="f", ranks=1, gpus_per_rank=8, command=worker(100_000, 10)),
                                job_id="fill")
            await wait_until(follower, lambda s: status(s, "fill") == "running", 60, "fill running")
            cold = follower.state.jobs["fill"].placement[0].node_id
            assert cold == next(iter(follower.state.nodes))  # best fit's tie went to the first registered
            await client.submit(JobSpec(name="d", ranks=1, gpus_per_rank=1, command=worker(5), datasets=(imagenet,)),
                                job_id="d1")
            await wait_until(follower, lambda s: status(s, "d1") == "completed", 60, "d1 to complete")
            (warm,) = {rp.node_id for rp in follower.state.jobs["d1"].placement}
            assert warm != cold
            await bus.append(DatasetReady(event_id="test:ready:d1", occurred_at=0.0, job_id="d1", attempt=1,
                                          node_id=warm, dataset="imagenet", key=imagenet.key, size_bytes=4096))
            await client.cancel("fill")
            await wait_until(follower, lambda s: status(s, "fill") == "cancelled" and imagenet.key in
                             s.nodes[warm].datasets, 30, "fill cancelled and the warm cache told")

            # 1. Two free nodes, one warm: the 1-node job goes to the warm one.
            await client.submit(JobSpec(name="p", ranks=1, gpus_per_rank=1, command=worker(5), datasets=(imagenet,)),
                                job_id="p1")
            await wait_until(follower, lambda s: status(s, "p1") == "completed", 60, "p1 to complete")
            assert [rp.node_id for rp in follower.state.jobs["p1"].placement] == [warm]
            (res,) = [e for e in await job_events(bus, "p1") if isinstance(e, GangReserved)]
            assert "warm: it holds 1 of the job's datasets" in res.reason

            # 2. The warm node full, the cold one free: a `require` job waits and says why.
            await client.submit(JobSpec(name="big", ranks=1, gpus_per_rank=8, command=worker(100_000, 10),
                                        datasets=(imagenet,), locality="require"), job_id="big")
            await wait_until(follower, lambda s: status(s, "big") == "running", 60, "big running")
            assert [rp.node_id for rp in follower.state.jobs["big"].placement] == [warm]
            await client.submit(JobSpec(name="r", ranks=1, gpus_per_rank=1, command=worker(5),
                                        datasets=(imagenet,), locality="require"), job_id="r1")
            await wait_until(follower, lambda s: s.jobs["r1"].waiting is not None, 30, "r1 told why it waits")
            why = follower.state.jobs["r1"].waiting
            assert why is not None and f"locality require: datasets imagenet are cached only on {warm}" in why.message
            assert status(follower.state, "r1") == "pending"
            text = explain(nats_server.url, "r1")
            assert f"cached only on {warm}" in text, text
            # The same job with `prefer` does not wait: it starts on the cold node.
            await client.submit(JobSpec(name="q", ranks=1, gpus_per_rank=1, command=worker(5), datasets=(imagenet,)),
                                job_id="q1")
            await wait_until(follower, lambda s: status(s, "q1") == "completed", 60, "q1 to complete")
            assert [rp.node_id for rp in follower.state.jobs["q1"].placement] == [cold]

            # 3. The warm node frees up (or, where agents stage, q1 made the cold one warm too): the required
            #    job starts on a node holding the dataset.
            await client.cancel("big")
            await wait_until(follower, lambda s: status(s, "r1") == "completed", 60, "r1 to complete")
            (where,) = {rp.node_id for rp in follower.state.jobs["r1"].placement}
            assert imagenet.key in follower.state.nodes[where].datasets
            waits = [e for e in await job_events(bus, "r1") if isinstance(e, JobWaiting)]
            assert any("locality require" in w.message for w in waits)
        assert stop(sched) == 0, (tmp_path / "scheduler.log").read_text()[-3000:]
    finally:
        if sched.poll() is None:
            sched.kill()
