"""SIGTERM a standalone `corral agent` (a supervisor stopping the node): its jobs checkpoint on the way down.

Stop: the `corral agent` process (process runtime) running a checkpointing job gets SIGTERM, as from
systemd or a Kubernetes pod's termination, while the scheduler runs on.
Check:
- the agent exits 0 within the grace; its worker got the checkpoint signal and saved a checkpoint;
- the log has that Checkpointed, then the worker's WorkerExited with reason "shutdown" (no rank restart);
- the scheduler requeues the gang (JobRequeued, reason "shutdown: ...", resume_from that checkpoint),
  spending none of its restarts (no GangRestarted, restarts 0);
- a new agent on the same data dir runs attempt 2 from that step, and the job completes with the right
  result.
Invariants: DESIGN.md 5 (a preemptible job gets its checkpoint signal and grace, and resumes from its
newest checkpoint).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from events.bus import Bus
from events.sdk import Client
from events.server import NatsServer
from schemas import Checkpointed, GangRestarted, JobRequeued, JobSpec, WorkerExited
from tests.faults.logcheck import read_log
from tests.faults.services import agent_proc, observer, stop_all, until
from tests.integration.harness import scheduler, stop

ROOT = Path(__file__).resolve().parents[2]
STEPS = 400


async def test_sigterm_checkpoints_the_agents_jobs_and_they_resume_unspent(nats_server: NatsServer, bus: Bus,
                                                                            tmp_path: Path) -> None:
    proc = agent_proc(nats_server.url, "n0", tmp_path, runtime="process", gpus=1)
    procs = [proc]
    try:
        async with observer(bus) as f, scheduler(bus, heartbeat_timeout_s=30.0):
            await until(f, lambda s: len(s.nodes) == 1, 30, "the agent", alive=procs)
            command = (sys.executable, str(ROOT / "examples" / "worker.py"), "--steps", str(STEPS), "--step-ms", "30",
                       "--checkpoint-every", "25")
            await Client(bus).submit(JobSpec(name="a", ranks=1, gpus_per_rank=1, command=command, grace_period_s=20,
                                             max_restarts=1), job_id="a")
            await until(f, lambda s: (c := s.jobs["a"].checkpoint) is not None and c.step > 0, 60,
                        "a periodic checkpoint", alive=procs)

            assert await asyncio.to_thread(stop, proc, timeout=30) == 0  # SIGTERM, as a supervisor stops it
            await until(f, lambda s: s.jobs["a"].attempt == 2, 30, "the requeue")
            assert f.state.jobs["a"].restarts == 0

            procs.append(agent_proc(nats_server.url, "n0", tmp_path, runtime="process", gpus=1))
            await until(f, lambda s: s.jobs["a"].status == "completed", 90, "a to resume and complete", alive=procs[1:])
    finally:
        stop_all([p for p in procs if p.poll() is None])

    events = [e for _, e in await read_log(bus)]
    saved = max((e for e in events if isinstance(e, Checkpointed) and e.attempt == 1), key=lambda e: e.step)
    (exited,) = [e for e in events if isinstance(e, WorkerExited) and e.attempt == 1]
    assert (exited.reason, exited.exit_code, exited.will_restart, exited.checkpoint_error) == ("shutdown", 0, False, "")
    (requeued,) = [e for e in events if isinstance(e, JobRequeued)]
    assert requeued.reason.startswith("shutdown: node n0") and requeued.resume_from == saved.path
    assert not [e for e in events if isinstance(e, GangRestarted)]
    logs = "".join(p.read_text() for p in tmp_path.glob("*/logs/*-a-a2-r0-*.log"))
    assert f"resumed at step {saved.step} from {saved.path}" in logs, logs
    assert f"done at step {STEPS} value {sum(range(STEPS))}" in logs, logs
