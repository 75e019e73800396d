"""`corral up --nodes N` as a user runs it, then a burst of jobs (#40 acceptance 2).

Starts `corral up --nodes N --runtime simulated` (every node a real agent in the one process, each with its
own filtered consumer), times until `corral nodes --json` lists all N, submits `--jobs` jobs at once
(1-16 GPUs; every 50th a 2-4 node gang of 8 GPUs a rank, a few seconds each), and waits until every one
ended. Counts from the log: NodeFailed, and from `corral up`'s own output: lease_lost and Slow Consumer.

    python bench/up_scale.py [--nodes 1024 --jobs 2000]

Prints one JSON object on its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from events.bus import Bus  # noqa: E402
from schemas import JobSpec, JobSubmitted, NodeFailed  # noqa: E402

CORRAL = [sys.executable, "-m", "orchestrator.cli"]
ENDS = ("JobCompleted", "JobFailed", "JobCancelled", "JobRejected")


def spec(rng: random.Random, i: int) -> JobSpec:
    if i % 50 == 49:
        return JobSpec(name=f"gang-{i}", ranks=rng.choice((2, 4)), gpus_per_rank=8,
                       command=("sleep", str(rng.uniform(2, 6))))
    if i % 10 == 9:  # 16 GPUs: two nodes
        return JobSpec(name=f"job-{i}", ranks=2, gpus_per_rank=8, command=("sleep", str(rng.uniform(1, 5))))
    return JobSpec(name=f"job-{i}", ranks=1, gpus_per_rank=rng.choice((1, 2, 4, 8)),
                   command=("sleep", str(rng.uniform(1, 5))))


def listed(url: str) -> int:
    r = subprocess.run([*CORRAL, "--nats", url, "nodes", "--json"], capture_output=True, text=True, cwd=ROOT,
                       timeout=60)
    if r.returncode != 0:
        return 0
    doc = json.loads(r.stdout)
    return len(doc["nodes"] if isinstance(doc, dict) else doc)


async def bench(nodes: int, jobs: int, timeout: float) -> dict[str, Any]:
    rng = random.Random(40)
    with tempfile.TemporaryDirectory(prefix="corral-up-scale-") as d:
        out = Path(d) / "up.log"
        with out.open("wb") as log:
            up = subprocess.Popen([*CORRAL, "up", "--nodes", str(nodes), "--runtime", "simulated", "--port", "0", "--no-ui",
                                   "--data-dir", str(Path(d) / "data"), "--log-level", "info"],
                                  stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            t0 = time.monotonic()
            url = None
            while url is None:
                if up.poll() is not None:
                    raise RuntimeError(f"corral up exited {up.returncode}:\n{out.read_text()[-3000:]}")
                m = re.search(r"NATS at (nats://\S+)", out.read_text(errors="replace"))
                url = m.group(1) if m else None
                await asyncio.sleep(0.2)
            n = 0
            while n < nodes and time.monotonic() - t0 < timeout:
                n = await asyncio.to_thread(listed, url)
                if n < nodes:
                    await asyncio.sleep(2.0)
            listed_s = time.monotonic() - t0
            print(f"{n} of {nodes} nodes listed after {listed_s:.1f}s", file=sys.stderr, flush=True)
            bus = await Bus.connect(url, name="bench-up-scale")
            try:
                first = await bus.last_seq() + 1
                ids = [f"b{i:05d}" for i in range(jobs)]
                t1 = time.monotonic()
                for k in range(0, jobs, 500):
                    await bus.append_many([JobSubmitted(event_id=f"submit:{j}", occurred_at=time.time(), job_id=j,
                                                        spec=spec(rng, i + k))
                                           for i, j in enumerate(ids[k:k + 500])], timeout=60.0)
                ended: dict[str, str] = {}
                node_failed = 0
                async with asyncio.timeout(timeout):
                    async for env in bus.tail(from_seq=first, subjects=[*(f"corral.job.*.{t}" for t in ENDS),
                                                                        "corral.node.*.NodeFailed"]):
                        if isinstance(env.event, NodeFailed):
                            node_failed += 1
                        elif env.event.job_id in ids:  # type: ignore[union-attr]
                            ended[env.event.job_id] = type(env.event).__name__  # type: ignore[union-attr]
                        if len(ended) == jobs:
                            break
                burst_s = time.monotonic() - t1
            finally:
                await bus.close()
        finally:
            up.send_signal(signal.SIGINT)
            try:
                up.wait(120)
            except subprocess.TimeoutExpired:
                up.kill()
        text = out.read_text(errors="replace")
    outcomes: dict[str, int] = {}
    for v in ended.values():
        outcomes[v] = outcomes.get(v, 0) + 1
    return {"machine": f"{platform.machine()}, {os.cpu_count()} cpu", "nodes": nodes, "nodes_listed": n,
            "nodes_listed_s": round(listed_s, 1), "jobs": jobs, "jobs_ended": len(ended), "outcomes": outcomes,
            "burst_s": round(burst_s, 1), "node_failed": node_failed, "lease_lost": text.count("lease_lost"),
            "slow_consumer": text.lower().count("slow consumer"), "up_rc": up.returncode}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--timeout", type=float, default=900.0)
    a = ap.parse_args()
    print(json.dumps(asyncio.run(bench(a.nodes, a.jobs, a.timeout))))


if __name__ == "__main__":
    main()
