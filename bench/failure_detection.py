"""Failure detection: how long after a node's agent dies does the log say NodeFailed (#40).

Real processes over one nats-server: a `corral scheduler` (`--heartbeat-timeout`), one `corral agent-host`
of `--nodes` bystanders and, per round, a one-node `corral agent-host` (the victim) that is killed with
SIGKILL once it is registered. Per round: kill -> NodeFailed of the victim, timed on this process's
monotonic clock (one machine, one clock). The baseline in the same run is the window the design promises:
the victim's last beat came up to one interval before the kill, so the scheduler, judging ages once a
second, writes NodeFailed between timeout - interval and timeout + 1 s (+ its tick) after it. A NodeFailed of
a bystander is a false one and counted.

    python bench/failure_detection.py [--nodes 64] [--rounds 3] [--heartbeat 10] [--heartbeat-timeout 40]

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
from schemas import NodeFailed, NodeRegistered  # noqa: E402

CORRAL = [sys.executable, "-m", "orchestrator.cli"]


def start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([*CORRAL, *args], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)


async def wait_for(bus: Bus, kind: type, nodes: set[str], timeout: float, seen: dict[str, float],
                   false_failures: list[str], victims: set[str]) -> None:
    """Until an event of `kind` about each of `nodes` arrived (its monotonic arrival time in `seen`)."""
    async with asyncio.timeout(timeout):
        async for env in bus.tail(subjects=["corral.node.*.NodeRegistered", "corral.node.*.NodeFailed"]):
            e = env.event
            if isinstance(e, NodeFailed) and e.node_id not in victims:
                false_failures.append(e.node_id)
            if isinstance(e, kind) and e.node_id in nodes:
                seen[e.node_id] = time.monotonic()
                if nodes <= seen.keys():
                    return


async def bench(nodes: int, rounds: int, heartbeat: float, timeout: float) -> dict[str, object]:
    detections: list[float] = []
    false_failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="corral-detect-") as d:
        tmp = Path(d)
        async with NatsServer(tmp / "nats") as server:
            nats = ["--nats", server.url]
            quiet = ["--log-level", "warning"]
            procs = [start([*nats, "scheduler", *quiet, "--id", "s1", "--heartbeat-timeout", str(timeout)],
                           tmp / "s.log")]
            try:
                bus = await Bus.connect(server.url, name="bench-detect")
                try:
                    procs.append(start([*nats, "agent-host", *quiet, "--nodes", str(nodes), "--prefix", "by-",
                                        "--heartbeat", str(heartbeat), "--data-dir", str(tmp / "hosts")],
                                       tmp / "bystanders.log"))
                    victims = {f"victim-{r}" for r in range(rounds)}
                    registered: dict[str, float] = {}
                    for r in range(rounds):
                        victim = start([*nats, "agent-host", *quiet, "--nodes", "1", "--prefix", "victim-", "--first", str(r),
                                        "--heartbeat", str(heartbeat), "--data-dir", str(tmp / "hosts")],
                                       tmp / f"victim-{r}.log")
                        procs.append(victim)
                        await wait_for(bus, NodeRegistered, {f"victim-{r}"}, 120, registered, false_failures,
                                       victims)
                        await asyncio.sleep(heartbeat)  # a beat or two in: the monitor knows it
                        killed = time.monotonic()
                        victim.send_signal(signal.SIGKILL)
                        victim.wait()
                        failed: dict[str, float] = {}
                        await wait_for(bus, NodeFailed, {f"victim-{r}"}, timeout * 3 + 60, failed, false_failures,
                                       victims)
                        detections.append(failed[f"victim-{r}"] - killed)
                        print(f"round {r + 1}: NodeFailed {detections[-1]:.1f}s after the kill", file=sys.stderr,
                              flush=True)
                finally:
                    await bus.close()
            finally:
                for p in procs:
                    with contextlib.suppress(ProcessLookupError):
                        p.send_signal(signal.SIGTERM)
                for p in procs:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.wait(20)
                    if p.poll() is None:
                        p.kill()
    return {"machine": platform.machine(), "cpus": os.cpu_count(), "nodes": nodes, "rounds": rounds,
            "heartbeat_s": heartbeat, "heartbeat_timeout_s": timeout,
            "detect_s_min": round(min(detections), 2), "detect_s_median": round(statistics.median(detections), 2),
            "detect_s_max": round(max(detections), 2),
            "promised_window_s": [round(timeout - heartbeat, 2), round(timeout + 2.0, 2)],
            "false_node_failed": len(false_failures)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=64, help="bystander nodes")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--heartbeat", type=float, default=10.0, help="agents' heartbeat interval (corral agent's default)")
    ap.add_argument("--heartbeat-timeout", type=float, default=40.0, help="the scheduler's (its default)")
    a = ap.parse_args()
    print(json.dumps(asyncio.run(bench(a.nodes, a.rounds, a.heartbeat, a.heartbeat_timeout))))


if __name__ == "__main__":
    main()
