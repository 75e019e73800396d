"""`corral demo` against a running cluster: the small workload preempts a two-node gang and resumes it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from events.bus import Bus
from events.server import NatsServer
from tests.integration.harness import CORRAL, agents, processes, scheduler


async def test_demo_on_a_two_node_cluster_preempts_and_resumes(bus: Bus, nats_server: NatsServer,
                                                             tmp_path: Path) -> None:
    async with scheduler(bus), agents(bus, 2, tmp_path, gpus=4, runtime=processes):
        proc = await asyncio.create_subprocess_exec(
            CORRAL, "demo", "--nats", nats_server.url, "--wait", "30", "--duration", "120",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await asyncio.wait_for(proc.communicate(), 150)
    text = out.decode()
    assert proc.returncode == 0, text
    assert "gang demo-ddp-2node: all 2 ranks reserved at once across 2 nodes" in text, text
    assert "preempting demo-ddp-2node for demo-urgent-eval" in text, text
    assert "demo-ddp-2node resumed as attempt 2 from its checkpoint" in text, text
    # #41: it narrates what it does, from the log's end, not the cluster's own start as if it were the demo.
    assert "NodeRegistered" not in text and "SchedulerElected" not in text, text
