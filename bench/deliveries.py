"""Counted, not timed: what nats-server delivers to the agents for one 1-rank job's whole life (#40).

For each cluster size in `--nodes`: a nats-server, a `corral scheduler` and `corral agent-host` processes
(simulated nodes, each with its own filtered consumer of its node's slice). Once every node registered and
the log is quiet, one 1-rank job is submitted and run to completion. The figure is the server's own count:
the sum over the agents' consumers of messages delivered (`/jsz?consumers=true`, `delivered.consumer_seq`)
after the job minus before it. The baseline in the same run is what a whole-log reader (the scheduler's
consumer) was delivered for the same job, and what every agent would be delivered if each read the whole
log (nodes x that).

    python bench/deliveries.py [--nodes 64,4096]

Prints one JSON object on its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.scale import vm_kb  # noqa: E402
from events.bus import Bus  # noqa: E402
from events.server import NatsServer  # noqa: E402
from schemas import JobCompleted, JobSpec, JobSubmitted, NodeRegistered  # noqa: E402

CORRAL = [sys.executable, "-m", "orchestrator.cli"]
PER_HOST = 1024


def consumers(monitor_port: int) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{monitor_port}/jsz?consumers=true&config=true", timeout=30) as r:
        doc = json.loads(r.read())
    out = []
    for account in doc.get("account_details") or []:
        for stream in account.get("stream_detail") or []:
            if stream.get("name") == "CORRAL":
                out += stream.get("consumer_detail") or []
    return out


def delivered(monitor_port: int) -> tuple[int, int, int]:
    """(messages delivered to the agents' slice consumers, to whole-log consumers, agent consumers)."""
    agents = whole = n = 0
    for c in consumers(monitor_port):
        filters = c.get("config", {}).get("filter_subjects") or []
        count = int(c.get("delivered", {}).get("consumer_seq", 0))
        if any(f.startswith("corral.job.*.*.") for f in filters):
            agents, n = agents + count, n + 1
        elif not filters and not c.get("config", {}).get("filter_subject"):
            whole += count
    return agents, whole, n


async def one_size(nodes: int, tmp: Path, settle_s: float) -> dict[str, Any]:
    async with NatsServer(tmp / "nats") as server:
        assert server.monitor_port is not None
        nats = ["--nats", server.url]
        quiet = ["--log-level", "warning"]
        procs = [subprocess.Popen([*CORRAL, *nats, "scheduler", *quiet, "--id", "s1", "--heartbeat-timeout", "3600"],
                                  cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
        bus = await Bus.connect(server.url, name="bench-deliveries")
        try:
            for first in range(0, nodes, PER_HOST):
                procs.append(subprocess.Popen(
                    [*CORRAL, *nats, "agent-host", *quiet, "--nodes", str(min(PER_HOST, nodes - first)), "--first",
                     str(first), "--heartbeat", "10", "--data-dir", str(tmp / "hosts")],
                    cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            # And one node as its own `corral agent` process: its memory at this cluster size (#40 acceptance 4).
            probe = subprocess.Popen([*CORRAL, *nats, "agent", *quiet, "--node-id", "probe", "--runtime", "simulated",
                                      "--fake-gpus", "8", "--address", "127.0.0.1", "--data-dir", str(tmp / "probe")],
                                     cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(probe)
            t0 = time.monotonic()
            seen: set[str] = set()
            async with asyncio.timeout(600):
                async for env in bus.tail(from_seq=1, subjects=["corral.node.*.NodeRegistered"]):
                    if isinstance(env.event, NodeRegistered):
                        seen.add(env.event.node_id)
                    if len(seen) >= nodes + 1:
                        break
            up_s = time.monotonic() - t0
            print(f"{nodes} nodes registered in {up_s:.1f}s", file=sys.stderr, flush=True)
            await asyncio.sleep(settle_s)  # quiet: the catch-ups and the first node views are done
            before, whole_before, agent_consumers = delivered(server.monitor_port)
            log_before = await bus.last_seq()
            job = f"probe-{nodes}"
            await bus.append(JobSubmitted(event_id=f"submit:{job}", occurred_at=time.time(), job_id=job,
                                          spec=JobSpec(name=job, ranks=1, gpus_per_rank=1, command=("sleep", "0.2"))))
            async with asyncio.timeout(120):
                async for env in bus.tail(from_seq=log_before + 1, subjects=[f"corral.job.{job}.JobCompleted"]):
                    if isinstance(env.event, JobCompleted):
                        break
            await asyncio.sleep(settle_s / 3)  # the node's release and its last reports
            after, whole_after, _ = delivered(server.monitor_port)
            log_after = await bus.last_seq()
            probe_kb = vm_kb(probe.pid, "VmRSS")
            probe_mb = round(probe_kb / 1024, 1) if probe_kb else None
        finally:
            await bus.close()
            for p in procs:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:
                    p.kill()
    per_reader = whole_after - whole_before
    return {"nodes": nodes, "registered_s": round(up_s, 1), "agent_consumers": agent_consumers,
            "log_events_for_the_job": log_after - log_before,
            "delivered_to_agents_for_the_job": after - before,
            "delivered_to_a_whole_log_reader": per_reader,
            "if_every_agent_read_the_whole_log": per_reader * nodes, "one_agent_process_rss_mb": probe_mb}


async def bench(sizes: list[int], settle_s: float) -> dict[str, Any]:
    rows = []
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="corral-deliveries-") as d:
            rows.append(await one_size(n, Path(d), settle_s))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    first, last = rows[0]["delivered_to_agents_for_the_job"], rows[-1]["delivered_to_agents_for_the_job"]
    return {"machine": f"{platform.machine()}, {os.cpu_count()} cpu", "sizes": rows,
            "ratio_largest_to_smallest": round(last / first, 3) if first else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", default="64,4096", help="cluster sizes, comma-separated (default %(default)s)")
    ap.add_argument("--settle-s", type=float, default=15.0, help="quiet time before and after the job")
    a = ap.parse_args()
    print(json.dumps(asyncio.run(bench([int(x) for x in a.nodes.split(",")], a.settle_s))))


if __name__ == "__main__":
    main()
