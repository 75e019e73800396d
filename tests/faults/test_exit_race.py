"""A worker that ends is never started again before the log has folded its exit.

Fault: none injected; the race is the fault. Short jobs (50 ms) end while
their WorkerExited is still on its way through the log, so for a moment the
agent's state says "rank running" while its runtime has no such worker.
Check: the runtime (not the log, where a second WorkerStarted with the same
id would be deduplicated away) saw every worker identity started once.
Invariant: no job runs twice for the same attempt (DESIGN.md 7's "neither
duplicates nor orphans workers"). Regression test for the agent fix of this
race; cheap enough to run on every push.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from events.bus import Bus
from events.sdk import Client
from nodeagent.runtime.base import WorkerLabels
from orchestrator.core.model.state import TERMINAL
from schemas import JobSpec
from tests.faults.logcheck import check_log, read_log
from tests.faults.runtimes import CountingRuntime, started_twice
from tests.faults.services import observer, until
from tests.integration.harness import agents, scheduler

JOBS = 150


async def test_short_workers_start_once(bus: Bus, tmp_path: Path) -> None:
    starts: Counter[WorkerLabels] = Counter()
    async with observer(bus) as follower, scheduler(bus), \
            agents(bus, 2, tmp_path, runtime=lambda n, d: CountingRuntime(starts)):
        await until(follower, lambda s: len(s.nodes) == 2, 30, "two nodes")
        client = Client(bus)
        ids = [await client.submit(JobSpec(name="s", ranks=1 + i % 2, gpus_per_rank=1 + i % 4,
                                           command=("sleep", "0.02")), job_id=f"s{i:03d}") for i in range(JOBS)]
        await until(follower, lambda s: sum(j.status in TERMINAL for j in s.jobs.values()) == JOBS, 120,
                    "every job to finish")
    check_log(await read_log(bus), jobs=ids)
    assert sum(starts.values()) == sum(1 + i % 2 for i in range(JOBS))
    assert not started_twice(starts), started_twice(starts)
