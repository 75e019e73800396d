"""One node agent paused past its heartbeat timeout, three times: it is failed and recovers each time.

Fault: the `corral agent` process is SIGSTOPped (a VM freeze, a long GC, a
debugger) until the scheduler appends NodeFailed for it, then SIGCONTed; three
times in a row, the same process and incarnation throughout.
Check:
- each pause gets its own NodeFailed in the log, and each NodeFailed its own
  NodeRecovered from the agent: the node's failures and recoveries alternate,
  three of each (an agent used to recover once per process, and the scheduler's
  NodeFailed id, one per incarnation, deduplicated every later failure away);
- after each recovery the node is usable: a job placed on it runs to the end;
- whole-log invariants hold (tests/faults/logcheck.py).
Acceptance 6 of issue #19.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from events.bus import Bus
from events.sdk import Client
from events.server import NatsServer
from schemas import ClusterConfigured, JobSpec, NodeFailed, NodeRecovered
from tests.faults.logcheck import check_log, read_log
from tests.faults.services import Proc, agent_proc, observer, stop_all, until
from tests.integration.harness import scheduler

pytestmark = pytest.mark.slow

TIMEOUT_S = 3.0
PAUSES = 3
CONFIG = ClusterConfigured(event_id="config:faults", occurred_at=0.0, topology_levels=("block", "leaf"),
                           min_runtime_s=600.0)


def resume(proc: Proc) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)


async def test_agent_paused_past_its_timeout_three_times_recovers_three_times(
        nats_server: NatsServer, bus: Bus, tmp_path: Path) -> None:
    agent = agent_proc(nats_server.url, "n0", tmp_path, gpus=4)
    jobs: list[str] = []
    try:
        async with observer(bus) as f, scheduler(bus, heartbeat_timeout_s=TIMEOUT_S, cluster=CONFIG):
            await until(f, lambda s: "n0" in s.nodes, 30, "the agent to register", alive=[agent])
            incarnation = f.state.nodes["n0"].incarnation
            client = Client(bus)
            for i in range(1, PAUSES + 1):
                agent.send_signal(signal.SIGSTOP)
                try:
                    await until(f, lambda s: s.nodes["n0"].failed, 3 * TIMEOUT_S + 10, f"NodeFailed for pause {i}")
                finally:
                    resume(agent)
                await until(f, lambda s: not s.nodes["n0"].failed, 30, f"recovery {i}", alive=[agent])
                job = f"after-{i}"
                jobs.append(job)
                await client.submit(JobSpec(name=job, ranks=1, gpus_per_rank=4, command=("sleep", "0.5")),
                                    job_id=job)
                await until(f, lambda s, j=job: s.jobs[j].status == "completed", 30,  # type: ignore[misc]
                            f"{job} to run on the recovered node", alive=[agent])
                assert f.state.jobs[job].placement[0].node_id == "n0"
                assert f.state.nodes["n0"].incarnation == incarnation, "the same process, not a restart"
    finally:
        resume(agent)
        stop_all([agent])

    events = await read_log(bus)
    check_log(events, jobs=jobs)
    told = [(type(e).__name__, e.incarnation) for _, e in events
            if isinstance(e, NodeFailed | NodeRecovered) and e.node_id == "n0"]
    assert told == [("NodeFailed", incarnation), ("NodeRecovered", incarnation)] * PAUSES, (
        f"one NodeFailed per pause, each answered by one NodeRecovered: {told}")
