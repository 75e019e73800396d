"""An agent folds exactly its node's slice through a kill -9, a restart and a stop past its consumer's life (#40).

Fault: a `corral agent` process (node n0) while the test appends a mix of n0's own events, another node's
and job submissions: it is killed with SIGKILL and started again on the same data dir, then SIGSTOPped for
longer than the server keeps an idle consumer (the reader's 20 s pull plus its 60 s inactivity threshold:
the server deletes the agent's filtered consumer meanwhile, which the test sees), then SIGCONTed.
Check, with a reader that imports nothing of corral (plain nats-py over the whole stream, the slice chosen by
subject tokens here): after each step the agent's fold count (`corral_events_read_total`) equals the number
of the slice's events in the stream and its position (`corral_log_position`) the last one's: every event of
its slice, none twice (a fold counts an event only above its position), none of anyone else's.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from events.bus import Bus
from events.server import NatsServer
from tests.faults.services import agent_proc, kill, stop_all
from tests.faults.test_reader_stall import _cordons, _folded_exactly, _free_port, _metrics_env, _until_started

pytestmark = pytest.mark.slow

NODE = "n0"
STOP_S = 85.0  # > 20 s pull expiry + 60 s consumer inactive_threshold (events/bus/read.py)


def mine(subject: str, node: str) -> bool:
    """The node's slice by subject tokens: its own subjects, its reports about jobs, the scheduler's settings."""
    t = subject.split(".")
    return (t[1] == "node" and t[2] == node) or (t[1] == "job" and len(t) == 5 and t[4] == node) or t[1] == "sched"


async def independent_slice(url: str) -> tuple[int, int]:
    """(events of NODE's slice in the stream, the last one's position), read with nats-py alone."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        last = (await js.stream_info("CORRAL")).state.last_seq
        cfg = ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL, mem_storage=True,
                             inactive_threshold=30.0)
        sub = await js.pull_subscribe("corral.>", durable=None, stream="CORRAL", config=cfg)
        count = position = read = 0
        while read < last:
            for m in await sub.fetch(500, timeout=10):
                read = m.metadata.sequence.stream
                if mine(m.subject, NODE):
                    count, position = count + 1, read
        await sub.unsubscribe()
        return count, position
    finally:
        await nc.close()


async def slice_consumers(url: str) -> int:
    """Consumers of the stream filtered to NODE's reports (the agent's), by the server's own list."""
    nc = await nats.connect(url)
    try:
        infos = await nc.jetstream().consumers_info("CORRAL")
        return sum(f"corral.job.*.*.{NODE}" in (i.config.filter_subjects or []) for i in infos)
    finally:
        await nc.close()


async def append_mix(bus: Bus, tag: str, n: int) -> None:
    make, other = _cordons(NODE), _cordons("n1")
    for i in range(n):
        await bus.append((make if i % 2 == 0 else other)(tag, i))


@pytest.mark.timeout(300)
async def test_an_agent_folds_exactly_its_slice_through_kill_restart_and_a_long_stop(
        nats_server: NatsServer, bus: Bus, tmp_path: Path) -> None:
    url, port = nats_server.url, _free_port()

    async def independent(_: Bus) -> tuple[int, int]:
        return await independent_slice(url)

    with _metrics_env(port):
        proc = agent_proc(url, NODE, tmp_path)
    procs = [proc]
    try:
        await _until_started(bus, port, f"agent/{NODE}", proc, "the agent")
        await append_mix(bus, "a", 20)
        read, position, _ = await _folded_exactly(bus, proc, port, f"agent/{NODE}", "the agent", independent)

        kill(proc)
        await append_mix(bus, "b", 20)
        with _metrics_env(port):
            proc = agent_proc(url, NODE, tmp_path)
        procs.append(proc)
        read, position, _ = await _folded_exactly(bus, proc, port, f"agent/{NODE}", "the restarted agent",
                                                  independent)

        assert await slice_consumers(url) >= 1  # (the killed agent's may linger until its inactivity ends)
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            await append_mix(bus, "c", 20)
            await asyncio.sleep(STOP_S)
            gone = await slice_consumers(url) == 0
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        assert gone, "the server kept the stopped agent's consumer: the stop did not outlive it"
        await append_mix(bus, "d", 10)
        read, position, last = await _folded_exactly(bus, proc, port, f"agent/{NODE}", "the resumed agent",
                                                     independent)
    finally:
        stop_all(procs)
    count, end = await independent_slice(url)
    assert (read, position) == (count, end) and end == last
    assert count < await bus.last_seq(), "the slice is part of the log, not all of it"
