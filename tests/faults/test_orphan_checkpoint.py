"""An orphaned worker keeps checkpointing: the log never credits its steps to the attempt that replaced it.

Fault: the `corral agent` process of the node running a checkpointing gang
(process runtime, examples/worker.py via the ledger worker, a checkpoint
every 100 steps) is SIGKILLed. Its worker survives, orphaned, and trains on,
far ahead of where the log's newest checkpoint is; both nodes share one
checkpoint root (shared storage, as in a real cluster). The gang is requeued
as attempt 2 on the other node, resuming from the log's newest checkpoint.
Check:
- no Checkpointed of attempt 2 names a step attempt 2 could not have reached
  by then (each step sleeps STEP_MS, from the resume point, after its
  reservation), and each is a checkpoint attempt 2's own worker wrote (its log
  says "checkpoint step N -> PATH");
- attempt 2 resumed from exactly the resume point the log recorded
  (JobRequeued.resume_from), which is a checkpoint the log recorded for
  attempt 1, and finished with the right result (no step lost or repeated);
- the orphan (still attempt 1) did write on meanwhile, ahead of attempt 2
  (else the run would show nothing).
Acceptance 7 of issue #19.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from pathlib import Path

import pytest

from events.bus import Bus
from events.sdk import Client
from events.server import NatsServer
from schemas import Checkpointed, ClusterConfigured, GangReserved, JobRequeued, JobSpec
from tests.faults.ledger import ledger_command, read_ledger
from tests.faults.logcheck import check_log, read_log
from tests.faults.services import agent_proc, kill, observer, stop_all, until
from tests.integration.harness import scheduler

pytestmark = pytest.mark.slow

TIMEOUT_S = 2.0
STEPS = 3000
STEP_MS = 5
NO_PREEMPTION = ClusterConfigured(event_id="config:faults", occurred_at=0.0, topology_levels=("block", "leaf"),
                                  min_runtime_s=600.0)


def worker_log(root: Path, job: str, attempt: int) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted(root.rglob(f"*-{job}-a{attempt}-r0-*.log")))


def checkpoints_written(text: str) -> dict[str, int]:
    """PATH -> step of every checkpoint a worker's log says it wrote."""
    return {path: int(step) for step, path in re.findall(r"checkpoint step (\d+) -> (\S+)", text)}


async def test_orphans_checkpoints_are_never_the_new_attempts(nats_server: NatsServer, bus: Bus,
                                                              tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    env = {"FAULT_LEDGER": str(ledger)}

    def agent(node: str, i: int):  # type: ignore[no-untyped-def]
        return agent_proc(nats_server.url, node, tmp_path, runtime="process", gpus=4, index=i)

    procs = {"n0": agent("n0", 0), "n1": agent("n1", 1)}
    try:
        async with observer(bus) as f, scheduler(bus, heartbeat_timeout_s=TIMEOUT_S, cluster=NO_PREEMPTION):
            await until(f, lambda s: len(s.nodes) == 2, 30, "two agents", alive=list(procs.values()))
            await Client(bus).submit(JobSpec(name="a", ranks=1, gpus_per_rank=4, env=env, command=ledger_command(
                STEPS, STEP_MS, "--checkpoint-every", "100")), job_id="a")
            await until(f, lambda s: (c := s.jobs["a"].checkpoint) is not None and c.step >= 200, 30,
                        "a's periodic checkpoints in the log")
            victim = f.state.jobs["a"].placement[0].node_id

            kill(procs[victim])
            await until(f, lambda s: s.jobs["a"].attempt == 2 and s.jobs["a"].status == "running", 3 * TIMEOUT_S + 30,
                        "a requeued and running on the other node")
            assert [u for u in read_ledger(ledger) if u.attempt == 1 and u.end is None], "the orphan runs on"
            await until(f, lambda s: s.jobs["a"].status == "completed", 90, "a to complete")
    finally:
        stop_all(list(procs.values()))
        for u in read_ledger(ledger):  # the orphan (its agent is gone: nobody else stops it)
            if u.end is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(u.pid, signal.SIGKILL)

    events = await read_log(bus)
    check_log(events, jobs=["a"])
    requeue = next(e for _, e in events if isinstance(e, JobRequeued) and e.job_id == "a")
    ckpts = [e for _, e in events if isinstance(e, Checkpointed) and e.job_id == "a"]
    first = {c.path: c.step for c in ckpts if c.attempt == 1}
    second = {c.path: c.step for c in ckpts if c.attempt == 2}

    assert requeue.resume_from in first, "the requeue resumes from a checkpoint the log recorded for attempt 1"
    start = first[requeue.resume_from]
    reserved = min(e.occurred_at for _, e in events if isinstance(e, GangReserved) and e.attempt == 2)
    too_soon = [(c.step, round(c.occurred_at - reserved, 2)) for c in ckpts if c.attempt == 2
                and c.occurred_at < reserved + (c.step - start) * STEP_MS / 1000]
    assert not too_soon, (f"Checkpointed for attempt 2 at steps it could not have reached yet (step, seconds "
                          f"after its reservation; it resumed at {start}): {too_soon}")
    own = checkpoints_written(worker_log(tmp_path, "a", 2))
    foreign = {p: s for p, s in second.items() if own.get(p) != s}
    assert not foreign, f"Checkpointed for attempt 2 that its worker never wrote (the orphan's?): {foreign}"
    assert second, "attempt 2 checkpointed, and it was reported"
    resumed = re.findall(r"resumed at step (\d+) from (\S+)", worker_log(tmp_path, "a", 2))
    assert resumed == [(str(first[requeue.resume_from]), requeue.resume_from)], (
        f"attempt 2 read only the resume point the log recorded: {resumed}")
    assert f"done at step {STEPS} value {sum(range(STEPS))}" in worker_log(tmp_path, "a", 2)

    orphan = checkpoints_written(worker_log(tmp_path, "a", 1))
    assert max(orphan.values()) > max(second.values(), default=0) or max(orphan.values()) == STEPS, (
        "the orphan wrote on, ahead of attempt 2 (else this test shows nothing)")
