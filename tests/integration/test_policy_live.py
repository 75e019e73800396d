"""`corral scheduler --policy drf` decides live as the simulator's DRF does (issue #42, acceptance 3).

A real `corral scheduler --policy drf` process and two simulated agents (4 fake GPUs each) on a real
nats-server run a submission sequence; `corral sim --from-cluster` exports that log and re-runs its
submissions, on the log's own nodes and with each job's measured run time, under drf (and, to show the
workload tells policies apart, corral and fifo). Compared: every GangReserved, in log order -- which
job, on which nodes and GPU indices.

What may legitimately differ in a live run is time: the scheduler decides a tick after what it reacts
to, and a job runs a little longer than its `sleep` (start and exit reports). The sequence is built so
that only order matters: a blocker of every GPU in a queue that DRF ranks first (all queues hold 0 GPUs
at the start; ties go by name), submitted with the rest in one pipeline, so every job is pending when
it ends and the first placements are one decision; the run times then space every later completion at
least 1.5 s apart, far beyond the tick and the report delays.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from events.bus import Bus
from events.sdk import Client
from events.server import NatsServer
from schemas import JobSpec
from tests.faults.services import observer, scheduler_proc, stop_all, until
from tests.integration.harness import CORRAL, agents

pytestmark = pytest.mark.slow

#: (job id, queue, ranks, GPUs per rank, seconds): in submit order. "0blocker" sorts before every other
#: queue, so DRF starts it first on the empty cluster, whatever else it already sees.
JOBS = [
    ("z", "0blocker", 2, 4, 6.0),
    ("a1", "a", 1, 4, 13.5),
    ("a2", "a", 1, 2, 6.0),
    ("a3", "a", 1, 2, 4.5),
    ("b1", "b", 1, 2, 9.0),
    ("c1", "c", 1, 1, 3.0),
    ("b2", "b", 1, 4, 4.5),
    ("c2", "c", 1, 2, 7.5),
    ("c3", "c", 1, 1, 4.5),
]

Placement = tuple[str, tuple[tuple[str, tuple[int, ...]], ...]]


def placements(path: Path) -> list[Placement]:
    """Every GangReserved of a log file, in log order: (job, ((node, GPU indices) per rank))."""
    out = []
    for line in path.read_text().splitlines():
        e = json.loads(line)
        if e.get("type") == "GangReserved":
            out.append((e["job_id"], tuple((r["node_id"], tuple(r["gpus"])) for r in e["ranks"])))
    return out


def events_of(path: Path, kind: str) -> list[dict[str, Any]]:
    return [e for line in path.read_text().splitlines() if (e := json.loads(line)).get("type") == kind]


async def test_live_drf_decides_as_the_simulated_drf(nats_server: NatsServer, bus: Bus, tmp_path: Path) -> None:
    sched = scheduler_proc(nats_server.url, "live-drf", tmp_path, policy="drf", log_level="info")
    try:
        async with observer(bus) as follower, agents(bus, 2, tmp_path / "agents", gpus=4):
            await until(follower, lambda s: s.epoch >= 1 and len(s.nodes) == 2, 60, "a leader and both nodes",
                        alive=[sched])
            client = Client(bus, user="test")
            await client.submit_many([
                (jid, JobSpec(name=jid, queue=queue, ranks=ranks, gpus_per_rank=gpus, command=("sleep", str(secs))))
                for jid, queue, ranks, gpus, secs in JOBS])
            await until(follower, lambda s: all(s.jobs[j].status == "completed" for j, *_ in JOBS), 180,
                        "every job to complete", alive=[sched])
            out = tmp_path / "sim"
            proc = await asyncio.to_thread(
                subprocess.run, [CORRAL, "--nats", nats_server.url, "sim", "--from-cluster", "--policy",
                                 "drf,corral,fifo", "--out", str(out), "--no-figures", "--json"],
                capture_output=True, text=True, timeout=120)
    finally:
        stop_all([sched])
    assert proc.returncode == 0, proc.stderr
    assert "decided live by policy drf" in proc.stderr, proc.stderr
    live = out / "cluster-log.jsonl"
    elections = events_of(live, "SchedulerElected")
    assert [e.get("policy") for e in elections] == ["drf"], elections
    assert '"policy": "drf"' in (tmp_path / "live-drf.log").read_text().replace('":"', '": "')
    # Timing did not decide anything: every job was in the log before the blocker ended.
    order = [e["type"] + ":" + e["job_id"] for e in events_of(live, "JobSubmitted") + events_of(live, "JobCompleted")
             if e["type"] == "JobSubmitted" or e["job_id"] == "z"]
    assert order[-1] == "JobCompleted:z", order

    decided = placements(live)
    assert sorted(j for j, _ in decided) == sorted(j for j, *_ in JOBS), decided
    assert placements(out / "events-drf.jsonl") == decided
    # The sequence tells the policies apart, so the comparison above could have failed.
    for other in ("corral", "fifo"):
        assert placements(out / f"events-{other}.jsonl") != decided, other
    assert json.loads(proc.stdout.splitlines()[-1])  # the re-run's figures (all three policies ran)
