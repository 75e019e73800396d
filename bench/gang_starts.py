"""Gangs back to back on a few nodes: how long a reserved gang waits for its workers to start.

An embedded nats-server, the scheduler and `--nodes` agents (8 fake GPUs each,
simulated runtime, the `corral agent` reconcile tick of 0.5 s) in one process.
`--gangs` gangs of 2 ranks x 8 GPUs, each running `--run-s` seconds, are
submitted at once: two nodes per gang, so each new gang lands on GPUs a gang
that just ended still held a moment ago. Per gang, reserved -> running =
JobRunning's stream time - GangReserved's (both stamped by the server, one
clock).

Each agent reads its own node's slice (#40). A rank's exit, the gang's
completion and the next gang's orders for the same GPUs can arrive together:
the agent reconciles while the exited worker is still tracked (it is dropped
once the agent's own WorkerExited is folded) and defers the new rank
(`worker_start_deferred`). Unless dropping the worker wakes the reconcile
loop, the rank starts at the next tick: up to 0.5 s late.

The window is the time between the agent's report of the exit and its drop of
the worker, and a runtime's `remove` is in it: a simulated worker is removed
at once, a container in 50-200 ms (measured on this machine's engine).
`--remove-ms` (default 150) makes the simulated runtime's `remove` take as long
as a container's.

    python bench/gang_starts.py [--nodes 4] [--gangs 150] [--run-s 0.2]

Prints one JSON object on its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from events.bus import Bus  # noqa: E402
from events.server import NatsServer  # noqa: E402
from nodeagent.agent import Agent, AgentConfig  # noqa: E402
from nodeagent.fake_gpus import fake_inventory  # noqa: E402
from nodeagent.runtime.base import WorkerHandle  # noqa: E402
from nodeagent.runtime.simulated import SimulatedRuntime  # noqa: E402
from orchestrator.logging import configure_logging  # noqa: E402
from orchestrator.scheduler.service import Scheduler, SchedulerConfig  # noqa: E402
from schemas import ClusterConfigured, GangReserved, JobRunning, JobSpec, JobSubmitted  # noqa: E402

GPUS = 8


class ContainerPacedRuntime(SimulatedRuntime):
    """The simulated runtime, with a `remove` as slow as a container's."""

    def __init__(self, remove_s: float) -> None:
        super().__init__()
        self.remove_s = remove_s

    async def remove(self, handle: WorkerHandle) -> None:
        await asyncio.sleep(self.remove_s)
        await super().remove(handle)


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


async def gang_starts(nodes: int, gangs: int, run_s: float, tick_s: float, *, remove_s: float = 0.15,
                      timeout_s: float = 300.0) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="corral-gang-starts-") as tmp:
        async with NatsServer(Path(tmp) / "nats") as server:
            bus = await Bus.connect(server.url)
            sched = Scheduler(bus, SchedulerConfig(
                scheduler_id="bench", tick_s=1.0, lease_ttl_s=5.0, heartbeat_timeout_s=3600.0,
                cluster=ClusterConfigured(event_id="config:bench", occurred_at=0.0, topology_levels=(),
                                          min_runtime_s=60.0)))
            agents = [
                Agent(bus, AgentConfig(node_id=f"n{i}", data_dir=Path(tmp) / f"n{i}", tick_s=tick_s),
                      fake_inventory(GPUS, node_id=f"n{i}"), ContainerPacedRuntime(remove_s))
                for i in range(nodes)
            ]
            tasks = [asyncio.create_task(sched.run())]
            tasks += [asyncio.create_task(a.run()) for a in agents]
            try:
                spec = JobSpec(name="g", ranks=2, gpus_per_rank=GPUS, command=("sleep", str(run_s)))
                ids = [f"g{i:04d}" for i in range(gangs)]
                t0 = time.perf_counter()
                await bus.append_many([JobSubmitted(event_id=f"submit:{j}", occurred_at=time.time(), job_id=j,
                                                    spec=spec) for j in ids])
                reserved: dict[str, float] = {}
                running: dict[str, float] = {}
                try:
                    async with asyncio.timeout(timeout_s):
                        async for env in bus.tail(subjects=["corral.job.*.GangReserved", "corral.job.*.JobRunning"],
                                                  from_seq=1):
                            ev = env.event
                            if isinstance(ev, GangReserved):
                                reserved.setdefault(ev.job_id, env.stream_time)
                            elif isinstance(ev, JobRunning):
                                running.setdefault(ev.job_id, env.stream_time)
                                if len(running) == gangs:
                                    break
                except TimeoutError:
                    raise SystemExit(f"only {len(running)} of {gangs} gangs ran within {timeout_s} s") from None
                wall = time.perf_counter() - t0
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                await bus.close()
    waits = [(running[j] - reserved[j]) * 1000 for j in ids]
    return {
        "gang_starts_nodes": nodes,
        "gang_starts_gangs": gangs,
        "gang_starts_run_s": run_s,
        "gang_starts_agent_tick_s": tick_s,
        "gang_starts_remove_ms": round(remove_s * 1000),
        "reserved_to_running_p50_ms": round(statistics.median(waits), 1),
        "reserved_to_running_p99_ms": round(pct(waits, 99), 1),
        "reserved_to_running_max_ms": round(max(waits), 1),
        "over_50ms": sum(w > 50 for w in waits),
        "all_running_s": round(wall, 2),
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--gangs", type=int, default=150)
    ap.add_argument("--run-s", type=float, default=0.2)
    ap.add_argument("--tick-s", type=float, default=0.5, help="agent reconcile tick (corral agent: 0.5)")
    ap.add_argument("--remove-ms", type=float, default=150.0, help="how long removing a worker takes")
    ap.add_argument("--log-level", default="warning", help="services' structlog level (info: see worker_start_deferred)")
    a = ap.parse_args()
    configure_logging(a.log_level)
    print(json.dumps(asyncio.run(gang_starts(a.nodes, a.gangs, a.run_s, a.tick_s, remove_s=a.remove_ms / 1000))))
