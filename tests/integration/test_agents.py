"""Node agents with the process runtime, under a real scheduler, over a real nats-server.

Each test states the scenario, the check and the invariant it guards.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from events.bus import Bus
from events.follow import Follower
from events.sdk import Client
from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import ClusterState
from schemas import Checkpointed, JobSpec, WorkerExited, WorkerStarted
from tests.integration.harness import agents, processes, scheduler, wait_until

ROOT = Path(__file__).resolve().parents[2]
WORKER = str(ROOT / "examples" / "worker.py")


def worker(steps: int, step_ms: float = 5, *extra: str) -> tuple[str, ...]:
    return (sys.executable, WORKER, "--steps", str(steps), "--step-ms", str(step_ms), *extra)


@pytest.fixture
async def follower(bus: Bus) -> AsyncIterator[Follower[ClusterState]]:
    f = Follower(bus, evolve, ClusterState())
    task = asyncio.create_task(f.follow())
    yield f
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def events_of(bus: Bus, job_id: str) -> list[object]:
    return [env.event async for batch in bus.replay(subjects=[f"corral.job.{job_id}.>"]) for env in batch]


def status(job_id: str):  # type: ignore[no-untyped-def]
    return lambda s: s.jobs.get(job_id) is not None and s.jobs[job_id].status


def worker_pid(data_dir: Path, job_id: str, rank: int, attempt: int = 1) -> int:
    for child in data_dir.glob(f"n*/workers/*-{job_id}-a{attempt}-r{rank}-x*/child.json"):
        return int(json.loads(child.read_text())["pid"])
    raise AssertionError(f"no worker for {job_id} rank {rank}")


def logs(data_dir: Path, job_id: str) -> dict[str, str]:
    return {p.name: p.read_text() for p in data_dir.glob(f"n*/logs/*-{job_id}-*.log")}


async def test_gang_of_8_ranks_on_two_nodes_sees_consistent_rank_env(bus: Bus, follower: Follower[ClusterState],
                                                                       tmp_path: Path) -> None:
    """A 2-node x 4-rank gang starts whole; every rank's env agrees with the reservation (torchrun layout)."""
    async with scheduler(bus), agents(bus, 2, tmp_path, gpus=4, runtime=processes):
        await Client(bus).submit(JobSpec(name="g", ranks=8, gpus_per_rank=1, command=worker(40)), job_id="g8")
        await wait_until(follower, lambda s: status("g8")(s) == "completed", 60, "g8 to complete")
    job = follower.state.jobs["g8"]
    env_lines = [ln for text in logs(tmp_path, "g8").values() for ln in text.splitlines() if "rank env:" in ln]
    assert len(env_lines) == 8
    envs = [dict(kv.split("=", 1) for kv in ln.split("rank env: ")[1].split()) for ln in env_lines]
    node_of = {p.rank: p.node_id for p in job.placement}
    gpus_of = {p.rank: p.gpus for p in job.placement}
    first_node = node_of[0]
    assert sorted(int(e["RANK"]) for e in envs) == list(range(8))
    for e in envs:
        r = int(e["RANK"])
        assert e["WORLD_SIZE"] == "8" and e["LOCAL_WORLD_SIZE"] == "4"
        assert e["NODE_RANK"] == ("0" if node_of[r] == first_node else "1")
        assert int(e["LOCAL_RANK"]) == r % 4, "ranks of a node are contiguous, rank 0 on the first node"
        assert e["MASTER_ADDR"] == "127.0.0.1" and e["MASTER_PORT"] == str(job.master_port)
        assert e["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, gpus_of[r]))
        assert e["CORRAL_JOB_ID"] == "g8" and e["CORRAL_ATTEMPT"] == "1"


async def test_sigkilled_worker_restarts_alone_under_policy_rank(bus: Bus, follower: Follower[ClusterState],
                                                                 tmp_path: Path) -> None:
    """Policy `rank`: only the killed worker restarts (same attempt), and the job still completes."""
    async with scheduler(bus), agents(bus, 2, tmp_path, gpus=4, runtime=processes):
        spec = JobSpec(name="r", ranks=2, gpus_per_rank=4, restart_policy="rank", max_restarts=2,
                       command=worker(300, 10))
        await Client(bus).submit(spec, job_id="rk")
        await wait_until(follower, lambda s: status("rk")(s) == "running", 30, "rk running")
        os.kill(worker_pid(tmp_path, "rk", 1), signal.SIGKILL)
        await wait_until(follower, lambda s: status("rk")(s) == "completed", 60, "rk to complete")
    evs = await events_of(bus, "rk")
    exits = [e for e in evs if isinstance(e, WorkerExited)]
    crash = [e for e in exits if e.reason == "killed"]
    assert len(crash) == 1 and crash[0].rank == 1 and crash[0].will_restart and crash[0].signal == signal.SIGKILL
    starts = [(e.attempt, e.rank, e.restarts) for e in evs if isinstance(e, WorkerStarted)]
    assert sorted(starts) == [(1, 0, 0), (1, 1, 0), (1, 1, 1)], "rank 1 restarted once, rank 0 never"
    assert follower.state.jobs["rk"].attempt == 1


async def test_sigkilled_worker_restarts_whole_gang_under_policy_gang(bus: Bus, follower: Follower[ClusterState],
                                                                     tmp_path: Path) -> None:
    """Policy `gang`: the scheduler restarts all ranks together as attempt 2 on the same GPUs."""
    async with scheduler(bus), agents(bus, 2, tmp_path, gpus=4, runtime=processes):
        spec = JobSpec(name="g", ranks=2, gpus_per_rank=4, restart_policy="gang", max_restarts=2,
                       command=worker(300, 10))
        await Client(bus).submit(spec, job_id="gg")
        await wait_until(follower, lambda s: status("gg")(s) == "running", 30, "gg running")
        placement = follower.state.jobs["gg"].placement
        os.kill(worker_pid(tmp_path, "gg", 0), signal.SIGKILL)
        await wait_until(follower, lambda s: status("gg")(s) == "completed", 60, "gg to complete")
    job = follower.state.jobs["gg"]
    assert job.attempt == 2 and job.placement == placement
    evs = await events_of(bus, "gg")
    starts = Counter(e.attempt for e in evs if isinstance(e, WorkerStarted))
    assert starts == {1: 2, 2: 2}, "both ranks started once per attempt"


async def test_preempted_job_checkpoints_and_resumes_from_it(bus: Bus, follower: Follower[ClusterState],
                                                             tmp_path: Path) -> None:
    """Preemption end to end: signal -> checkpoint -> Checkpointed -> requeue -> resume with step > 0."""
    async with scheduler(bus), agents(bus, 2, tmp_path, gpus=4, runtime=processes):
        client = Client(bus)
        low = JobSpec(name="low", ranks=2, gpus_per_rank=4, priority=0, command=worker(600, 10))
        await client.submit(low, job_id="low")
        await wait_until(follower, lambda s: status("low")(s) == "running", 30, "low running")
        await asyncio.sleep(1.0)  # let it make progress worth checkpointing
        await client.submit(JobSpec(name="high", ranks=1, gpus_per_rank=4, priority=10, command=worker(20)),
                            job_id="high")
        await wait_until(follower, lambda s: status("high")(s) == "completed", 60, "high to complete")
        await wait_until(follower, lambda s: status("low")(s) == "completed", 90, "low to complete after resuming")
    evs = await events_of(bus, "low")
    ckpts = [e for e in evs if isinstance(e, Checkpointed) and e.attempt == 1]
    assert ckpts and all(c.step > 0 for c in ckpts)
    assert follower.state.jobs["low"].attempt == 2
    resumed = [ln for text in logs(tmp_path, "low").values() for ln in text.splitlines() if "resumed at step" in ln]
    assert len(resumed) == 2, resumed
    for ln in resumed:
        step, path = re.search(r"resumed at step (\d+) from (\S+)", ln).groups()  # type: ignore[union-attr]
        assert int(step) > 0
        assert path in {c.path for c in ckpts}, "CORRAL_RESUME_FROM points at the recorded checkpoint"
    done = [ln for text in logs(tmp_path, "low").values() for ln in text.splitlines() if ln.startswith("done at")]
    assert len(done) == 2 and all(f"value {sum(range(600))}" in ln for ln in done), "no step lost or repeated"


async def test_agent_sigkill_and_restart_adopts_workers_and_reports_exits(
        bus: Bus, follower: Follower[ClusterState], nats_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Kill an agent process with SIGKILL while its workers run, restart it on the same data dir.

    Check: no worker is started twice (one WorkerStarted per job/attempt/rank), none is orphaned
    (every job completes at attempt 1, so adopted workers finished under the new agent), and an exit
    that happened while the agent was down is reported after the restart.
    Invariant: DESIGN.md 7.
    """
    from tests.integration.harness import start_corral, stop

    def agent(node: str) -> object:
        return start_corral("--nats", nats_server.url, "agent", "--node-id", node, "--fake-gpus", "8",
                            "--runtime", "process", "--data-dir", str(tmp_path), "--address", "127.0.0.1",
                            "--heartbeat", "0.5", "--log-level", "warning", log=tmp_path / f"{node}.log")

    procs = {n: agent(n) for n in ("n0", "n1")}
    try:
        async with scheduler(bus):
            await wait_until(follower, lambda s: len(s.nodes) == 2, 30, "two agents registered")
            client = Client(bus)
            await client.submit(JobSpec(name="long", ranks=2, gpus_per_rank=6, command=worker(500, 10)),
                                job_id="long")
            await client.submit(JobSpec(name="short", ranks=1, gpus_per_rank=2, command=worker(60, 10)),
                                job_id="short")
            await wait_until(follower, lambda s: status("long")(s) == "running" and status("short")(s) == "running",
                             30, "both running")
            victim = follower.state.jobs["short"].placement[0].node_id
            procs[victim].send_signal(signal.SIGKILL)  # type: ignore[attr-defined]
            procs[victim].wait(10)  # type: ignore[attr-defined]
            await asyncio.sleep(1.5)  # "short" (0.6 s of work) ends while its agent is down
            assert status("short")(follower.state) == "running", "nobody could have reported it yet"
            procs[victim] = agent(victim)
            await wait_until(follower, lambda s: status("short")(s) == "completed", 30, "short reported after restart")
            await wait_until(follower, lambda s: status("long")(s) == "completed", 60, "long to complete")
    finally:
        for p in procs.values():
            stop(p)  # type: ignore[arg-type]
    for job_id in ("long", "short"):
        evs = await events_of(bus, job_id)
        starts = Counter((e.attempt, e.rank) for e in evs if isinstance(e, WorkerStarted))
        assert all(n == 1 for n in starts.values()), f"{job_id}: a rank was started twice: {starts}"
        assert follower.state.jobs[job_id].attempt == 1
    assert not list(tmp_path.glob("n*/workers/*/child.json")), "an orphaned worker state was left behind"


@pytest.mark.skipif(os.environ.get("CI") != "true" and not __import__("importlib").util.find_spec("torch"),
                    reason="torch not installed (CI installs torch==2.13.0 CPU)")
async def test_pytorch_ddp_allreduce_across_two_agents(bus: Bus, follower: Follower[ClusterState],
                                                       tmp_path: Path) -> None:
    """A 2-node x 2-rank gang of PyTorch DDP (gloo, CPU): the all-reduce proves the rank/master env is right."""
    out = tmp_path / "ddp"
    cmd = (sys.executable, str(ROOT / "examples" / "ddp_allreduce.py"), "--out-dir", str(out))
    async with scheduler(bus), agents(bus, 2, tmp_path, gpus=4, runtime=processes):
        await Client(bus).submit(JobSpec(name="ddp", ranks=4, gpus_per_rank=2, command=cmd), job_id="ddp")
        await wait_until(follower, lambda s: status("ddp")(s) in ("completed", "failed"), 120, "ddp to finish")
    assert status("ddp")(follower.state) == "completed", logs(tmp_path, "ddp")
    assert len({p.node_id for p in follower.state.jobs["ddp"].placement}) == 2
    results = [json.loads(p.read_text()) for p in sorted(out.glob("result-rank*.json"))]
    assert [r["rank"] for r in results] == [0, 1, 2, 3]
    assert all(r["world_size"] == 4 and r["sum"] == 6.0 for r in results)
