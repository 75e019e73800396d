"""A dataset in a container (#33): the Docker runtime bind-mounts the node's cache entry read-only at the spec's
`mount`, and CORRAL_DATASET_<NAME> names that path. A real `corral agent --runtime docker` and scheduler."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from events.bus import Bus
from events.follow import Follower
from events.sdk import Client
from events.server import NatsServer
from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import ClusterState
from schemas import JobSpec, WorkerExited
from schemas.datasets import Dataset
from tests.integration.harness import log_tail, scheduler, start_corral, stop, wait_until

#: Reads the dataset at its mount, and fails unless writing there is refused (read-only).
CHECK = ('echo "at $CORRAL_DATASET_SET: $(cat /data/set/sub/hello.txt)"; '
         'if touch /data/set/new 2>/dev/null; then echo writable; exit 5; fi; echo read-only')


@pytest.fixture
async def follower(bus: Bus) -> AsyncIterator[Follower[ClusterState]]:
    f = Follower(bus, evolve, ClusterState())
    task = asyncio.create_task(f.follow())
    yield f
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


@pytest.mark.docker
async def test_a_container_sees_its_dataset_read_only_at_its_mount(
        bus: Bus, follower: Follower[ClusterState], nats_server: NatsServer, busybox_image: str, docker_node: str,
        tmp_path: Path) -> None:
    shared = tmp_path / "shared" / "set"
    (shared / "sub").mkdir(parents=True)
    (shared / "sub" / "hello.txt").write_text("hello from the dataset\n")
    agent = start_corral("--nats", nats_server.url, "agent", "--node-id", docker_node, "--runtime", "docker",
                         "--fake-gpus", "8", "--address", "127.0.0.1", "--data-dir", str(tmp_path / "agents"),
                         "--heartbeat", "0.5", log=tmp_path / "agent.log")
    try:
        async with scheduler(bus):
            await wait_until(follower, lambda s: docker_node in s.nodes, 60, "the agent registered")
            spec = JobSpec(name="ds", gpus_per_rank=8, image=busybox_image, command=("sh", "-c", CHECK),
                           datasets=(Dataset(name="set", source=f"file://{shared}", mount="/data/set"),))
            await Client(bus).submit(spec, job_id="ds")
            try:
                await wait_until(follower, lambda s: s.jobs["ds"].status in ("completed", "failed"), 120, "ds to end")
            except AssertionError as e:
                raise AssertionError(f"{e}\n{log_tail(agent)}") from None
    finally:
        stop(agent)
    exits: list[Any] = [env.event async for batch in bus.replay(subjects=["corral.job.ds.>"]) for env in batch
                        if isinstance(env.event, WorkerExited)]
    assert follower.state.jobs["ds"].status == "completed", [(e.exit_code, e.log_tail) for e in exits]
    assert "at /data/set: hello from the dataset" in exits[0].log_tail
    assert "read-only" in exits[0].log_tail
