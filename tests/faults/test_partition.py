"""One agent partitioned from NATS: longer than the heartbeat timeout, and shorter.

The agent process reaches nats-server only through a TCP proxy in the test
(tests/faults/proxy.py), which black-holes the connection ("drop": bytes
vanish, no reset, as with a dead switch) and later heals it. The agent and
its workers keep running throughout; only the network is cut.

Invariants: DESIGN.md 1 and 2 in the log and on the GPUs (ledger), 5 (the
requeued gang resumes from its newest checkpoint), 6 and 7.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from events.bus import Bus
from events.sdk import Client
from events.server import NatsServer
from schemas import ClusterConfigured, JobRequeued, JobSpec, NodeFailed, NodeRecovered, WorkerStarted
from tests.faults.ledger import ledger_command, overlaps, placements, read_ledger
from tests.faults.logcheck import check_log, read_log
from tests.faults.proxy import Proxy
from tests.faults.services import agent_proc, observer, stop_all, until
from tests.integration.harness import scheduler

pytestmark = pytest.mark.slow

TIMEOUT_S = 3.0
NO_PREEMPTION = ClusterConfigured(event_id="config:faults", occurred_at=0.0, topology_levels=("block", "leaf"),
                                  min_runtime_s=600.0)


def status(job_id: str):  # type: ignore[no-untyped-def]
    return lambda s: s.jobs[job_id].status if job_id in s.jobs else None


async def _cluster(nats_server: NatsServer, tmp_path: Path):  # type: ignore[no-untyped-def]
    """n0 behind the proxy, n1 direct; both process runtime, 4 GPUs."""
    host, port = nats_server.url.removeprefix("nats://").rsplit(":", 1)
    proxy = await Proxy(host, int(port)).start()
    procs = [agent_proc(proxy.url, "n0", tmp_path, runtime="process", gpus=4, index=0),
             agent_proc(nats_server.url, "n1", tmp_path, runtime="process", gpus=4, index=1)]
    return proxy, procs


async def _start_on_n0(client: Client, f, job_id: str, spec: JobSpec) -> None:  # type: ignore[no-untyped-def]
    """Place `spec` on n0 (the partitioned one) by cordoning n1 while it is scheduled."""
    await client.cordon("n1", "test: steer the job to n0")
    await client.submit(spec, job_id=job_id)
    await until(f, lambda s: status(job_id)(s) == "running", 30, f"{job_id} running")
    await client.uncordon("n1")
    assert f.state.jobs[job_id].placement[0].node_id == "n0"


async def test_partition_longer_than_timeout(nats_server: NatsServer, bus: Bus, tmp_path: Path) -> None:
    """Fault: n0 is cut off (black hole) until the scheduler declares it failed and its gang runs elsewhere;
    then the network heals.

    Check: NodeFailed for n0's incarnation, once; its gang requeued (attempt 2) from the newest checkpoint
    and completed on n1; on heal n0 appends NodeRecovered for the same incarnation (same process), stops
    its stale worker of attempt 1, and gets work again (a waiting job lands on it at once), without ever
    running two processes on one GPU (the stale worker takes 2 s to exit on SIGTERM). Whole-log
    invariants hold.
    """
    ledger = tmp_path / "ledger.jsonl"
    env = {"FAULT_LEDGER": str(ledger), "FAULT_TERM_DELAY": "2.0"}
    proxy, procs = await _cluster(nats_server, tmp_path)
    try:
        async with observer(bus) as f, scheduler(bus, heartbeat_timeout_s=TIMEOUT_S, cluster=NO_PREEMPTION):
            await until(f, lambda s: len(s.nodes) == 2, 30, "two agents", alive=procs)
            incarnation = f.state.nodes["n0"].incarnation
            client = Client(bus)
            await _start_on_n0(client, f, "a", JobSpec(name="a", ranks=1, gpus_per_rank=4, env=env, command=(
                ledger_command(2500, 5, "--checkpoint-every", "100"))))
            await until(f, lambda s: (c := s.jobs["a"].checkpoint) is not None and c.step >= 200, 30,
                        "a's checkpoints in the log")

            proxy.partition("drop")
            await until(f, lambda s: s.nodes["n0"].failed, 3 * TIMEOUT_S + 5, "n0 declared failed")
            await until(f, lambda s: s.jobs["a"].attempt == 2, 10, "a requeued")
            # c waits (n1 is a's now, a is too young to preempt) and lands on n0 the moment it is back.
            await client.submit(JobSpec(name="c", ranks=1, gpus_per_rank=4, priority=5, env=env,
                                        command=ledger_command(150)), job_id="c")
            stale = [u for u in read_ledger(ledger) if u.job == "a" and u.attempt == 1]
            assert len(stale) == 1 and stale[0].end is None, "the cut-off worker keeps running"
            proxy.heal()

            await until(f, lambda s: not s.nodes["n0"].failed, 30, "n0 to recover", alive=procs)
            await until(f, lambda s: all(status(j)(s) == "completed" for j in "ac"), 60, "a and c to complete",
                        alive=procs)
    finally:
        stop_all(procs)
        await proxy.close()

    events = await read_log(bus)
    final = check_log(events, jobs=["a", "c"])
    assert {j.status for j in final.jobs.values()} == {"completed"}
    assert Counter((e.node_id, e.incarnation) for _, e in events if isinstance(e, NodeFailed)) == {
        ("n0", incarnation): 1}
    assert [(e.node_id, e.incarnation) for _, e in events if isinstance(e, NodeRecovered)] == [("n0", incarnation)]
    assert final.nodes["n0"].incarnation == incarnation and not final.nodes["n0"].failed
    requeued = [e for _, e in events if isinstance(e, JobRequeued)]
    assert len(requeued) == 1 and requeued[0].resume_from is not None
    assert final.jobs["a"].placement[0].node_id == "n1" and final.jobs["c"].placement[0].node_id == "n0"
    uses = read_ledger(ledger)
    assert all(u.end is not None for u in uses), "every worker ended"
    stale = next(u for u in uses if u.job == "a" and u.attempt == 1)
    assert stale.how == "signal", "n0 stopped its stale worker of attempt 1 instead of letting it run on"
    clash = overlaps(uses, placements(events))
    assert not clash, "GPUs held by two processes at once:\n" + "\n".join(clash)


async def test_partition_shorter_than_timeout(nats_server: NatsServer, bus: Bus, tmp_path: Path) -> None:
    """Fault: n0 is cut off (black hole) for 1 s, well inside the 3 s heartbeat timeout, while its gang runs.

    Check: nothing is declared failed or requeued; the gang completes in its first attempt with one
    WorkerStarted; n0 keeps its incarnation; whole-log invariants hold.
    """
    ledger = tmp_path / "ledger.jsonl"
    proxy, procs = await _cluster(nats_server, tmp_path)
    try:
        async with observer(bus) as f, scheduler(bus, heartbeat_timeout_s=TIMEOUT_S, cluster=NO_PREEMPTION):
            await until(f, lambda s: len(s.nodes) == 2, 30, "two agents", alive=procs)
            incarnation = f.state.nodes["n0"].incarnation
            client = Client(bus)
            await _start_on_n0(client, f, "b", JobSpec(name="b", ranks=1, gpus_per_rank=4,
                                                       env={"FAULT_LEDGER": str(ledger)},
                                                       command=ledger_command(500, 5)))
            proxy.partition("drop")
            await asyncio.sleep(1.0)
            proxy.heal()
            await until(f, lambda s: status("b")(s) == "completed", 60, "b to complete", alive=procs)
    finally:
        stop_all(procs)
        await proxy.close()

    events = await read_log(bus)
    final = check_log(events, jobs=["b"])
    assert final.jobs["b"].status == "completed" and final.jobs["b"].attempt == 1
    assert not [e for _, e in events if isinstance(e, NodeFailed | JobRequeued | NodeRecovered)]
    assert sum(isinstance(e, WorkerStarted) for _, e in events) == 1
    assert final.nodes["n0"].incarnation == incarnation
    assert len(read_ledger(ledger)) == 1
