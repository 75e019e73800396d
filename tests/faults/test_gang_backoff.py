"""A gang that keeps crashing under restart policy `gang`: its restarts back off like a rank's.

Fault: both ranks of a 2-node gang (real `corral agent` processes, process
runtime, examples/worker.py failing at step 20) crash in every attempt; the
job allows 3 restarts.
Check, from the log's own times:
- each GangRestarted carries the backoff as `not_before` (1 s, 2 s, 4 s after
  it: orchestrator.core.backoff, the rule rank restarts use);
- no rank of a restarted attempt starts before it, on either node, so the gap
  from an attempt's first crash to the next attempt's first start is at least
  that backoff: the gaps grow 1, 2, 4 s (they were 0.2-0.3 s each);
- after the 3rd restart the job fails, and nothing of it starts after the
  JobFailed (a worker of an attempt that had already failed once did).
Acceptance 8 of issue #19.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from events.bus import Bus
from events.sdk import Client
from events.server import NatsServer
from orchestrator.core.backoff import restart_delay
from schemas import ClusterConfigured, GangRestarted, JobFailed, JobSpec, WorkerExited, WorkerStarted
from tests.faults.logcheck import check_log, read_log
from tests.faults.services import agent_proc, observer, stop_all, until
from tests.integration.harness import scheduler

pytestmark = pytest.mark.slow

RESTARTS = 3
WORKER = str(Path(__file__).resolve().parents[2] / "examples" / "worker.py")
CONFIG = ClusterConfigured(event_id="config:faults", occurred_at=0.0, topology_levels=("block", "leaf"),
                           min_runtime_s=600.0)


async def test_gang_restarts_back_off(nats_server: NatsServer, bus: Bus, tmp_path: Path) -> None:
    procs = [agent_proc(nats_server.url, f"n{i}", tmp_path, runtime="process", gpus=4, index=i) for i in range(2)]
    try:
        async with observer(bus) as f, scheduler(bus, cluster=CONFIG):
            await until(f, lambda s: len(s.nodes) == 2, 30, "two agents", alive=procs)
            crashing = (sys.executable, WORKER, "--steps", "1000", "--step-ms", "5", "--fail-at-step", "20")
            await Client(bus).submit(JobSpec(name="g", ranks=2, gpus_per_rank=4, restart_policy="gang",
                                             max_restarts=RESTARTS, command=crashing), job_id="g")
            await until(f, lambda s: s.jobs["g"].status == "failed", 90, "g to use up its restarts", alive=procs)
    finally:
        stop_all(procs)

    events = await read_log(bus)
    final = check_log(events, jobs=["g"])
    assert "no restarts left" in final.jobs["g"].end_reason
    assert {p.node_id for p in final.jobs["g"].placement} == {"n0", "n1"}, "one rank per node"

    restarts: dict[int, GangRestarted] = {}
    for _, e in events:
        if isinstance(e, GangRestarted):
            restarts.setdefault(e.attempt, e)  # the first one moved the job; a repeat would be void
    assert sorted(restarts) == [2, 3, 4]
    for attempt, r in restarts.items():
        assert r.not_before - r.occurred_at == pytest.approx(restart_delay(attempt - 1)), (
            f"attempt {attempt}: backoff {r.not_before - r.occurred_at:.3f}s in the log")

    starts: dict[int, list[float]] = {}
    crashes: dict[int, list[float]] = {}
    for _, e in events:
        if isinstance(e, WorkerStarted):
            starts.setdefault(e.attempt, []).append(e.occurred_at)
        elif isinstance(e, WorkerExited) and e.reason == "crashed":
            crashes.setdefault(e.attempt, []).append(e.occurred_at)
    assert sorted(starts) == [1, 2, 3, 4] and all(len(t) == 2 for t in starts.values()), starts
    for attempt, r in restarts.items():
        early = [round(t - r.not_before, 3) for t in starts[attempt] if t < r.not_before]
        assert not early, f"attempt {attempt}: ranks started before its not_before by {early} s"
    gaps = [min(starts[a + 1]) - min(crashes[a]) for a in (1, 2, 3)]
    for n, gap in enumerate(gaps, start=1):
        assert gap >= restart_delay(n), f"gap {n} from crash to restart {gap:.2f}s < backoff {restart_delay(n)}s: {gaps}"

    order = [e for _, e in events if isinstance(e, WorkerStarted | JobFailed) and e.job_id == "g"]
    assert isinstance(order[-1], JobFailed), "nothing of g started after it failed"
