"""A burst of submissions larger than a cycle's bound (Policies.fresh_per_cycle, core/backlog.py, #34).

The simulator keeps deciding while a cycle left new jobs unexplained (`Decision.more`):
every job is told its first reason at the instant it arrived, and every job starts
and ends when it would without the bound (strict mode checks each skipped call).
"""

from __future__ import annotations

import io
import json
from dataclasses import replace

from orchestrator.policies import DEFAULT_POLICIES
from orchestrator.sim.engine import SimConfig, simulate
from orchestrator.sim.trace import TraceJob
from tests.sim.conftest import scenario, tiny_cluster

#: 60 jobs at t=0 (a burst), on 4 nodes of 2 GPUs; more arrive later.
JOBS = [TraceJob(f"j{i:02d}", 0 if i < 60 else 10 * i, 20 + i % 7 * 10, 1 + i % 2, "ab"[i % 2]) for i in range(80)]


def test_a_burst_past_the_bound_is_judged_at_once_and_schedules_alike() -> None:
    cluster = tiny_cluster(nodes=4, gpus_per_node=2)
    bounded = replace(DEFAULT_POLICIES, fresh_per_cycle=7, heads_per_queue=2)
    free = replace(DEFAULT_POLICIES, heads_per_queue=2)
    log = io.BytesIO()
    a = simulate(scenario(cluster, JOBS), "corral", SimConfig(strict=True), log=log, policies=bounded)
    b = simulate(scenario(cluster, JOBS), "corral", SimConfig(strict=True), policies=free)
    assert a.timeline.first_start == b.timeline.first_start and a.timeline.end == b.timeline.end
    assert len(a.timeline.end) == len(JOBS)
    first_word: dict[str, float] = {}  # a job's first JobWaiting or GangReserved
    for line in log.getvalue().splitlines():
        e = json.loads(line)
        if e.get("type") in ("JobWaiting", "GangReserved"):
            first_word.setdefault(e["job_id"], e["occurred_at"])
    assert {jid: first_word[jid] for jid in a.timeline.submit} == a.timeline.submit
    assert a.stats.decides > b.stats.decides  # the bound took more calls
