"""End-to-end scheduling through NATS: submit -> GangReserved rate and latency.

A real `corral scheduler` process follows an embedded nats-server; the bench
registers `--nodes` (default 1,024) nodes x 8 GPUs (two topology levels above
node) straight into the log, then
1. latency: submits 1-GPU gangs at a steady 100/s for `--latency-s` seconds;
   latency = GangReserved's stream time - JobSubmitted's stream time (both
   stamped by the server, one clock);
2. throughput: submits `--burst` gangs of 1-2 GPUs as fast as it can and
   measures first submit -> last GangReserved.
Used by bench/scheduler.py; runnable alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from events.bus import Bus  # noqa: E402
from events.server import NatsServer  # noqa: E402
from nodeagent.fake_gpus import fake_inventory  # noqa: E402
from schemas import GangReserved, JobSpec, JobSubmitted, NodeRegistered  # noqa: E402

NODES, GPUS = 1024, 8  # the defaults: --nodes


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


async def _register(bus: Bus, nodes: int) -> None:
    events = [
        NodeRegistered(event_id=f"reg:n{i}", occurred_at=time.time(), node_id=f"n{i:04d}", incarnation="1",
                       address=f"10.0.{i // 256}.{i % 256}",
                       inventory=fake_inventory(GPUS, node_id=f"n{i:04d}",
                                                labels={"block": f"b{i // 128}", "leaf": f"l{i // 16}"}))
        for i in range(nodes)
    ]
    await bus.append_many(events)


def _submit(job_id: str, gpus: int) -> JobSubmitted:
    spec = JobSpec(name=job_id, gpus_per_rank=gpus, command=("sleep", "3600"))
    return JobSubmitted(event_id=f"submit:{job_id}", occurred_at=time.time(), job_id=job_id, spec=spec)


class Watch:
    """Stream times of JobSubmitted and GangReserved per job, from a live tail."""

    def __init__(self) -> None:
        self.submitted: dict[str, float] = {}
        self.reserved: dict[str, float] = {}
        self.changed = asyncio.Event()

    async def run(self, bus: Bus) -> None:
        async for env in bus.tail(subjects=["corral.job.*.JobSubmitted", "corral.job.*.GangReserved"], from_seq=1):
            ev = env.event
            if isinstance(ev, JobSubmitted):
                self.submitted[ev.job_id] = env.stream_time
            elif isinstance(ev, GangReserved):
                self.reserved.setdefault(ev.job_id, env.stream_time)
                self.changed.set()

    async def until_reserved(self, ids: list[str], timeout: float) -> None:
        async def wait() -> None:
            while not all(i in self.reserved for i in ids):
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(wait(), timeout)


async def e2e_bench(latency_s: float = 10.0, rate: float = 100.0, burst: int = 4000,
                    nodes: int = NODES) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="corral-e2e-") as tmp:
        async with NatsServer(Path(tmp) / "nats") as server:
            bus = await Bus.connect(server.url)
            log = open(Path(tmp) / "scheduler.log", "wb")  # noqa: SIM115
            proc = subprocess.Popen(
                [sys.executable, "-m", "orchestrator.cli", "--nats", server.url, "scheduler", "--id", "bench",
                 "--tick", "1", "--heartbeat-timeout", "3600", "--log-level", "warning"],
                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
            watch = Watch()
            tail = asyncio.create_task(watch.run(bus))
            try:
                await _register(bus, nodes)
                # warm-up: one job, so the scheduler is elected and caught up before timing
                await bus.append(_submit("warmup", 1))
                await watch.until_reserved(["warmup"], 60)

                # 1. latency at a steady rate
                ids = [f"lat-{i}" for i in range(int(latency_s * rate))]
                t0 = time.perf_counter()
                for i, job_id in enumerate(ids):
                    await asyncio.sleep(max(0.0, t0 + i / rate - time.perf_counter()))
                    await bus.append(_submit(job_id, 1))
                await watch.until_reserved(ids, 60)
                lat = [(watch.reserved[i] - watch.submitted[i]) * 1000 for i in ids]

                # 2. throughput: a burst of small gangs
                ids = [f"burst-{i}" for i in range(burst)]
                events = [_submit(j, 1 + i % 2) for i, j in enumerate(ids)]
                for k in range(0, len(events), 1000):
                    await bus.append_many(events[k : k + 1000])
                await watch.until_reserved(ids, 300)
                first = min(watch.submitted[i] for i in ids)
                last = max(watch.reserved[i] for i in ids)
            finally:
                tail.cancel()
                proc.terminate()
                proc.wait(20)
                await bus.close()
    return {
        "e2e_gangs_per_s": round(burst / (last - first), 1),
        "e2e_burst": burst,
        "e2e_rate_per_s": rate,
        "e2e_p50_ms": round(statistics.median(lat), 2),
        "e2e_p99_ms": round(pct(lat, 99), 2),
        "e2e_max_ms": round(max(lat), 2),
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--latency-s", type=float, default=10.0)
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--burst", type=int, default=4000)
    ap.add_argument("--nodes", type=int, default=NODES, help=f"nodes x {GPUS} GPUs registered (default %(default)s)")
    a = ap.parse_args()
    print(json.dumps(asyncio.run(e2e_bench(a.latency_s, a.rate, a.burst, a.nodes))))
