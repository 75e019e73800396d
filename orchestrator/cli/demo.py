"""`corral up --demo`: a realistic small workload, narrated live from the log.

Two teams share 4 nodes x 8 GPUs: research fills the cluster (a 16-GPU
two-node gang, an 8-GPU NVLink job, eight 1-GPU sweep experiments), then
production submits an urgent job. Production is below its guarantee, so it
reclaims GPUs: sweep experiments get their checkpoint signal, checkpoint,
yield, and later resume as attempt 2 from that checkpoint. The demo ends when
every job is final.

`corral demo` submits it to a running cluster (docker compose): with
`--image` the workers are containers of that image (deploy/Dockerfile's
`worker` target carries examples/worker.py at WORKER_IN_IMAGE). A cluster
smaller than 4 nodes x 8 GPUs gets the small workload: a two-node gang that an
urgent production job preempts, and that resumes from its checkpoint.
"""

from __future__ import annotations

import asyncio
import sys
import time
from contextlib import aclosing
from pathlib import Path
from typing import Any, NamedTuple

from events.bus import Bus
from events.sdk import FINAL, Client
from orchestrator.cli.errors import FAILURE, OK
from orchestrator.cli.render import line
from schemas import Checkpointed, GangReserved, JobRunning, Preempted, PreemptionRequested, tag_of

WORKER = Path(__file__).resolve().parents[2] / "examples" / "worker.py"
#: Where deploy/Dockerfile's `worker` image keeps examples/worker.py.
WORKER_IN_IMAGE = "/opt/corral/worker.py"


def _job(name: str, queue: str, ranks: int, gpus: int, steps: int, image: str | None = None,
         **extra: Any) -> dict[str, Any]:
    python, worker = ("python", WORKER_IN_IMAGE) if image else (sys.executable, str(WORKER))
    return {"name": name, "queue": queue, "ranks": ranks, "gpus_per_rank": gpus,
            "command": [python, worker, "--steps", str(steps), "--step-ms", "10"],
            "grace_period_s": 10, **({"image": image} if image else {}), **extra}


class Workload(NamedTuple):
    """The jobs to submit first, and the urgent one to submit once they all run."""

    ids: list[str]
    urgent_id: str
    urgent: dict[str, Any]


async def _submit_small_workload(client: Client, gpus_per_node: int, image: str | None) -> Workload:
    """Two nodes or more, any GPU count: one two-node gang, preempted by production and resumed."""
    await client.define_queue("prod", weight=2.0, guaranteed_gpus=gpus_per_node)
    await client.define_queue("research", weight=1.0, guaranteed_gpus=0)
    ids = [await client.submit(_job("ddp-2node", "research", 2, gpus_per_node, 1500, image, priority=0),
                               job_id="demo-ddp-2node")]
    return Workload(ids, "demo-urgent-eval", _job("urgent-eval", "prod", 1, gpus_per_node, 300, image, priority=100))


async def _submit_workload(client: Client) -> tuple[list[str], str]:
    await client.define_queue("prod", weight=2.0, guaranteed_gpus=16)
    await client.define_queue("research", weight=1.0, guaranteed_gpus=8)
    ids = [
        await client.submit(_job("bert-pretrain", "research", 2, 8, 3000, priority=5, preemptible=False,
                                 topology={"level": "leaf", "mode": "require"}), job_id="demo-bert-2x8"),
        await client.submit(_job("llama-finetune", "research", 1, 8, 2500, priority=5, preemptible=False,
                                 topology={"level": "node", "mode": "require"}), job_id="demo-llama-nvlink"),
    ]
    for i in range(8):
        ids.append(await client.submit(_job(f"sweep-{i}", "research", 1, 1, 3000, priority=0),
                                       job_id=f"demo-sweep-{i}"))
    return ids, "demo-urgent-eval"


async def run_demo(bus: Bus, url: str, *, duration: float = 0.0, small: tuple[int, str | None] | None = None) -> int:
    """Submit and narrate; `small` = (GPUs per node, image): the small workload (see the module note)."""
    client = Client(bus, user="demo")
    print(f"demo: submitting the workload (watch it too: corral --nats {url} tail)", flush=True)
    if small is None:
        ids, urgent = await _submit_workload(client)
        urgent_spec = _job("urgent-eval", "prod", 1, 2, 600, priority=100)
    else:
        w = await _submit_small_workload(client, *small)
        ids, urgent, urgent_spec = w.ids, w.urgent_id, w.urgent
    pending = set(ids) | {urgent}
    urgent_sent = False
    seen_resume = False
    deadline = time.monotonic() + (duration or 600.0)
    running: set[str] = set()

    async def narrate() -> None:
        nonlocal urgent_sent, seen_resume
        async with aclosing(bus.tail(from_seq=1)) as events:
            async for env in events:
                ev = env.event
                tag = tag_of(ev)
                print(line(env), flush=True)
                job_id = getattr(ev, "job_id", None)
                if isinstance(ev, GangReserved) and len({p.node_id for p in ev.ranks}) > 1:
                    print(f"demo: >> gang {ev.job_id}: all {len(ev.ranks)} ranks reserved at once across "
                          f"{len({p.node_id for p in ev.ranks})} nodes", flush=True)
                if isinstance(ev, JobRunning):
                    running.add(ev.job_id)
                    if ev.attempt > 1:
                        seen_resume = True
                        print(f"demo: >> {ev.job_id} resumed as attempt {ev.attempt} from its checkpoint", flush=True)
                if isinstance(ev, PreemptionRequested):
                    print(f"demo: >> preempting {ev.job_id} for {ev.preemptor_job_id}: checkpoint signal sent",
                          flush=True)
                if isinstance(ev, Checkpointed):
                    print(f"demo: >> {ev.job_id} checkpointed at step {ev.step}", flush=True)
                if isinstance(ev, Preempted):
                    print(f"demo: >> {ev.job_id} yielded its GPUs; requeued, resume from {ev.resume_from}",
                          flush=True)
                if not urgent_sent and len(running & set(ids)) == len(ids):
                    urgent_sent = True
                    print("demo: >> cluster full; production submits an urgent job", flush=True)
                    await client.submit(urgent_spec, job_id=urgent)
                if job_id in pending and tag in FINAL:
                    pending.discard(job_id)
                    if not pending:
                        return

    try:
        await asyncio.wait_for(narrate(), max(0.0, deadline - time.monotonic()))
    except TimeoutError:
        print(f"demo: time is up with {len(pending)} job(s) unfinished: {', '.join(sorted(pending))}", flush=True)
        return FAILURE
    print(f"demo: done; every job finished{' (with a preemption and a resume)' if seen_resume else ''}", flush=True)
    return OK
