"""Chaos: random pauses (SIGSTOP up to 3x the lease) and kill -9 of schedulers, agents and nats-server.

Fault: tests/faults/chaos.py's driver, at a size CI affords (bench/chaos.py
runs the issue's size: >= 2,000 jobs on >= 32 nodes). Check, by
tests/faults/chaos_check.py, which imports nothing of corral: at every log
position no GPU with live workers of two jobs, no epoch elected twice, no
NodeFailed for a node whose heartbeats never stopped for the timeout, every
scheduler decision fenced by an epoch; every job completed. And every service
that lived through it folded exactly what a fresh fold of the log holds.
Invariants: DESIGN.md 1, 2, 3, 6 and "Safety by construction".
"""

from __future__ import annotations

from pathlib import Path

import pytest

from events.subjects import in_slice
from events.telemetry import digest
from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import ClusterState
from orchestrator.core.node_view import NodeView, evolve_node, view_bytes
from orchestrator.scheduler.metrics import state_digest
from schemas import decode
from tests.faults.chaos import ChaosConfig, run_chaos
from tests.faults.chaos_check import Stored

pytestmark = pytest.mark.slow


def fresh_fold(log: list[Stored], node: str | None) -> tuple[int, int]:
    """(position, digest) of the code under test's own fold of the whole log, from nothing; for a node, of its
    slice (what its agent reads, #40), as its agent's gauges describe it."""
    if node is not None:
        view = NodeView(node_id=node)
        for m in log:
            if in_slice(m.subject, node):
                view = evolve_node(view, decode(m.data), m.seq, m.time)
        return view.seq, digest(view_bytes(view))
    state = ClusterState()
    for m in log:
        state = evolve(state, decode(m.data), m.seq, m.time)  # on the stream's clock, as the services fold (#30)
    return state.seq, state_digest(state)


@pytest.mark.timeout(600)
async def test_chaos_run_keeps_every_invariant(tmp_path: Path) -> None:
    # Lease 4 s and heartbeat timeout 8 s, as bench/chaos.py: pauses of up to 3x the lease still cross the
    # timeout, and a loaded CI machine does not starve a healthy agent's heartbeats past it.
    cfg = ChaosConfig(jobs=200, nodes=8, chaos_s=45.0, drain_s=240.0, seed=7, lease_ttl=4.0, heartbeat_timeout=8.0)
    result = await run_chaos(cfg, tmp_path, fresh_digest=fresh_fold)
    print(result.summary())
    assert result.report.violations == [], "\n".join(result.report.violations[:30])
    assert result.state_mismatches == [], "\n".join(result.state_mismatches)
    assert result.services_checked == cfg.nodes + cfg.schedulers
    assert result.report.jobs == cfg.jobs and result.report.outcomes["JobCompleted"] == cfg.jobs
    assert sum(result.faults.values()) >= 10, f"too few faults to mean anything: {result.faults}"
