"""Rebuild the scheduler's state from the log, against the raw read rate of the same stream.

    python bench/rebuild.py [--events 1000000] [--tail 10000]

Appends N events of a valid busy-cluster log (gangs on 1,024 nodes started,
checkpointed, finished; bench/scheduler.py's lifecycle_log) to an
embedded nats-server, then measures in one run:
- raw_per_s: the fastest raw nats-py read of the stream, decoding each event
  (plain nats-py: pull requests answered on one subscription's callback);
- read_per_s: our replay API reading the same events without folding them
  (Bus.replay hands data messages from nats-py's parser straight to its
  reader, skipping nats-py's per-message headers/Msg/queue work);
- rebuild_per_s: our replay API folding every event with `evolve` into a
  ClusterState (what a scheduler, agent or CLI does at start);
- ratio = rebuild / raw (target >= 0.8), and fold_ratio = rebuild / read:
  what the fold itself costs on top of our own read;
- restart_s: a restart from the newest snapshot (object store) plus the
  tail of --tail events after it (target < 3 s).
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from replay import read_raw
from scheduler import lifecycle_log

from events.bus import Bus
from events.follow import Follower
from events.server import NatsServer
from events.snapshots import SnapshotStore
from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import ClusterState, snapshot


async def rebuild(bus: Bus, expect: int) -> tuple[float, ClusterState]:
    follower = Follower(bus, evolve, ClusterState())
    t = time.perf_counter()
    await follower.catch_up()
    dt = time.perf_counter() - t
    assert follower.state.seq == expect, f"rebuilt to seq {follower.state.seq}, expected {expect}"
    return expect / dt, follower.state


async def read(bus: Bus, expect: int) -> float:
    t = time.perf_counter()
    n = 0
    async for batch in bus.replay():
        n += len(batch)
    dt = time.perf_counter() - t
    assert n == expect, f"read {n} events, expected {expect}"
    return expect / dt


async def restart(bus: Bus, n: int, tail: int) -> tuple[float, int, int]:
    """Snapshot the state at seq n - tail, then time load + catch-up, as a restarting scheduler does."""
    state = ClusterState()
    async for batch in bus.replay(to_seq=n - tail):
        for env in batch:
            state = evolve(state, env.event, env.seq)
    store = SnapshotStore(bus.js, name="bench")
    size = await store.save(state)
    del state
    gc.collect()
    t = time.perf_counter()
    loaded = await SnapshotStore(bus.js, name="bench").load(ClusterState)
    assert loaded is not None
    follower = Follower(bus, evolve, loaded)
    await follower.catch_up()
    dt = time.perf_counter() - t
    assert follower.state.seq == n
    return dt, size, len(follower.state.jobs)


async def run(n: int, tail: int, rounds: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="corral-rebuild-") as tmp:
        async with NatsServer(tmp) as server:
            bus = await Bus.connect(server.url)
            try:
                print(f"appending {n:,} events ...", flush=True)
                t = time.perf_counter()
                chunk: list = []  # type: ignore[type-arg]
                for ev in lifecycle_log(n):
                    chunk.append(ev)
                    if len(chunk) == 20_000:
                        await bus.append_many(chunk)
                        chunk = []
                if chunk:
                    await bus.append_many(chunk)
                print(f"  appended at {n / (time.perf_counter() - t):,.0f}/s", flush=True)
                raws, reads, ours, raw_cpu, our_cpu = [], [], [], [], []
                final: ClusterState | None = None
                for r in range(rounds):
                    c = time.process_time()
                    raws.append(await read_raw(bus, n))
                    raw_cpu.append(n / (time.process_time() - c))
                    reads.append(await read(bus, n))
                    final = None
                    gc.collect()
                    c = time.process_time()
                    rate, final = await rebuild(bus, n)
                    our_cpu.append(n / (time.process_time() - c))
                    ours.append(rate)
                    print(f"  round {r + 1}: rebuild {ours[-1]:,.0f}/s  read {reads[-1]:,.0f}/s  raw {raws[-1]:,.0f}/s",
                          flush=True)
                assert final is not None and final.voids == 0, "the bench log must be a valid one"
                state_bytes = len(snapshot(final))
                del final
                gc.collect()
                restart_s, snap_bytes, jobs = await restart(bus, n, tail)
                print(f"  restart from snapshot ({snap_bytes / 1e6:.1f} MB, {jobs:,} jobs) + {tail:,} "
                      f"events: {restart_s:.2f}s", flush=True)
            finally:
                await bus.close()
    best_ours, best_raw = max(ours), max(raws)
    return {
        "events": n,
        "rebuild_per_s": round(best_ours),
        "raw_per_s": round(best_raw),
        "ratio": round(best_ours / best_raw, 3),
        "read_per_s": round(max(reads)),
        "fold_ratio": round(best_ours / max(reads), 3),
        # Per second of this process's CPU: steadier than wall time on a shared machine.
        "rebuild_per_cpu_s": round(max(our_cpu)),
        "raw_per_cpu_s": round(max(raw_cpu)),
        "cpu_ratio": round(max(our_cpu) / max(raw_cpu), 3),
        "restart_s": round(restart_s, 3),
        "restart_tail_events": tail,
        "snapshot_bytes": state_bytes,
        "python": platform.python_version(),
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--tail", type=int, default=10_000, help="events after the snapshot for the restart figure")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    print(json.dumps(asyncio.run(run(a.events, min(a.tail, a.events // 2), a.rounds))))
