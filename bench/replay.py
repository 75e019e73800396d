"""Replay throughput: corral's Bus.replay against the fastest raw nats-py read of the same stream.

Starts its own nats-server (temp dir), appends N realistic events (job
lifecycles with placements, preemptions and failures, node registrations,
queue definitions), then reads the whole stream back with

  ours: `Bus.replay()`, every message decoded into an Envelope;
  raw:  the fastest raw nats-py reads we found (bench/RESULTS.md), timed
        both, the faster one counts: (1) an AckNone pull consumer, raw
        $JS.API.CONSUMER.MSG.NEXT batch requests kept two in flight, a
        callback subscription on the inbox; (2) an ordered push consumer
        (flow control and heartbeats handled by nats-py) with a callback.
        Both decode each message with schemas.decode and keep nothing.

Both run `--rounds` times, alternating; each figure is the best round (the
machine is shared, so the best round is the one least disturbed). The client
CPU time per event (process time, which other load on the machine barely
moves) is reported too: `cpu_ratio` = raw pull CPU / ours CPU. Prints human lines,
then one JSON object as the last line.

    .venv/bin/python bench/replay.py [--events N] [--rounds R] [--sync-always] [--candidates]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from events.bus import Bus
from events.server import NatsServer
from schemas import (
    Checkpointed,
    Event,
    GangReserved,
    Gpu,
    Inventory,
    JobCompleted,
    JobFailed,
    JobRunning,
    JobSpec,
    JobSubmitted,
    NodeRegistered,
    Preempted,
    PreemptionRequested,
    QueueDefined,
    SchedulerElected,
    WorkerExited,
    WorkerStarted,
    decode,
)
from schemas.events import RankPlacement

NODES = 64
GPUS = 8


def _inventory(n: int) -> Inventory:
    gpus = tuple(
        Gpu(index=i, uuid=f"GPU-{n:04x}{i:04x}-5b9e-4a2c-9f00-0000000000{i:02d}", model="NVIDIA H100 80GB HBM3",
            memory_mib=81559, pci_bus_id=f"00000000:{0x18 + i:02X}:00.0")
        for i in range(GPUS)
    )
    links = tuple(tuple(0 if i == j else 118 for j in range(GPUS)) for i in range(GPUS))
    return Inventory(gpus=gpus, links=links, labels={"block": f"b{n // 32}", "leaf": f"l{n // 8}"})


def realistic_events(n: int, t0: float) -> Iterator[Event]:
    """A cluster's log: nodes and queues first, then job lifecycles, some preempted or failed."""
    t = t0
    yield SchedulerElected(event_id="elected:1", occurred_at=t, epoch=1, scheduler_id="sched-a")
    for q, w in (("research", 2.0), ("prod", 4.0), ("batch", 1.0)):
        yield QueueDefined(event_id=f"queue:{q}", occurred_at=t, queue=q, weight=w, guaranteed_gpus=64)
    for i in range(NODES):
        yield NodeRegistered(event_id=f"reg:node-{i:03d}:1", occurred_at=t, node_id=f"node-{i:03d}",
                             incarnation="1", address=f"10.0.{i // 256}.{i % 256}:7070", inventory=_inventory(i))
    emitted = 4 + NODES
    j = 0
    while emitted < n:
        job = f"j-{j:010x}"
        ranks = 1 + j % 4
        queue = ("research", "prod", "batch")[j % 3]
        spec = JobSpec(name=f"llama-ft-{j}", queue=queue, priority=j % 5, ranks=ranks, gpus_per_rank=8,
                       image="nvcr.io/nvidia/pytorch:24.05-py3", command=("torchrun", "train.py", "--cfg", "ft.yaml"),
                       env={"WANDB_PROJECT": "ft", "NCCL_DEBUG": "WARN"}, checkpoint_dir=f"/ckpt/{job}",
                       time_limit_s=86400.0)
        nodes = [f"node-{(j + r) % NODES:03d}" for r in range(ranks)]
        batch: list[Event] = [
            JobSubmitted(event_id=f"submit:{job}", occurred_at=t, job_id=job, spec=spec, submitted_by="alice"),
            GangReserved(event_id=f"reserve:{job}:1:{emitted}", occurred_at=t, job_id=job, attempt=1, epoch=1,
                         ranks=tuple(RankPlacement(rank=r, node_id=nodes[r], gpus=tuple(range(8)))
                                     for r in range(ranks))),
        ]
        batch += [WorkerStarted(event_id=f"started:{job}:1:{r}", occurred_at=t, job_id=job, attempt=1, rank=r,
                                node_id=nodes[r], worker_id=f"{job}-1-{r}") for r in range(ranks)]
        batch.append(JobRunning(event_id=f"running:{job}:1", occurred_at=t, job_id=job, attempt=1))
        batch.append(Checkpointed(event_id=f"ckpt:{job}:1:100", occurred_at=t, job_id=job, attempt=1, rank=0,
                                  step=100, path=f"/ckpt/{job}/step-100"))
        if j % 10 == 7:
            batch.append(PreemptionRequested(event_id=f"preempt:{job}:1", occurred_at=t, job_id=job, attempt=1,
                                             preemptor_job_id=f"j-{j + 1:010x}", reason="priority", grace_s=30.0,
                                             epoch=1))
            batch += [WorkerExited(event_id=f"exited:{job}:1:{r}", occurred_at=t, job_id=job, attempt=1, rank=r,
                                   node_id=nodes[r], signal=15, reason="preempted") for r in range(ranks)]
            batch.append(Preempted(event_id=f"preempted:{job}:1", occurred_at=t, job_id=job, attempt=1,
                                   resume_from=f"/ckpt/{job}/step-100"))
        elif j % 10 == 9:
            batch += [WorkerExited(event_id=f"exited:{job}:1:{r}", occurred_at=t, job_id=job, attempt=1, rank=r,
                                   node_id=nodes[r], exit_code=1, reason="crashed",
                                   log_tail="RuntimeError: CUDA error: an illegal memory access was encountered")
                      for r in range(ranks)]
            batch.append(JobFailed(event_id=f"failed:{job}:1", occurred_at=t, job_id=job, attempt=1,
                                   reason="rank 0 exited 1"))
        else:
            batch += [WorkerExited(event_id=f"exited:{job}:1:{r}", occurred_at=t, job_id=job, attempt=1, rank=r,
                                   node_id=nodes[r], exit_code=0) for r in range(ranks)]
            batch.append(JobCompleted(event_id=f"completed:{job}:1", occurred_at=t, job_id=job, attempt=1))
        yield from batch[: n - emitted]
        emitted += len(batch)
        j += 1
        t += 0.5


async def read_ours(bus: Bus, expect: int) -> tuple[float, float]:
    """(events/s wall clock, client CPU microseconds per event)."""
    c = time.process_time()
    t = time.perf_counter()
    n = last = 0
    async for batch in bus.replay():
        n += len(batch)
        last = batch[-1].seq
    dt = time.perf_counter() - t
    cpu = time.process_time() - c
    assert n == expect and last == expect, f"ours read {n} events up to seq {last}, expected {expect}"
    return expect / dt, cpu / expect * 1e6


async def read_raw(bus: Bus, expect: int, batch: int = 2000) -> float:
    """Events/s of the raw baseline (bench/rebuild.py compares against it too)."""
    return (await timed_raw(bus, expect, batch))[0]


async def timed_raw(bus: Bus, expect: int, batch: int = 2000) -> tuple[float, float]:
    """The raw baseline: no Envelope, no buffering, no recovery; decode and count.

    (events/s wall clock, client CPU microseconds per event).
    """
    nc, js = bus.nc, bus.js
    c = time.process_time()
    t = time.perf_counter()
    info = await js.add_consumer(bus.stream, ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL,
                                                            mem_storage=True, inactive_threshold=30.0))
    api = f"$JS.API.CONSUMER.MSG.NEXT.{bus.stream}.{info.name}"
    req = json.dumps({"batch": batch, "expires": 20_000_000_000}).encode()
    inbox = nc.new_inbox()
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    n = got = last = 0

    async def on_msg(msg: Msg) -> None:
        nonlocal n, got, last
        if not msg.data:
            return  # status (heartbeat, expiry)
        seq = int(msg.reply.split(".")[5])
        decode(msg.data)
        n += 1
        got += 1
        last = seq
        if seq >= expect:
            if not done.done():
                done.set_result(None)
            return
        if got == batch:
            got = 0
            await nc.publish(api, req, reply=inbox)

    sub = await nc.subscribe(inbox, cb=on_msg)
    for _ in range(2):
        await nc.publish(api, req, reply=inbox)
    await asyncio.wait_for(done, 120)
    dt = time.perf_counter() - t
    cpu = time.process_time() - c
    await sub.unsubscribe()
    await js.delete_consumer(bus.stream, info.name)
    assert n == expect and last == expect, f"raw read {n} events up to seq {last}, expected {expect}"
    return expect / dt, cpu / expect * 1e6


# --- other candidates (--candidates): why Bus.replay reads the way it does ---------------


async def read_fetch(bus: Bus, expect: int, batch: int = 2000) -> float:
    """nats-py's convenience pull API: PullSubscription.fetch() (a task per message)."""
    t = time.perf_counter()
    psub = await bus.js.pull_subscribe("corral.>", config=ConsumerConfig(ack_policy=AckPolicy.NONE))
    n = last = 0
    while last < expect:
        for msg in await psub.fetch(batch, timeout=10):
            decode(msg.data)
            n += 1
            last = msg.metadata.sequence.stream
    dt = time.perf_counter() - t
    await psub.unsubscribe()
    assert n == expect, f"fetch read {n}"
    return expect / dt


async def read_ordered_push(bus: Bus, expect: int) -> float:
    """An ordered push consumer (flow control + heartbeats, handled by nats-py) with a callback."""
    t = time.perf_counter()
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    n = 0

    async def on_msg(msg: Msg) -> None:
        nonlocal n
        decode(msg.data)
        n += 1
        if int(msg.reply.split(".")[5]) >= expect and not done.done():
            done.set_result(None)

    sub = await bus.js.subscribe("corral.>", cb=on_msg, ordered_consumer=True)
    await asyncio.wait_for(done, 120)
    dt = time.perf_counter() - t
    await sub.unsubscribe()
    assert n == expect, f"ordered push read {n}"
    return expect / dt


async def read_direct_batch(bus: Bus, expect: int, batch: int = 2000) -> float:
    """Batched direct gets ($JS.API.DIRECT.GET with batch), one request per batch."""
    nc = bus.nc
    t = time.perf_counter()
    inbox = nc.new_inbox()
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    n = nxt = 0
    api = f"$JS.API.DIRECT.GET.{bus.stream}"

    async def on_msg(msg: Msg) -> None:
        nonlocal n, nxt
        if not msg.data:  # end of batch (status 204)
            if nxt > expect:
                if not done.done():
                    done.set_result(None)
            else:
                await nc.publish(api, json.dumps({"seq": nxt, "batch": batch, "next_by_subj": "corral.>"}).encode(),
                                 reply=inbox)
            return
        decode(msg.data)
        n += 1
        nxt = int((msg.headers or {})["Nats-Sequence"]) + 1

    sub = await nc.subscribe(inbox, cb=on_msg)
    nxt = 1
    await nc.publish(api, json.dumps({"seq": 1, "batch": batch, "next_by_subj": "corral.>"}).encode(), reply=inbox)
    await asyncio.wait_for(done, 120)
    dt = time.perf_counter() - t
    await sub.unsubscribe()
    assert n == expect, f"direct batch read {n}"
    return expect / dt


async def main(n: int, rounds: int, sync_always: bool, candidates: bool) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as tmp:
        async with NatsServer(tmp, sync_interval="always" if sync_always else None) as server:
            bus = await Bus.connect(server.url)
            try:
                return await run(bus, n, rounds, sync_always, candidates)
            finally:
                await bus.close()


async def run(bus: Bus, n: int, rounds: int, sync_always: bool, candidates: bool) -> dict[str, object]:
    events = list(realistic_events(n, time.time()))
    single = min(2000, n // 10)
    print(f"appending {n:,} events ...", flush=True)
    t = time.perf_counter()
    for ev in events[:single]:  # one at a time, awaiting each ack: what a CLI or an agent does
        await bus.append(ev)
    append_single_per_s = single / (time.perf_counter() - t)
    t = time.perf_counter()
    for i in range(single, n, 20_000):
        await bus.append_many(events[i : i + 20_000])
    append_per_s = (n - single) / (time.perf_counter() - t)
    del events
    gc.collect()
    info = await bus.js.stream_info(bus.stream)
    assert info.state.messages == n, f"stream holds {info.state.messages}, expected {n}"
    print(f"  append_many {append_per_s:,.0f}/s, append one by one {append_single_per_s:,.0f}/s; "
          f"{info.state.bytes / n:.0f} bytes/event stored", flush=True)
    ours: list[tuple[float, float]] = []
    raw: list[tuple[float, float]] = []
    push: list[float] = []
    for r in range(rounds):
        if r % 2:  # alternate who goes first: no reader always gets the warmer (or colder) machine
            ours.append(await read_ours(bus, n))
            gc.collect()
        raw.append(await timed_raw(bus, n))
        gc.collect()
        push.append(await read_ordered_push(bus, n))
        gc.collect()
        if not r % 2:
            ours.append(await read_ours(bus, n))
            gc.collect()
        print(f"  round {r + 1}: ours {ours[-1][0]:,.0f}/s ({ours[-1][1]:.1f} us CPU/event)  "
              f"raw pull {raw[-1][0]:,.0f}/s ({raw[-1][1]:.1f} us CPU/event)  raw ordered push {push[-1]:,.0f}/s",
              flush=True)
    others: dict[str, float] = {}
    if candidates:
        for name, reader in (("fetch", read_fetch), ("direct_batch", read_direct_batch)):
            others[name] = await reader(bus, n)
            gc.collect()
            print(f"  candidate {name}: {others[name]:,.0f}/s", flush=True)
    best_ours, best_pull, best_push = max(x[0] for x in ours), max(x[0] for x in raw), max(push)
    best_raw = max(best_pull, best_push)  # the fastest raw read, whichever it was this run
    cpu_ours, cpu_raw = min(x[1] for x in ours), min(x[1] for x in raw)
    # Rounds are disturbed unevenly on a shared machine: the median of per-round ratios is the sober figure.
    ratio_median = statistics.median(o[0] / max(r[0], p) for o, r, p in zip(ours, raw, push, strict=True))
    print(f"replay of {n:,} events (best of {rounds}): ours {best_ours:,.0f}/s, fastest raw {best_raw:,.0f}/s "
          f"({'pull' if best_pull >= best_push else 'ordered push'}), ratio {best_ours / best_raw:.2f}; "
          f"median round ratio {ratio_median:.2f}; client CPU per event: ours {cpu_ours:.1f} us, "
          f"raw pull {cpu_raw:.1f} us")
    return {
        "events": n,
        "ours_per_s": round(best_ours),
        "raw_per_s": round(best_raw),
        "ratio": round(best_ours / best_raw, 3),
        "ratio_median": round(ratio_median, 3),
        "append_per_s": round(append_per_s),
        "append_single_per_s": round(append_single_per_s),
        "ours_cpu_us_per_event": round(cpu_ours, 2),
        "raw_cpu_us_per_event": round(cpu_raw, 2),
        "cpu_ratio": round(cpu_raw / cpu_ours, 3),
        "raw_pull_per_s": round(best_pull),
        "raw_ordered_push_per_s": round(best_push),
        "ours_rounds": [round(x[0]) for x in ours],
        "raw_pull_rounds": [round(x[0]) for x in raw],
        "raw_ordered_push_rounds": [round(x) for x in push],
        "bytes_per_event": round(info.state.bytes / n),
        **{f"{k}_per_s": round(v) for k, v in others.items()},
        "sync": "always" if sync_always else "default",
        "python": platform.python_version(),
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sync-always", action="store_true", help="fsync every write (JetStream sync_interval: always)")
    ap.add_argument("--candidates", action="store_true", help="also time fetch() and batched direct gets")
    args = ap.parse_args()
    result = asyncio.run(main(args.events, args.rounds, args.sync_always, args.candidates))
    print(json.dumps(result))
