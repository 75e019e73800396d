"""`Agent.shut_down` (nodeagent/shutdown.py) on jobs that do not checkpoint when asked, with real processes.

- A job that is not preemptible takes no checkpoint signal: it gets SIGTERM, its exit is recorded as
  "shutdown", and it is requeued with its restarts unspent (from the beginning: it never checkpointed).
- A preemptible job whose worker ignores the checkpoint signal is killed once the shutdown is forced
  (`now`, a second Ctrl-C) long before its grace ends; its exit is still recorded as "shutdown", with
  why no checkpoint was saved.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from events.bus import Bus
from events.sdk import Client
from events.server import NatsServer
from schemas import GangRestarted, JobRequeued, JobSpec, WorkerExited
from tests.faults.logcheck import read_log
from tests.faults.services import observer
from tests.integration.harness import agents, processes, scheduler, wait_until

#: Ignores the checkpoint signal (SIGUSR1) and SIGTERM, and runs far past any grace in this test.
STUBBORN = ("sh", "-c", "trap '' USR1 TERM; echo up; exec sleep 600")


async def test_shutdown_stops_what_cannot_checkpoint_and_a_forced_one_kills_at_once(
        nats_server: NatsServer, bus: Bus, tmp_path: Path) -> None:
    client = Client(bus)
    async with observer(bus) as f, scheduler(bus), agents(bus, 1, tmp_path, gpus=2, runtime=processes) as (agent,):
        await wait_until(f, lambda s: len(s.nodes) == 1, 30, "the agent")
        await client.submit(JobSpec(name="plain", gpus_per_rank=1, command=("sleep", "600"), preemptible=False,
                                    grace_period_s=600), job_id="plain")
        await client.submit(JobSpec(name="deaf", gpus_per_rank=1, command=STUBBORN, grace_period_s=600), job_id="deaf")
        await wait_until(f, lambda s: all(s.jobs[j].status == "running" for j in ("plain", "deaf")), 30, "both")
        now = asyncio.Event()
        asyncio.get_running_loop().call_later(1.0, now.set)  # a second Ctrl-C, a second after the first
        async with asyncio.timeout(120):  # (not a timing check: unforced, the grace below is 600 s)
            assert await agent.shut_down(600.0, now) == 2
        await wait_until(f, lambda s: all(s.jobs[j].attempt == 2 for j in ("plain", "deaf")), 30, "both requeued")
        assert [f.state.jobs[j].restarts for j in ("plain", "deaf")] == [0, 0]

    events = [e for _, e in await read_log(bus)]
    exits = {e.job_id: e for e in events if isinstance(e, WorkerExited)}
    plain, deaf = exits["plain"], exits["deaf"]
    assert (plain.reason, plain.signal, plain.will_restart, plain.checkpoint_error) == ("shutdown", 15, False, "")
    assert (deaf.reason, deaf.signal, deaf.will_restart) == ("shutdown", 9, False), deaf
    assert "before it saved a checkpoint" in deaf.checkpoint_error, deaf
    requeued = {e.job_id: e for e in events if isinstance(e, JobRequeued)}
    assert set(requeued) == {"plain", "deaf"} and all(e.reason.startswith("shutdown:") for e in requeued.values())
    assert requeued["plain"].resume_from is None  # it never checkpointed: it starts from the beginning
    assert not [e for e in events if isinstance(e, GangRestarted)]
