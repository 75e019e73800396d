"""The log is full (stream limits reached, discard new): appends fail clearly, nothing is corrupted.

A stream that refuses new messages is what a full disk, an operator's
max_msgs/max_bytes, or an account quota look like to corral: every append
is answered "maximum ... exceeded" until someone raises the limit.
Invariants: DESIGN.md 1, 2, 3, 6 (a refused append is simply not in the log;
what is in it folds the same everywhere).
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest
from nats.js.api import DiscardPolicy

from events.bus import Bus, BusError, LogFull
from events.sdk import Client
from events.server import NatsServer
from orchestrator.core.model.state import TERMINAL
from schemas import JobSpec, NodeCordoned
from tests.faults.logcheck import check_log, read_log
from tests.faults.services import agent_proc, logged_starts, observer, scheduler_proc, stop_all, until


async def set_limits(bus: Bus, **limits: int) -> None:
    """What an operator (or a quota) does: limits on the live stream, refusing new messages when reached."""
    config = (await bus.js.stream_info(bus.stream)).config
    await bus.js.update_stream(config.evolve(discard=DiscardPolicy.NEW, **limits))


@pytest.mark.parametrize(("limit", "words"), [("max_msgs", "maximum messages exceeded"),
                                             ("max_bytes", "maximum bytes exceeded")])
async def test_full_stream_append_error_names_the_limit(bus: Bus, limit: str, words: str) -> None:
    """Fault: a stream at its limit. Check: append raises LogFull (a BusError) that says which limit
    was hit, at once (a full log does not heal in the seconds a retry waits)."""
    await bus.append(NodeCordoned(event_id="first", occurred_at=0.0, node_id="n0"))
    await set_limits(bus, **{limit: 1 if limit == "max_msgs" else 300})
    t0 = time.monotonic()
    with pytest.raises(LogFull) as err:
        await bus.append(NodeCordoned(event_id="second", occurred_at=0.0, node_id="n0", reason="x" * 400))
    assert time.monotonic() - t0 < 1.0, "a full log was retried"
    assert isinstance(err.value, BusError) and err.value.description == words
    assert words in str(err.value), f"the error does not say what happened: {err.value}"


async def test_full_stream_append_many_fails_fast(bus: Bus) -> None:
    """Fault: a stream at its limit. Check: append_many gives up at once, with LogFull (a BusError)."""
    await set_limits(bus, max_msgs=1)
    await bus.append(NodeCordoned(event_id="first", occurred_at=0.0, node_id="n0"))
    with pytest.raises(LogFull, match="maximum messages exceeded"):
        async with asyncio.timeout(1.0):
            await bus.append_many([NodeCordoned(event_id=f"more-{i}", occurred_at=0.0, node_id="n0")
                                   for i in range(3)])
    await set_limits(bus, max_msgs=-1)
    seqs = await bus.append_many([NodeCordoned(event_id=f"more-{i}", occurred_at=0.0, node_id="n0") for i in range(3)])
    assert seqs == [2, 3, 4], "once the limit is raised, the same batch is stored, in order"


@pytest.mark.slow
async def test_services_survive_a_full_stream(nats_server: NatsServer, bus: Bus, tmp_path: Path) -> None:
    """Fault: the scheduler and two agents (real processes) run jobs when the stream reaches max_msgs,
    midway through a batch of submits; it stays full for six seconds (long enough for every retry
    inside the bus to give up, and for a running job to pass its time limit, so the scheduler too
    has a decision it cannot append), then the limit is raised.

    Check: submits past the limit fail with BusError (and are retried later with the same ids); the
    services stay alive through it (appends they could not make are made again, not lost and not
    crashing them); once the limit is raised every job completes; no worker was started twice (the
    agents' own logs); a replay is consistent: every job once, no double booking, no duplicate
    starts, byte-equal refold.
    """
    url = nats_server.url
    procs = [scheduler_proc(url, "s1", tmp_path, heartbeat_timeout=30.0)]
    procs += [agent_proc(url, f"n{i}", tmp_path, index=i) for i in range(2)]
    rng = random.Random(9)
    ids = [f"f{i:02d}" for i in range(60)]
    specs = {j: JobSpec(name=j, ranks=rng.choice([1, 2]), gpus_per_rank=rng.choice([1, 2, 4]),
                        command=("sleep", "0.1")) for j in ids}
    refused: list[str] = []
    async with observer(bus) as f:
        try:
            await until(f, lambda s: s.epoch >= 1 and len(s.nodes) == 2, 60, "a leader and two nodes", alive=procs)
            client = Client(bus)
            # A job over its time limit while the log is full: the scheduler must stop it, and cannot
            # append that decision until the limit is raised.
            await client.submit(JobSpec(name="t", ranks=1, gpus_per_rank=1, time_limit_s=3.0,
                                        command=("sleep", "60")), job_id="t")
            await until(f, lambda s: s.jobs["t"].status == "running", 30, "t running", alive=procs)
            await set_limits(bus, max_msgs=await bus.last_seq() + 40)
            for j in ids:
                if refused:  # full: every further submit would be refused too (each after the bus's retries)
                    refused.append(j)
                    continue
                try:
                    await client.submit(specs[j], job_id=j)
                except BusError:
                    refused.append(j)
            await asyncio.sleep(6.0)  # full: every service's appends are refused for a while
            alive = [p.poll() is None for p in procs]
            await set_limits(bus, max_msgs=-1)
            for j in refused:
                await client.submit(specs[j], job_id=j)
            await until(f, lambda s: sum(j.status in TERMINAL for j in s.jobs.values()) == len(ids) + 1, 90,
                        "every job to finish after the limit was raised", alive=procs)
        finally:
            stop_all(procs)
    assert refused, "the limit was never reached: the test did not test anything"
    assert alive == [True] * len(procs), f"a service died on a full stream (scheduler, n0, n1): {alive}"
    final = check_log(await read_log(bus), jobs=[*ids, "t"])
    assert final.jobs.pop("t").status == "failed", "t ends as failed: time limit"
    assert {j.status for j in final.jobs.values()} == {"completed"}
    twice = {k: n for k, n in logged_starts(tmp_path.glob("agent-*.log")).items() if n > 1}
    assert not twice, f"workers started twice (a refused report lost, the rank run again): {twice}"
