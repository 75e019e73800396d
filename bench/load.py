"""Load: 10,000 jobs in a burst from 8 clients against 256 simulated nodes x 8 GPUs.

What runs, all on this machine, over one embedded nats-server:
- a real `corral scheduler` process (topology levels block, leaf);
- 256 node agents (the real `nodeagent.agent.Agent`, simulated runtime: a
  worker is a timer) in `--agent-procs` processes; heartbeats every 5 s, the
  scheduler's heartbeat timeout 60 s;
- 8 clients, each its own NATS connection and `events.sdk.Client`, submitting
  1,250 jobs each as fast as they can, all 8 at once;
- a watcher tailing the log.

One simplification, so 256 agents fit on 2 cores: the agents of one process
share one fold of the log (one consumer, one `Follower`) instead of each
folding it alone (256 x the same work; on a real cluster every agent has a
machine of its own). Each agent still reconciles, runs its workers and
appends its own events exactly as `corral agent` does; the shared fold wakes
an agent when an event is about its node or one of its jobs, and every agent
also reconciles on its own 2 s tick.

Figures (server timestamps, one clock): jobs/s = jobs / (first JobSubmitted ->
last final event); submit -> reserved = first GangReserved - JobSubmitted;
submit -> running = JobRunning - JobSubmitted (every rank started);
reserved -> running = the agents' start path (fold, start, WorkerStarted) plus
the scheduler's JobRunning; services_cpu_s = CPU seconds the scheduler and
agent processes used. The last line printed is one JSON object with all of them.

    .venv/bin/python bench/load.py [--jobs 10000 --clients 8 --nodes 256 --gpus 8 --agent-procs 2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from events.bus import Bus  # noqa: E402
from events.follow import Follower  # noqa: E402
from events.sdk import Client  # noqa: E402
from events.server import NatsServer  # noqa: E402
from nodeagent.agent import Agent, AgentConfig  # noqa: E402
from nodeagent.fake_gpus import fake_inventory  # noqa: E402
from nodeagent.runtime.simulated import SimulatedRuntime  # noqa: E402
from orchestrator.core.evolve import evolve  # noqa: E402
from orchestrator.core.model.state import ClusterState  # noqa: E402
from orchestrator.logging import configure_logging  # noqa: E402
from schemas import GangReserved, JobRunning, JobSpec, JobSubmitted, tag_of  # noqa: E402

FINAL = ("JobCompleted", "JobFailed", "JobCancelled", "JobRejected")
HEARTBEAT_S = 5.0
HEARTBEAT_TIMEOUT_S = 60.0
AGENT_TICK_S = 2.0


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


# --- the agent host: many agents, each reading its own slice (#40) ----------------------------------


async def host_agents(url: str, first: int, count: int, nodes_total: int, gpus: int) -> None:
    configure_logging("warning")
    bus = await Bus.connect(url, name=f"bench-agents-{first}")
    agents = []
    for i in range(first, first + count):
        node_id = f"n{i:03d}"
        inventory = fake_inventory(gpus, node_id=node_id, labels={"block": f"b{i // 32}", "leaf": f"l{i // 4}"})
        config = AgentConfig(node_id=node_id, data_dir=Path(tempfile.gettempdir()) / "corral-load" / node_id,
                             heartbeat_s=HEARTBEAT_S, tick_s=AGENT_TICK_S)
        agents.append(Agent(bus, config, inventory, SimulatedRuntime()))
    async with asyncio.TaskGroup() as tg:
        for agent in agents:
            tg.create_task(agent.run())


# --- the bench ---------------------------------------------------------------------------------------


class Watch:
    """Server times of each job's submit, first reservation, running and final events."""

    def __init__(self) -> None:
        self.submitted: dict[str, float] = {}
        self.reserved: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.final: dict[str, tuple[str, float]] = {}
        self.changed = asyncio.Event()

    async def run(self, bus: Bus) -> None:
        subjects = [f"corral.job.*.{t}" for t in ("JobSubmitted", "GangReserved", "JobRunning", *FINAL)]
        async for env in bus.tail(subjects=subjects, from_seq=1):
            e, t = env.event, env.stream_time
            if isinstance(e, JobSubmitted):
                self.submitted.setdefault(e.job_id, t)
            elif isinstance(e, GangReserved):
                self.reserved.setdefault(e.job_id, t)
            elif isinstance(e, JobRunning):
                self.running.setdefault(e.job_id, t)
            elif (tag := tag_of(e)) in FINAL:
                self.final.setdefault(e.job_id, (tag, t))  # type: ignore[union-attr]
                self.changed.set()

    async def until_final(self, count: int, timeout: float, progress: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        last_print = time.monotonic()
        while len(self.final) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self.final)} of {count} jobs final after {timeout}s")
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):  # not wait_for: see Follower.wait_changed
                    await self.changed.wait()
            if time.monotonic() - last_print > progress:
                last_print = time.monotonic()
                print(f"  {len(self.reserved)} reserved, {len(self.running)} running, {len(self.final)} final",
                      file=sys.stderr, flush=True)


def job_spec(rng: random.Random, i: int) -> JobSpec:
    ranks = rng.choice([1, 1, 1, 1, 2])
    gpus = rng.choice([1, 1, 1, 2, 2, 4, 8])
    return JobSpec(name=f"load-{i}", ranks=ranks, gpus_per_rank=gpus, priority=rng.randint(0, 2),
                   command=("sleep", f"{rng.uniform(0.5, 2.0):.2f}"))


async def load_bench(jobs: int, clients: int, nodes: int, gpus: int, agent_procs: int,
                     timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="corral-load-") as tmp:
        async with NatsServer(Path(tmp) / "nats") as server:
            url = server.url
            procs: list[subprocess.Popen[bytes]] = []
            logs = []
            try:
                log = open(Path(tmp) / "scheduler.log", "wb")  # noqa: SIM115
                logs.append(log)
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "orchestrator.cli", "--nats", url, "scheduler", "--id", "load",
                     "--tick", "0.5", "--heartbeat-timeout", str(HEARTBEAT_TIMEOUT_S), "--topology-levels",
                     "block,leaf", "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT))
                per = -(-nodes // agent_procs)
                for k in range(agent_procs):
                    first, count = k * per, min(per, nodes - k * per)
                    log = open(Path(tmp) / f"agents-{k}.log", "wb")  # noqa: SIM115
                    logs.append(log)
                    procs.append(subprocess.Popen(
                        [sys.executable, __file__, "--host-agents", url, "--first", str(first), "--count", str(count),
                         "--nodes", str(nodes), "--gpus", str(gpus)], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT))

                bus = await Bus.connect(url, name="bench-watch")
                watch = Watch()
                tail = asyncio.create_task(watch.run(bus))
                follower = Follower(bus, evolve, ClusterState())
                follow = asyncio.create_task(follower.follow())
                t_wait = time.monotonic()
                while not (follower.state.epoch >= 1 and len(follower.state.nodes) == nodes):
                    if any(p.poll() is not None for p in procs):
                        raise RuntimeError(f"a service died at start; logs in {tmp}")
                    if time.monotonic() - t_wait > 180:
                        raise TimeoutError(f"{len(follower.state.nodes)} of {nodes} nodes registered after 180 s")
                    await asyncio.sleep(0.5)
                follow.cancel()
                print(f"cluster up: {nodes} nodes x {gpus} GPUs in {time.monotonic() - t_wait:.1f}s",
                      file=sys.stderr, flush=True)

                rng = random.Random(42)
                specs = [job_spec(rng, i) for i in range(jobs)]
                gpu_seconds = sum(sp.total_gpus * float(sp.command[1]) for sp in specs)
                buses = [await Bus.connect(url, name=f"bench-client-{c}") for c in range(clients)]

                async def client(c: int) -> None:
                    sdk = Client(buses[c], user=f"client-{c}")
                    mine = list(range(c, jobs, clients))
                    for k in range(0, len(mine), 100):  # 100 submits in flight per client
                        await asyncio.gather(*(sdk.submit(specs[i], job_id=f"L{i:05d}") for i in mine[k:k + 100]))

                t0 = time.monotonic()
                await asyncio.gather(*(client(c) for c in range(clients)))
                submit_s = time.monotonic() - t0
                print(f"submitted {jobs} jobs from {clients} clients in {submit_s:.1f}s", file=sys.stderr, flush=True)
                await watch.until_final(jobs, timeout)
                for b in buses:
                    await b.close()
                tail.cancel()
                await bus.close()
            finally:
                for p in procs:
                    p.terminate()
                for p in procs:
                    try:
                        p.wait(20)
                    except subprocess.TimeoutExpired:
                        p.kill()
                for log in logs:
                    log.close()
    # CPU of the scheduler and agent processes (reaped above): what the cluster side cost.
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    services_cpu = children.ru_utime + children.ru_stime

    ids = list(watch.submitted)
    first_submit = min(watch.submitted.values())
    last_final = max(t for _, t in watch.final.values())
    to_reserved = [(watch.reserved[j] - watch.submitted[j]) * 1000 for j in ids if j in watch.reserved]
    to_running = [(watch.running[j] - watch.submitted[j]) * 1000 for j in ids if j in watch.running]
    start_lag = [(watch.running[j] - watch.reserved[j]) * 1000 for j in ids if j in watch.running]
    outcomes: dict[str, int] = {}
    for tag, _ in watch.final.values():
        outcomes[tag] = outcomes.get(tag, 0) + 1
    return {
        "jobs": jobs, "clients": clients, "nodes": nodes, "gpus_per_node": gpus, "agent_procs": agent_procs,
        "outcomes": outcomes,
        "submit_burst_s": round(submit_s, 2),
        "submits_per_s": round(jobs / submit_s, 1),
        "jobs_per_s": round(jobs / (last_final - first_submit), 1),
        "makespan_s": round(last_final - first_submit, 1),
        # The floor no scheduler can beat: every GPU busy from the first submit to the last exit.
        "gpu_bound_makespan_s": round(gpu_seconds / (nodes * gpus), 1),
        "submit_to_reserved_p50_ms": round(statistics.median(to_reserved), 1),
        "submit_to_reserved_p99_ms": round(pct(to_reserved, 99), 1),
        "submit_to_running_p50_ms": round(statistics.median(to_running), 1),
        "submit_to_running_p99_ms": round(pct(to_running, 99), 1),
        "reserved_to_running_p50_ms": round(statistics.median(start_lag), 1),
        "reserved_to_running_p99_ms": round(pct(start_lag, 99), 1),
        "services_cpu_s": round(services_cpu, 1),
        "machine": f"{os.cpu_count()} cpu, Python {platform.python_version()}",
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--nodes", type=int, default=256)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--agent-procs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--host-agents", metavar="URL", help=argparse.SUPPRESS)
    ap.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.host_agents:
        asyncio.run(host_agents(a.host_agents, a.first, a.count, a.nodes, a.gpus))
        return
    result = asyncio.run(load_bench(a.jobs, a.clients, a.nodes, a.gpus, a.agent_procs, a.timeout))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
