"""A checkpoint that fails at preemption is recorded as such, with the steps lost (issue #30 point 6).

It showed only as "exit 1, preempted", and nothing recorded the lost steps. Here a preemptible job's
worker (a real process, the process runtime) saves a good checkpoint at step 5, keeps training and
says how far it got (`CORRAL_STEP=N`), and when the checkpoint signal comes its save hits a full
disk for real (a write to /dev/full: ENOSPC from the kernel), so it exits 1. A higher-priority job
preempts it. Check, from the raw log's JSON: the preempted WorkerExited carries the failure (the
ENOSPC error) and the steps lost = the step the worker itself recorded it reached - 5; the job
resumes from step 5 and completes; `corral explain` shows the failure and the count. A worker
whose checkpoint succeeds carries no failure (the test in test_agents.py, and the events here).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import msgspec
import pytest

from events.bus import Bus
from events.sdk import Client
from events.server import NatsServer
from nodeagent.checkpoint import checkpoint_failure
from orchestrator.core.model.state import ClusterState, Job
from schemas import JobSpec, WorkerExited, decode
from tests.cli.conftest import corral
from tests.faults.services import observer
from tests.integration.harness import agents, processes, scheduler, wait_until

#: Saves step 5 properly (state + manifest), then on SIGUSR1 "saves" to a full disk. Each rank notes the
#: step it reached in its own file (outside the checkpoint storage) for the test to compare with.
WORKER = r"""
import json, os, signal, sys, time
from pathlib import Path
ckpt = Path(os.environ["CORRAL_CHECKPOINT_DIR"])
attempt = int(os.environ["CORRAL_ATTEMPT"])
resume = os.environ.get("CORRAL_RESUME_FROM")
step = json.loads(Path(resume).read_text())["step"] if resume else 0
print(f"starting at step {step}", flush=True)
requested = False
def on_usr1(*_):
    global requested
    requested = True
signal.signal(signal.SIGUSR1, on_usr1)
def save(step, where):
    with open(where, "w") as f:
        json.dump({"step": step}, f)
        f.flush()
        os.fsync(f.fileno())
while step < {steps}:
    step += 1
    time.sleep(0.01)
    print(f"CORRAL_STEP={step}", flush=True)
    if step == 5 and attempt == 1:  # a good checkpoint: the state, then the manifest naming it (tmp + rename)
        save(step, ckpt / "state-5.json")
        (ckpt / ".m.tmp").write_text(json.dumps({"step": 5, "path": str(ckpt / "state-5.json"), "rank": 0,
                                                  "attempt": attempt}))
        os.replace(ckpt / ".m.tmp", ckpt / "manifest-rank0.json")
    if requested:
        Path(sys.argv[1]).write_text(str(step))
        try:
            save(step, "/dev/full")  # the checkpoint storage is full
        except OSError as e:
            print(f"checkpoint at step {step} failed: {e!r}", flush=True)
            sys.exit(1)
print(f"done at step {step}", flush=True)
"""


async def _raw_log(bus: Bus) -> list[dict[str, object]]:
    info = await bus.js.stream_info(bus.stream)
    return [json.loads((await bus.js.get_msg(bus.stream, seq)).data or b"{}")
            for seq in range(1, info.state.last_seq + 1)]


async def test_a_failed_checkpoint_at_preemption_is_recorded_with_the_steps_lost(
        nats_server: NatsServer, bus: Bus, tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER.replace("{steps}", "800"))
    reached = tmp_path / "reached"
    async with observer(bus) as follower, scheduler(bus), agents(bus, 1, tmp_path, gpus=4, runtime=processes):
        client = Client(bus)
        await client.submit(JobSpec(name="low", ranks=1, gpus_per_rank=4, priority=0,
                                    command=(sys.executable, str(script), str(reached))), job_id="low")

        def low(s: ClusterState) -> Job:
            return s.jobs["low"]

        await wait_until(follower, lambda s: (c := low(s).checkpoint) is not None and c.step == 5, 60,
                         "low's checkpoint at step 5")
        await asyncio.sleep(0.5)  # some steps past it, to be lost
        await client.submit(JobSpec(name="high", ranks=1, gpus_per_rank=4, priority=10,
                                    command=(sys.executable, "-c", "print('high')")), job_id="high")
        await wait_until(follower, lambda s: s.jobs["high"].status == "completed", 60, "high to complete")
        await wait_until(follower, lambda s: low(s).status == "completed", 90, "low to resume and complete")

    # Independent: the raw JSON of the log, and the step the worker itself wrote down.
    got = int(reached.read_text())
    exits = [e for e in await _raw_log(bus) if e.get("type") == "WorkerExited" and e.get("job_id") == "low"]
    preempted = [e for e in exits if e.get("reason") == "preempted"]
    assert len(preempted) == 1, exits
    ev = preempted[0]
    assert ev["exit_code"] == 1 and ev["attempt"] == 1
    assert "exited 1 while checkpointing" in str(ev["checkpoint_error"])
    assert "No space left on device" in str(ev["checkpoint_error"])
    assert got > 5 and ev["steps_lost"] == got - 5
    done = [e for e in exits if e.get("reason") == "completed"]
    assert len(done) == 1 and done[0].get("checkpoint_error", "") == "" and done[0].get("steps_lost", -1) == -1

    out = (await asyncio.to_thread(corral, "explain", "low", url=nats_server.url)).stdout
    line = next(ln for ln in out.splitlines() if "checkpoint failed" in ln)
    assert "No space left on device" in line and f"{got - 5} steps lost" in line, out


class _OldWorkerExited(msgspec.Struct, tag="WorkerExited", tag_field="type", kw_only=True):
    """WorkerExited as a reader from before these fields declares it (the released schema's fields)."""

    event_id: str
    occurred_at: float
    job_id: str
    attempt: int
    rank: int
    node_id: str
    exit_code: int | None = None
    signal: int | None = None
    reason: str = "completed"
    log_tail: str = ""
    restarts: int = 0
    will_restart: bool = False


def test_the_new_fields_keep_old_and_new_readers_compatible() -> None:
    new = WorkerExited(event_id="x", occurred_at=1.0, job_id="j", attempt=1, rank=0, node_id="n", exit_code=1,
                       reason="preempted", checkpoint_error="exited 1 while checkpointing", steps_lost=7)
    old = msgspec.json.decode(msgspec.json.encode(new), type=_OldWorkerExited)  # an old reader skips them
    assert (old.reason, old.exit_code) == ("preempted", 1)
    before = msgspec.json.encode(_OldWorkerExited(event_id="y", occurred_at=1.0, job_id="j", attempt=1, rank=0,
                                                  node_id="n"))
    back = decode(before)  # an event written before them reads as "no failure, unknown"
    assert isinstance(back, WorkerExited) and (back.checkpoint_error, back.steps_lost) == ("", -1)


@pytest.mark.parametrize(("saved", "code", "sig", "tail", "want", "lost"), [
    (True, 1, None, "CORRAL_STEP=9", "", -1),
    (False, 1, None, "CORRAL_STEP=9\nOSError: [Errno 28] No space left on device",
     "exited 1 while checkpointing: OSError: [Errno 28] No space left on device", 4),
    (False, None, 9, "CORRAL_STEP=12\nsaving...", "killed by signal 9 before it saved a checkpoint", 7),
    (False, 0, None, "bye", "exited 0 without saving a checkpoint: bye", -1),
])
def test_checkpoint_failure_says_why(saved: bool, code: int | None, sig: int | None, tail: str, want: str,
                                     lost: int) -> None:
    why, steps = checkpoint_failure(saved_since_signal=saved, exit_code=code, signal=sig, log_tail=tail, base_step=5)
    assert why.startswith(want) and (want or not why) and steps == lost
