"""A multi-node gang in real containers: two `corral agent --runtime docker` processes, one scheduler.

Both agents run on this machine with address 127.0.0.1, one rank each (2 ranks
x 8 GPUs on two 8-GPU nodes: a rank fills a node). Rank 0 listens on
MASTER_PORT with busybox `nc -l`, rank 1 connects to MASTER_ADDR:MASTER_PORT;
they swap tokens, so each rank's exit log shows it reached the other. That
only works when the containers share the node's network (host networking):
in a bridge network rank 0 listens inside its own namespace.

The checkpoint root is a host path (tmp_path), bind-mounted into the workers
at the same path, so a resumed attempt reads what the first one wrote: rank 0
resumes from the state file the log recorded, whichever rank wrote it.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from events.bus import Bus
from events.follow import Follower
from events.sdk import Client
from events.server import NatsServer
from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import ClusterState
from schemas import Checkpointed, JobSpec, WorkerExited
from tests.agent.conftest import BUSYBOX_IMAGE
from tests.integration.harness import log_tail, scheduler, start_corral, stop, wait_until

#: One rank's life: resume, rendezvous with the other rank, count steps, checkpoint on SIGUSR1.
WORKER = r"""
me="rank$RANK-attempt$CORRAL_ATTEMPT"
ckpt=0
trap 'ckpt=1' USR1  # before anything: a signal during the rendezvous is acted on at the first step
step=0
target=$STEPS
if [ -n "${CORRAL_RESUME_FROM:-}" ]; then
    step=$(cat "$CORRAL_RESUME_FROM") || exit 4
    target=$((step + 5))
    echo "$me resumed at step $step from $CORRAL_RESUME_FROM"
fi
# Each side keeps its stdin open 3 s after its token: an nc whose stdin ends may close (CI once saw 1 s run out)
# before it has read the peer's token.
if [ "$RANK" = 0 ]; then
    got=$( (echo "token-from-$me"; sleep 3) | nc -l -p "$MASTER_PORT")
else
    i=0
    until got=$( (echo "token-from-$me"; sleep 3) | nc "$MASTER_ADDR" "$MASTER_PORT" 2>/dev/null) && [ -n "$got" ]; do
        i=$((i + 1))
        [ $i -gt 60 ] && { echo "$me: nobody at $MASTER_ADDR:$MASTER_PORT"; exit 3; }
    done
fi
echo "$me at $MASTER_ADDR:$MASTER_PORT got $got"
while [ "$step" -lt "$target" ]; do
    if [ $ckpt = 1 ]; then
        d=$CORRAL_CHECKPOINT_DIR
        mkdir -p "$d"
        f="$d/rank$RANK-step$step.state"
        echo $step > "$f.tmp" && mv "$f.tmp" "$f"
        printf '{"step": %s, "path": "%s", "rank": %s, "attempt": %s}\n' \
            "$step" "$f" "$RANK" "$CORRAL_ATTEMPT" > "$d/.manifest.tmp"
        mv "$d/.manifest.tmp" "$d/manifest-rank$RANK.json"
        echo "$me checkpointed step $step"
        exit 0
    fi
    sleep 0.1
    step=$((step + 1))
done
echo "$me done at step $step"
"""


def job(name: str, steps: int, **kw: Any) -> JobSpec:
    return JobSpec(name=name, ranks=2, gpus_per_rank=8, image=BUSYBOX_IMAGE, command=("sh", "-c", WORKER),
                   env={"STEPS": str(steps)}, **kw)


@pytest.fixture
def nodes(docker_client: Any) -> Iterator[tuple[str, str]]:
    """Two node ids unique to the test; their containers are removed afterwards."""
    base = f"dg-{uuid.uuid4().hex[:8]}"
    ids = (f"{base}-0", f"{base}-1")
    yield ids
    for node in ids:
        for c in docker_client.containers.list(all=True, filters={"label": [f"corral.node={node}"]}):
            c.remove(force=True)


@pytest.fixture
async def follower(bus: Bus) -> AsyncIterator[Follower[ClusterState]]:
    f = Follower(bus, evolve, ClusterState())
    task = asyncio.create_task(f.follow())
    yield f
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


@pytest.fixture
def docker_agents(nats_server: NatsServer, busybox_image: str, nodes: tuple[str, str],
                  tmp_path: Path) -> Iterator[list[Any]]:
    """Two real `corral agent --runtime docker` processes with 8 fake GPUs each, checkpoints under tmp_path."""
    procs = [
        start_corral("--nats", nats_server.url, "agent", "--node-id", node, "--runtime", "docker",
                     "--fake-gpus", "8", "--address", "127.0.0.1", "--data-dir", str(tmp_path / "agents"),
                     "--checkpoint-root", str(tmp_path / "ck"), "--heartbeat", "0.5",
                     log=tmp_path / f"{node}.log")
        for node in nodes
    ]
    try:
        yield procs
    finally:
        for p in procs:
            stop(p)


async def exits(bus: Bus, job_id: str) -> list[WorkerExited]:
    return [env.event async for batch in bus.replay(subjects=[f"corral.job.{job_id}.>"]) for env in batch
            if isinstance(env.event, WorkerExited)]


def status(job_id: str):  # type: ignore[no-untyped-def]
    return lambda s: s.jobs.get(job_id) is not None and s.jobs[job_id].status


def why(procs: list[Any]) -> str:
    return "\n".join(f"--- agent {i}:\n{log_tail(p)}" for i, p in enumerate(procs))


@pytest.mark.docker
async def test_two_ranks_on_two_docker_agents_meet_at_master_addr(
        bus: Bus, follower: Follower[ClusterState], docker_agents: list[Any], nodes: tuple[str, str]) -> None:
    async with scheduler(bus):
        await wait_until(follower, lambda s: len(s.nodes) == 2, 60, "two agents registered")
        await Client(bus).submit(job("meet", steps=3), job_id="meet")
        try:
            await wait_until(follower, lambda s: status("meet")(s) in ("completed", "failed"), 120, "meet to end")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{why(docker_agents)}") from None
    done = await exits(bus, "meet")
    assert status("meet")(follower.state) == "completed", [(e.rank, e.exit_code, e.log_tail) for e in done]
    job_ = follower.state.jobs["meet"]
    assert {p.node_id for p in job_.placement} == set(nodes), "one rank per agent"
    tails = {e.rank: e.log_tail for e in done}
    port = job_.master_port
    assert f"rank0-attempt1 at 127.0.0.1:{port} got token-from-rank1-attempt1" in tails[0]
    assert f"rank1-attempt1 at 127.0.0.1:{port} got token-from-rank0-attempt1" in tails[1]
    assert all(e.exit_code == 0 for e in done)


@pytest.mark.docker
async def test_preempted_gang_resumes_in_new_containers_from_the_host_checkpoint(
        bus: Bus, follower: Follower[ClusterState], docker_agents: list[Any], tmp_path: Path) -> None:
    client = Client(bus)
    async with scheduler(bus):
        await wait_until(follower, lambda s: len(s.nodes) == 2, 60, "two agents registered")
        await client.submit(job("low", steps=100_000), job_id="low")
        try:
            await wait_until(follower, lambda s: status("low")(s) == "running", 60, "low running")
            await wait_until(follower, lambda s: [r.status for r in s.ranks.get("low", {}).values()] == ["started"] * 2,
                             60, "both ranks started")
            await asyncio.sleep(6.0)  # past the rendezvous (3 s and more), steps worth checkpointing
            high = JobSpec(name="high", ranks=1, gpus_per_rank=8, priority=10, image=BUSYBOX_IMAGE,
                           command=("sh", "-c", "echo high at $MASTER_ADDR; sleep 1"))
            await client.submit(high, job_id="high")
            await wait_until(follower, lambda s: status("high")(s) == "completed", 120, "high to complete")
            await wait_until(follower, lambda s: status("low")(s) in ("completed", "failed"), 120, "low to end")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{why(docker_agents)}") from None
    done = await exits(bus, "low")
    assert status("low")(follower.state) == "completed", [(e.attempt, e.rank, e.log_tail) for e in done]
    assert follower.state.jobs["low"].attempt == 2
    ckpts = [env.event async for batch in bus.replay(subjects=["corral.job.low.>"]) for env in batch
             if isinstance(env.event, Checkpointed)]
    paths = {c.path for c in ckpts if c.attempt == 1 and c.step > 0}
    assert paths, "the first attempt checkpointed"
    assert all(Path(p).is_relative_to(tmp_path / "ck") and Path(p).is_file() for p in paths), "on the host"
    second = {e.rank: e.log_tail for e in done if e.attempt == 2}
    assert sorted(second) == [0, 1]
    for r, tail in second.items():
        m = re.search(rf"rank{r}-attempt2 resumed at step (\d+) from (\S+)", tail)
        assert m is not None, tail
        assert int(m.group(1)) > 0 and m.group(2) in paths, "read the checkpoint the first attempt wrote"
        assert f"rank{r}-attempt2 done at step {int(m.group(1)) + 5}" in tail
    assert "got token-from-rank1-attempt2" in second[0] and "got token-from-rank0-attempt2" in second[1]
