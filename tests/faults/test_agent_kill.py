"""SIGKILL a node agent mid-run: its gangs move elsewhere from their newest checkpoint; it comes back.

Fault: the `corral agent` process of the node running a checkpointing gang
(process runtime, examples/worker.py with --checkpoint-every) is SIGKILLed.
Its worker keeps running, orphaned, as on a machine whose agent crashed; the
heartbeats stop. Later a new agent process starts on the same data dir.
Check:
- after the heartbeat timeout NodeFailed is appended, once for that
  incarnation and never for the new one;
- the gang is requeued (JobRequeued, attempt 2) with resume_from = the newest
  checkpoint in the log, resumes there on the other node ("resumed at step
  N>0") and completes with the right result;
- the returning agent registers a new incarnation, stops the orphaned worker
  of the superseded attempt, and gets work again (a waiting job is placed
  on it at once);
- the GPU ledger shows no two processes on one GPU at once (a job placed on
  the node the moment it re-registers must not start before the orphan that
  still holds those GPUs is gone); the replayed log keeps invariants
  1, 2, 3, 6 and has no duplicate WorkerStarted.
Invariants: DESIGN.md 1, 2, 5 (resume from newest checkpoint), 7.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from events.bus import Bus
from events.sdk import Client
from events.server import NatsServer
from schemas import Checkpointed, ClusterConfigured, JobRequeued, JobSpec, NodeFailed, NodeRegistered
from tests.faults.ledger import ledger_command, overlaps, placements, read_ledger
from tests.faults.logcheck import check_log, read_log
from tests.faults.services import agent_proc, kill, observer, stop_all, until
from tests.integration.harness import scheduler

pytestmark = pytest.mark.slow

TIMEOUT_S = 2.0
NO_PREEMPTION = ClusterConfigured(event_id="config:faults", occurred_at=0.0, topology_levels=("block", "leaf"),
                                  min_runtime_s=600.0)


def status(job_id: str):  # type: ignore[no-untyped-def]
    return lambda s: s.jobs[job_id].status if job_id in s.jobs else None


async def test_agent_sigkill_requeues_from_checkpoint_and_rejoins(nats_server: NatsServer, bus: Bus,
                                                                  tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    env = {"FAULT_LEDGER": str(ledger), "FAULT_TERM_DELAY": "3.0"}
    steps = 1500

    def agent(node: str, i: int):  # type: ignore[no-untyped-def]
        return agent_proc(nats_server.url, node, tmp_path, runtime="process", gpus=4, index=i)

    procs = {"n0": agent("n0", 0), "n1": agent("n1", 1)}
    try:
        async with observer(bus) as f, scheduler(bus, heartbeat_timeout_s=TIMEOUT_S, cluster=NO_PREEMPTION):
            await until(f, lambda s: len(s.nodes) == 2, 30, "two agents", alive=list(procs.values()))
            client = Client(bus)
            await client.submit(JobSpec(name="a", ranks=1, gpus_per_rank=4, env=env,
                                        command=ledger_command(steps, 5, "--checkpoint-every", "100")), job_id="a")
            await until(f, lambda s: status("a")(s) == "running", 30, "a running")
            victim = f.state.jobs["a"].placement[0].node_id
            other = "n1" if victim == "n0" else "n0"
            first = f.state.nodes[victim].incarnation
            await until(f, lambda s: (c := s.jobs["a"].checkpoint) is not None and c.step >= 200, 30,
                        "a's periodic checkpoints in the log")

            kill(procs[victim])
            await until(f, lambda s: s.nodes[victim].failed, 3 * TIMEOUT_S + 5, "NodeFailed")
            await until(f, lambda s: s.jobs["a"].attempt == 2 and status("a")(s) == "running", 30,
                        "a requeued and running on the other node")
            assert f.state.jobs["a"].placement[0].node_id == other
            # c waits (a is too young to preempt) and takes the victim's GPUs the moment the node is
            # back, while the orphan of a's first attempt still holds them.
            await client.submit(JobSpec(name="c", ranks=1, gpus_per_rank=4, priority=5, env=env,
                                        command=ledger_command(150)), job_id="c")
            orphans = [u for u in read_ledger(ledger) if u.job == "a" and u.attempt == 1 and u.end is None]
            assert len(orphans) == 1, "the killed agent's worker keeps running, orphaned"

            procs[victim] = agent(victim, 0 if victim == "n0" else 1)
            await until(f, lambda s: s.nodes[victim].incarnation != first and not s.nodes[victim].failed, 30,
                        "the agent to re-register", alive=list(procs.values()))
            await until(f, lambda s: all(status(j)(s) == "completed" for j in "ac"), 90, "a and c to complete",
                        alive=list(procs.values()))
    finally:
        stop_all(list(procs.values()))

    events = await read_log(bus)
    final = check_log(events, jobs=["a", "c"])
    assert {j.status for j in final.jobs.values()} == {"completed"}
    failed = Counter((e.node_id, e.incarnation) for _, e in events if isinstance(e, NodeFailed))
    assert failed == {(victim, first): 1}, f"NodeFailed once, for the killed incarnation only: {failed}"
    regs = [e.incarnation for _, e in events if isinstance(e, NodeRegistered) and e.node_id == victim]
    assert len(regs) == 2 and regs[0] == first
    assert final.jobs["c"].placement[0].node_id == victim, "the returning node got work again"

    requeue = next(e for _, e in events if isinstance(e, JobRequeued) and e.job_id == "a")
    ckpts = [e for _, e in events if isinstance(e, Checkpointed) and e.job_id == "a" and e.attempt == 1]
    assert ckpts and requeue.resume_from == max(ckpts, key=lambda c: c.step).path, "resumes from the newest"
    logs = "".join(p.read_text() for p in tmp_path.glob("*/logs/*-a-a2-r0-*.log"))
    assert f"resumed at step {max(c.step for c in ckpts)} from {requeue.resume_from}" in logs
    assert f"done at step {steps} value {sum(range(steps))}" in logs, "no step lost or repeated"

    uses = read_ledger(ledger)
    orphan = next(u for u in uses if u.job == "a" and u.attempt == 1)
    assert orphan.end is not None, "the returning agent stopped the orphaned worker"
    clash = overlaps(uses, placements(events))
    assert not clash, "GPUs held by two processes at once:\n" + "\n".join(clash)
