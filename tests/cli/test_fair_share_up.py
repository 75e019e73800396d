"""Fair share on a full cluster through `corral up` (issue #20, acceptance 1): weights 2:1 give 2:1.

A real `corral up` (nats-server, scheduler, 4 agents x 8 fake GPUs running workers with the process
runtime), `corral queue set laba --weight 2` and `labb --weight 1`, and 300 one-GPU jobs of two
seconds in each queue, labb's submitted first (before #20 it then held nearly all 32 GPUs while
laba's jobs waited). The nodes are cordoned while the backlogs are submitted, so both queues are
backlogged from the first placement on.

The checker below reads the log as `corral tail --json` prints it and nothing of the scheduler's:
it follows which GPUs each job holds (GangReserved until the job ends, is preempted or requeued; a
reservation on a GPU already held is void, as the fold would record it) and integrates each queue's
GPUs over the time both queues have jobs pending.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from events.bus import Bus
from events.sdk import Client
from tests.cli.conftest import Up, _with_bus, corral, state_of

pytestmark = pytest.mark.slow

NODES, GPUS, JOBS, SLEEP_S = 4, 8, 300, 2
WEIGHTS = {"laba": 2.0, "labb": 1.0}
#: Less than this much backlogged time, or fewer placements in it, says too little to judge a ratio by.
MIN_SPAN_S, MIN_PLACEMENTS = 10.0, 200

#: The end of a hold: the job is over, or its GPUs go back and it waits again.
_ENDS = {"JobCompleted": False, "JobFailed": False, "JobCancelled": False, "JobRejected": False,
         "Preempted": True, "JobRequeued": True}


@dataclass
class Backlogged:
    """What the checker found: GPU-seconds per queue over the span both were backlogged."""

    gpu_s: dict[str, float] = field(default_factory=dict)
    span_s: float = 0.0
    placements: int = 0
    voids: int = 0

    def mean(self, queue: str) -> float:
        return self.gpu_s[queue] / self.span_s


def held_while_backlogged(records: list[dict[str, Any]], queues: tuple[str, ...]) -> Backlogged:
    """Time-weighted GPUs each of `queues` held while every one of them had pending jobs, from the log alone."""
    queue_of: dict[str, str] = {}
    pending = dict.fromkeys(queues, 0)
    held = dict.fromkeys(queues, 0)
    holds: dict[str, list[tuple[str, int]]] = {}  # job -> its GPUs
    owner: dict[tuple[str, int], str] = {}
    over: set[str] = set()
    out = Backlogged(gpu_s=dict.fromkeys(queues, 0.0))
    prev: float | None = None
    for rec in records:
        t = rec["time"]
        if prev is not None and all(pending[q] > 0 for q in queues):
            for q in queues:
                out.gpu_s[q] += held[q] * (t - prev)
            out.span_s += t - prev
        prev = t
        ev, kind = rec["event"], rec["type"]
        q = queue_of.get(ev.get("job_id", ""), "") if ev.get("job_id") not in over else ""
        if kind == "JobSubmitted" and ev["spec"]["queue"] in queues:
            queue_of[ev["job_id"]] = ev["spec"]["queue"]
            pending[ev["spec"]["queue"]] += 1
        elif kind == "GangReserved" and q:
            gpus = [(r["node_id"], g) for r in ev["ranks"] for g in r["gpus"]]
            if ev["job_id"] in holds or any(g in owner for g in gpus):
                out.voids += 1
                continue
            holds[ev["job_id"]] = gpus
            owner.update(dict.fromkeys(gpus, ev["job_id"]))
            held[q] += len(gpus)
            pending[q] -= 1
            out.placements += all(pending[x] > 0 for x in queues)
        elif kind in _ENDS and q:
            gpus = holds.pop(ev["job_id"], [])
            for g in gpus:
                del owner[g]
            held[q] -= len(gpus)
            if _ENDS[kind]:
                pending[q] += 1
                continue
            over.add(ev["job_id"])
            if not gpus:  # ended without holding GPUs (cancelled or rejected while pending)
                pending[q] -= 1
    return out


def test_weights_two_to_one_hold_on_a_full_cluster(tmp_path: Path) -> None:
    up = Up(tmp_path / "corral", ["--nodes", str(NODES), "--gpus-per-node", str(GPUS)]).start()
    try:
        url = up.url
        for queue, weight in WEIGHTS.items():
            corral("queue", "set", queue, "--weight", f"{weight:g}", url=url)
        nodes = [f"node-{i}" for i in range(NODES)]

        async def backlog(bus: Bus) -> None:
            client = Client(bus, user="tests")
            for n in nodes:
                await client.cordon(n, reason="submitting the backlogs")
            for queue in ("labb", "laba"):
                for i in range(JOBS):
                    await client.submit({"name": f"{queue}-short", "queue": queue, "gpus_per_rank": 1,
                                         "command": ["sleep", str(SLEEP_S)]}, job_id=f"{queue}-{i}")
            for n in nodes:
                await client.uncordon(n)

        asyncio.run(_with_bus(url, backlog))
        deadline = time.monotonic() + 240
        while True:  # a fold every 2 s: polling harder would take CPU from the cluster under test
            state = state_of(url)
            done = sum(j.status == "completed" for j in state.jobs.values() if j.job_id.startswith("lab"))
            if done == 2 * JOBS:
                break
            stuck = {j.job_id: j.status for j in state.jobs.values() if j.status not in ("completed", "pending")}
            assert time.monotonic() < deadline, f"{done} of {2 * JOBS} completed; not pending nor done: {stuck}"
            time.sleep(2)
        records = [json.loads(line) for line in corral("tail", "--no-follow", "--json", url=url).stdout.splitlines()]
    finally:
        assert up.stop() == 0, "".join(up.lines[-20:])

    got = held_while_backlogged(records, tuple(WEIGHTS))
    means = {q: round(got.mean(q), 2) for q in WEIGHTS}
    ratio = got.gpu_s["laba"] / got.gpu_s["labb"]
    print(f"both backlogged {got.span_s:.1f} s, {got.placements} placements, {got.voids} void; "
          f"mean GPUs {means}; laba/labb {ratio:.2f}")
    assert got.span_s >= MIN_SPAN_S and got.placements >= MIN_PLACEMENTS, got
    assert 1.8 <= ratio <= 2.2, f"laba/labb held {ratio:.2f} while both were backlogged (mean GPUs {means})"
