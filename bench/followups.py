"""A mass node failure and the decide calls after it: the CPU and the events of the largest one (issue #40).

The pure core alone (no NATS): bench/scheduler.py's cluster (block/leaf labels, four queues) at
4,096 nodes x 8 GPUs, filled with its mix of gangs (1-8 GPUs on one node, gangs of 2-8 whole
nodes) until no more fit, every placed rank started and the gangs running; then `--fail` nodes
fail at once (NodeFailed, one each). decide is called again at once, as the scheduler's loop
is woken by its own appends, until a call decides nothing; each call's decisions are folded.
Prints one JSON line: the largest call's CPU time and its events, every call's events, the
JobRequeued order (each call's requeues older than the next call's), and
that every gang on a failed node was requeued exactly once.

Run from the repository root: `python bench/followups.py [--nodes N] [--fail N] [--jobs N]`.
`--core DIR` runs another checkout's core (for a before/after on one machine).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
ap.add_argument("--nodes", type=int, default=4096)
ap.add_argument("--fail", type=int, default=4096, help="how many nodes fail at once (the first N)")
ap.add_argument("--jobs", type=int, default=12_000, help="gangs submitted; more than fit, so the cluster is full")
ap.add_argument("--core", default="", help="import the core from this directory instead (a before/after)")
args = ap.parse_args()

HERE = Path(__file__).resolve().parent
sys.path.insert(0, args.core or str(HERE.parent))
sys.path.insert(1, str(HERE))

from orchestrator.core.decide import decide_cycle  # noqa: E402
from orchestrator.core.evolve import evolve  # noqa: E402
from orchestrator.core.model.memo import Memo  # noqa: E402
from orchestrator.core.model.state import ClusterState  # noqa: E402
from schemas.events import GangReserved, JobRequeued, NodeFailed, WorkerStarted  # noqa: E402


def calls_until_quiet(state: ClusterState, memo: Memo, now: float, limit: int = 400) -> list[tuple[float, list[Any]]]:
    """decide at `now` until a call decides nothing: each call's (CPU s, events), its decisions folded and
    every placed rank started (the agents' answers)."""
    out: list[tuple[float, list[Any]]] = []
    n = 0
    for _ in range(limit):
        c = time.process_time()
        events, _, _ = decide_cycle(state, now, epoch=1, memo=memo)
        out.append((time.process_time() - c, events))
        if not events:
            break
        for e in events:
            evolve(state, e)  # type: ignore[arg-type]
        for e in events:
            if isinstance(e, GangReserved):
                for rp in e.ranks:
                    n += 1
                    evolve(state, WorkerStarted(event_id=f"ws{now}:{n}", occurred_at=now, job_id=e.job_id,
                                                attempt=e.attempt, rank=rp.rank, node_id=rp.node_id))
    return out


def main() -> None:
    # Imported once the core is (bench/scheduler.py puts this checkout first on sys.path: `--core` must win).
    from scheduler import T0, cluster_events, job_events

    state = ClusterState()
    for e in cluster_events(args.nodes):
        evolve(state, e)
    submitted, _ = job_events(args.jobs)
    for e in submitted:
        evolve(state, e)
    memo = Memo()
    now = T0 + 60.0
    t = time.process_time()
    fill = calls_until_quiet(state, memo, now)
    fill_cpu = time.process_time() - t
    busy_gpus = sum(j.gpus for j in state.jobs.values() if j.status in ("reserved", "running"))
    failed = [f"node{n:04}" for n in range(args.fail)]
    bad = set(failed)
    hit = {jid for jid in state.active if any(rp.node_id in bad for rp in state.jobs[jid].placement)}
    submit_seq = {jid: state.jobs[jid].submit_seq for jid in hit}
    now += 30.0
    for nid in failed:
        evolve(state, NodeFailed(event_id=f"nf-{nid}", occurred_at=now, node_id=nid, incarnation="1",
                                 reason="bench: failed at once"))
    after = calls_until_quiet(state, memo, now)
    requeued = [[e.job_id for e in events if isinstance(e, JobRequeued)] for _, events in after]
    flat = [j for call in requeued for j in call]
    cpu_ms = [round(c * 1000, 2) for c, _ in after]
    counts = [len(events) for _, events in after]
    worst = max(range(len(after)), key=lambda i: after[i][0])
    print(json.dumps({
        "core": str(Path(decide_cycle.__code__.co_filename).parents[2]),
        "nodes": args.nodes, "gpus": args.nodes * 8, "jobs": args.jobs, "failed_nodes": args.fail,
        "fill_calls": len(fill), "fill_cpu_s": round(fill_cpu, 2), "busy_gpus": busy_gpus,
        "gangs_hit": len(hit),
        "calls_after_failure": len(after),
        "largest_call_cpu_ms": cpu_ms[worst], "largest_call_events": counts[worst],
        "most_events_in_a_call": max(counts), "events_per_call": counts, "cpu_ms_per_call": cpu_ms,
        "cpu_after_failure_s": round(sum(c for c, _ in after), 3),
        "requeues_per_call": [len(r) for r in requeued],
        "every_hit_gang_requeued_once": sorted(flat) == sorted(hit),
        # Oldest first across calls: every gang a call requeues arrived before those of the next calls.
        "requeued_oldest_first": all(max(submit_seq[j] for j in a) < min(submit_seq[j] for j in b)
                                     for a, b in pairwise(r for r in requeued if r)),
        "machine": f"{os.cpu_count()} cpu, Python {platform.python_version()}",
    }))


if __name__ == "__main__":
    main()
