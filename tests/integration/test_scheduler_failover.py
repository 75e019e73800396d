"""Two real scheduler processes on one log: safety under a race and a SIGKILL takeover.

Fault: two `corral scheduler` processes run at once while 500 gangs are
submitted; mid-run the leader is SIGKILLed.
Check: a full replay shows no GPU in two gangs at any log position and no
partial gang; every job reaches a final state (completed); the survivor's
live state (its snapshot at a clean stop) equals a fresh replay of the log
up to the same position, byte for byte.
Invariants: DESIGN.md 1, 2, 3 and 6.
"""

from __future__ import annotations

import asyncio
import random
import signal
from pathlib import Path

import pytest

from events.bus import Bus
from events.follow import Follower
from events.sdk import Client
from events.server import NatsServer
from events.snapshots import SnapshotStore
from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import TERMINAL, ClusterState, snapshot
from schemas import GangReserved, JobSpec, Topology
from tests.integration.harness import agents, assert_no_double_booking, start_corral, stop, wait_until
from tests.stored import fold_stored, stored

pytestmark = pytest.mark.slow

JOBS = 500


def _gang(rng: random.Random, i: int) -> JobSpec:
    gpus, ranks = rng.choice([(1, 1), (1, 2), (2, 1), (4, 1), (8, 1), (4, 2), (8, 2), (8, 4)])
    topo = Topology(level="leaf", mode="prefer") if ranks * gpus > 8 else None
    return JobSpec(name=f"gang-{i}", queue="default", ranks=ranks, gpus_per_rank=gpus, topology=topo,
                   priority=rng.randint(0, 3), command=("sleep", f"{rng.uniform(0.02, 0.3):.2f}"))


async def _all_events(bus: Bus) -> list[tuple[int, object]]:
    return [(env.seq, env.event) async for batch in bus.replay() for env in batch]


async def test_two_schedulers_500_gangs_leader_killed(nats_server: NatsServer, bus: Bus, tmp_path: Path) -> None:
    common = ["--nats", nats_server.url, "scheduler", "--lease-ttl", "1.5", "--tick", "0.2",
              "--heartbeat-timeout", "60", "--topology-levels", "block,leaf", "--log-level", "warning"]
    procs = {sid: start_corral(*common, "--id", sid, log=tmp_path / f"{sid}.log") for sid in ("s1", "s2")}
    follower = Follower(bus, evolve, ClusterState())
    follow = asyncio.create_task(follower.follow())
    try:
        async with agents(bus, 8, tmp_path / "agents"):
            await wait_until(follower, lambda s: s.epoch >= 1 and len(s.nodes) == 8, 30, "a leader and 8 nodes")
            client = Client(bus, user="test")
            rng = random.Random(7)
            killed = ""
            for i in range(JOBS):
                await client.submit(_gang(rng, i), job_id=f"g{i:03d}")
                if i == JOBS // 2:
                    # Mid-run: SIGKILL whoever leads now; the other must take over.
                    killed = follower.state.scheduler_id
                    assert killed in procs
                    procs[killed].send_signal(signal.SIGKILL)
                    procs[killed].wait(10)
            survivor = next(s for s in procs if s != killed)
            await wait_until(follower, lambda s: s.scheduler_id == survivor, 30, f"{survivor} to take over")
            await wait_until(
                follower, lambda s: sum(j.status in TERMINAL for j in s.jobs.values()) == JOBS, 240,
                "every job to reach a final state")
        assert stop(procs[survivor]) == 0, (tmp_path / f"{survivor}.log").read_text()[-3000:]
    finally:
        follow.cancel()
        for p in procs.values():
            if p.poll() is None:
                p.kill()

    events = await _all_events(bus)
    final = assert_no_double_booking(events)
    statuses = {j.status for j in final.jobs.values()}
    assert statuses == {"completed"}, statuses
    assert final.epoch >= 2, "the takeover must have elected a newer epoch"
    epochs = {e.epoch for _, e in events if isinstance(e, GangReserved)}
    assert min(epochs) == 1 and max(epochs) >= 2, f"both leaders must have placed gangs: epochs {epochs}"

    # The survivor's live state at its clean stop equals a replay of the log to the same position.
    live = await SnapshotStore(bus.js).load(ClusterState)
    assert live is not None and live.seq > 0
    assert_no_double_booking([(s, e) for s, e in events if s <= live.seq])
    replayed = fold_stored(await stored(bus), live.seq)  # the scheduler dates events by the stream (#30)
    assert snapshot(replayed) == snapshot(live)
