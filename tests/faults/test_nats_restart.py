"""nats-server restarts under a running cluster: every service reconnects by itself and nothing is lost.

Fault: mid-workload the nats-server is stopped and started again on the same
data dir and port, first cleanly (SIGTERM), later with SIGKILL (no flush);
the scheduler and three agents are real `corral` processes that nobody
restarts, and the test keeps submitting through both outages (a submit that
fails is retried with the same job id, as any client should).
Check: every service process is still alive at the end; every submitted job
is in the log exactly once and completed; no agent started a worker twice
(their own logs); no node was declared failed (each
outage was far shorter than the heartbeat timeout, so the scheduler's
heartbeat watch must have resumed too); the replayed log keeps invariants
1, 2, 3, 6 and has no duplicate WorkerStarted.
Invariant: DESIGN.md 6 (no event lost or applied twice) across server restarts.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import nats.errors
import pytest

from events.bus import Bus, BusError
from events.sdk import Client
from events.server import NatsServer
from orchestrator.core.model.state import TERMINAL
from schemas import JobSpec, NodeFailed
from tests.faults.logcheck import check_log, read_log
from tests.faults.services import agent_proc, logged_starts, observer, scheduler_proc, stop_all, until

pytestmark = pytest.mark.slow

JOBS = 400
NODES = 3


async def submit_until_stored(client: Client, spec: JobSpec, job_id: str) -> int:
    """Submit, retrying through an outage; the id makes every retry the same event. Attempts used."""
    for attempt in range(1, 60):
        try:
            await client.submit(spec, job_id=job_id)
            return attempt
        except (BusError, nats.errors.Error, TimeoutError):
            await asyncio.sleep(0.25)
    raise AssertionError(f"{job_id} could not be submitted in 60 attempts")


async def test_nats_server_restarts_mid_workload(nats_server: NatsServer, bus: Bus, tmp_path: Path) -> None:
    url = nats_server.url
    procs = [scheduler_proc(url, "s1", tmp_path, heartbeat_timeout=10.0, lease_ttl=3.0, snapshot_every=200)]
    procs += [agent_proc(url, f"n{i}", tmp_path, index=i) for i in range(NODES)]
    rng = random.Random(5)
    ids = [f"r{i:03d}" for i in range(JOBS)]
    retried = 0
    async with observer(bus) as follower:
        try:
            await until(follower, lambda s: s.epoch >= 1 and len(s.nodes) == NODES, 60, "a leader and the nodes",
                        alive=procs)
            client = Client(bus, user="test")

            async def submit(lo: int, hi: int) -> None:
                nonlocal retried
                for i in range(lo, hi):
                    spec = JobSpec(name=ids[i], ranks=rng.choice([1, 1, 2]), gpus_per_rank=rng.choice([1, 2, 4, 8]),
                                   command=("sleep", f"{rng.uniform(0.05, 0.4):.2f}"))
                    retried += await submit_until_stored(client, spec, ids[i]) - 1
                    await asyncio.sleep(0.01)

            await submit(0, 150)
            # 1. A clean restart while work is queued and running, submits continuing through it.
            submitting = asyncio.create_task(submit(150, 275))
            await asyncio.sleep(0.5)
            await asyncio.to_thread(nats_server.restart)
            await submitting
            await until(follower, lambda s: len(s.jobs) == 275, 60, "the log to have every job so far", alive=procs)
            # 2. A crash: SIGKILL, no flush; down for a second while submits keep coming.
            submitting = asyncio.create_task(submit(275, JOBS))
            await asyncio.sleep(0.5)
            await asyncio.to_thread(nats_server.kill)
            await asyncio.sleep(1.0)
            await asyncio.to_thread(nats_server.start)
            await submitting
            await until(follower, lambda s: sum(j.status in TERMINAL for j in s.jobs.values()) == JOBS, 180,
                        "every job to finish", alive=procs)
            assert all(p.poll() is None for p in procs), "a service died"
        finally:
            # Exit codes are not checked: a stop under load can hang in the bus reader (test_shutdown.py).
            stop_all(procs)

    events = await read_log(bus)
    final = check_log(events, jobs=ids)
    assert {j.status for j in final.jobs.values()} == {"completed"}
    failed = [e for _, e in events if isinstance(e, NodeFailed)]
    assert not failed, f"nodes declared failed by a server restart: {failed}"
    assert all(not n.failed for n in final.nodes.values()) and len(final.nodes) == NODES
    twice = {k: n for k, n in logged_starts(tmp_path.glob("agent-*.log")).items() if n > 1}
    assert not twice, f"agents started a worker twice: {twice}"
    print(f"{retried} submits were retried through the outages")
