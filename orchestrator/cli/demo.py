"""`corral up --demo`: a realistic small workload, narrated live from the log.

Two teams share 4 nodes x 8 GPUs: research fills the cluster (a 16-GPU
two-node gang, an 8-GPU NVLink job, eight 1-GPU sweep experiments), then
production submits an urgent job. Production is below its guarantee, so it
reclaims GPUs: sweep experiments get their checkpoint signal, checkpoint,
yield, and later resume as attempt 2 from that checkpoint. The demo ends when
every job is final; it exits non-zero, naming them, when any job did not complete.

The workers run `python -m orchestrator.demo_worker` (the toy worker ships with
corral, so the demo runs from any directory). `corral demo` submits it to a
running cluster (docker compose): with `--image` the workers are containers of
that image (deploy/Dockerfile's `worker` target carries the worker at
WORKER_IN_IMAGE). A cluster smaller than 4 nodes x 8 GPUs (`corral demo`, or
`corral up --demo --nodes 2 --gpus-per-node 4`) gets the small workload: a
two-node gang that an urgent production job preempts, and that resumes from its
checkpoint.

The demo never touches a cluster it did not make (#41): it defines the queues
prod and research and shares the GPUs, so on a cluster whose log holds other
queues, other definitions of those two, or jobs of anyone but the demo it
refuses (exit 2, saying what it found) before writing anything; a run on a
cluster of its own (`corral up --demo`) or on one only demos used goes ahead.
`corral demo` narrates only what it does (from the log's end), never the
cluster's earlier history.
"""

from __future__ import annotations

import asyncio
import sys
import time
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, NamedTuple

from events.bus import Bus
from events.sdk import FINAL, Client
from orchestrator.cli.errors import FAILURE, OK, USAGE, CliError
from orchestrator.cli.render import line
from schemas import (
    Checkpointed,
    GangReserved,
    GangRestarted,
    JobCancelled,
    JobFailed,
    JobRejected,
    JobRequeued,
    JobRunning,
    Preempted,
    PreemptionRequested,
    tag_of,
)

if TYPE_CHECKING:
    from orchestrator.core.model.state import ClusterState

#: The toy worker, a module of the installed package (orchestrator/demo_worker.py).
WORKER_MODULE = "orchestrator.demo_worker"
#: Where deploy/Dockerfile's `worker` image keeps orchestrator/demo_worker.py.
WORKER_IN_IMAGE = "/opt/corral/worker.py"
#: The full workload needs 4 nodes x 8 GPUs; a smaller cluster gets the small one.
FULL_NODES, FULL_GPUS_PER_NODE = 4, 8


def worker_command(image: str | None = None) -> list[str]:
    """How a demo job starts the toy worker: this interpreter and the installed module, or the image's copy."""
    return ["python", WORKER_IN_IMAGE] if image else [sys.executable, "-m", WORKER_MODULE]


def _job(name: str, queue: str, ranks: int, gpus: int, steps: int, image: str | None = None,
         **extra: Any) -> dict[str, Any]:
    return {"name": name, "queue": queue, "ranks": ranks, "gpus_per_rank": gpus,
            "command": [*worker_command(image), "--steps", str(steps), "--step-ms", "10"],
            "grace_period_s": 10, **({"image": image} if image else {}), **extra}


def needs_small_workload(nodes: int, gpus_per_node: int) -> bool:
    return nodes < FULL_NODES or gpus_per_node < FULL_GPUS_PER_NODE


#: Who the demo submits as (`submitted_by`): its own jobs, told apart from anyone else's.
DEMO_USER = "demo"

#: A queue's definition as the demo compares it: (weight, guaranteed GPUs, limit, parent).
Definition = tuple[float, int, int | None, str | None]


def demo_queues(small: tuple[int, str | None] | None) -> dict[str, Definition]:
    """The queues the workload defines (`_submit_small_workload`, `_submit_workload`): what it would write."""
    if small is None:
        return {"prod": (2.0, 16, None, None), "research": (1.0, 8, None, None)}
    return {"prod": (2.0, small[0], None, None), "research": (1.0, 0, None, None)}


def not_the_demos(state: ClusterState, queues: dict[str, Definition]) -> list[str]:
    """What the log holds that the demo did not make, one phrase each ([]: a cluster of its own, or only demos')."""
    out: list[str] = []
    others = sorted(q for q in state.queues if q not in queues)
    if others:
        out.append(f"queue(s) {', '.join(others)}")
    changed = [f"{q} (weight {d.weight:g}, guarantee {d.guaranteed_gpus}, limit "
               f"{'none' if d.limit_gpus is None else d.limit_gpus})"
               for q, d in sorted(state.queues.items())
               if q in queues and (d.weight, d.guaranteed_gpus, d.limit_gpus, d.parent) != queues[q]]
    if changed:
        out.append(f"its queue names defined otherwise: {', '.join(changed)}")
    users: dict[str, int] = {}
    for job in state.jobs.values():
        if job.submitted_by != DEMO_USER:
            users[job.submitted_by or "?"] = users.get(job.submitted_by or "?", 0) + 1
    if users:
        n = sum(users.values())
        out.append(f"{n} job{'' if n == 1 else 's'} of " + ", ".join(sorted(users)))
    return out


async def refuse_a_cluster_not_its_own(bus: Bus, small: tuple[int, str | None] | None) -> None:
    """Raise CliError (exit 2) when the cluster holds queues or jobs the demo did not make: nothing is written."""
    from orchestrator.cli.state_view import load_state

    if await bus.last_seq() == 0:
        return
    found = not_the_demos(await load_state(bus), demo_queues(small))
    if found:
        raise CliError("the demo runs only on a cluster of its own, and this one holds " + "; ".join(found)
                       + ": it would redefine queues prod and research and take GPUs from those jobs, so nothing "
                         "was submitted or changed; run it on a cluster of its own: corral up --demo --data-dir "
                         ".corral/demo", USAGE)


class Workload(NamedTuple):
    """The jobs to submit first, and the urgent one to submit once they all run."""

    ids: list[str]
    urgent_id: str
    urgent: dict[str, Any]


async def _submit_small_workload(client: Client, gpus_per_node: int, image: str | None, run: str = "") -> Workload:
    """Two nodes or more, any GPU count: one two-node gang, preempted by production and resumed."""
    await client.define_queue("prod", weight=2.0, guaranteed_gpus=gpus_per_node)
    await client.define_queue("research", weight=1.0, guaranteed_gpus=0)
    ids = [await client.submit(_job("ddp-2node", "research", 2, gpus_per_node, 1500, image, priority=0),
                               job_id=f"demo-ddp-2node{run}")]
    return Workload(ids, f"demo-urgent-eval{run}", _job("urgent-eval", "prod", 1, gpus_per_node, 300, image, priority=100))


async def _submit_workload(client: Client, run: str = "") -> tuple[list[str], str]:
    await client.define_queue("prod", weight=2.0, guaranteed_gpus=16)
    await client.define_queue("research", weight=1.0, guaranteed_gpus=8)
    ids = [
        await client.submit(_job("bert-pretrain", "research", 2, 8, 3000, priority=5, preemptible=False,
                                 topology={"level": "leaf", "mode": "require"}), job_id=f"demo-bert-2x8{run}"),
        await client.submit(_job("llama-finetune", "research", 1, 8, 2500, priority=5, preemptible=False,
                                 topology={"level": "node", "mode": "require"}), job_id=f"demo-llama-nvlink{run}"),
    ]
    for i in range(8):
        ids.append(await client.submit(_job(f"sweep-{i}", "research", 1, 1, 3000, priority=0),
                                       job_id=f"demo-sweep-{i}{run}"))
    return ids, f"demo-urgent-eval{run}"


class Story:
    """What the narration has seen: why each job's last attempt ended, and how each job ended.

    A new attempt (JobRunning with attempt > 1) is a *resume* only when the
    attempt before it yielded with a checkpoint (Preempted or JobRequeued with
    a `resume_from`); after a GangRestarted (a crash) it is a restart, and after
    a preemption or requeue without a checkpoint it starts over from step 0.
    """

    def __init__(self) -> None:
        #: job -> how its next attempt starts: ("resume", checkpoint), ("restart", why) or ("fresh", why).
        self.next_start: dict[str, tuple[str, str]] = {}
        #: job -> (final event tag, its reason).
        self.outcomes: dict[str, tuple[str, str]] = {}
        self.resumed = 0
        self.restarted = 0

    def interrupted(self, job_id: str, how: str, detail: str) -> None:
        self.next_start[job_id] = (how, detail)

    def started_again(self, job_id: str, attempt: int) -> str:
        """The line for a job running again as `attempt`."""
        how, detail = self.next_start.pop(job_id, ("fresh", ""))
        if how == "resume":
            self.resumed += 1
            return f"{job_id} resumed as attempt {attempt} from its checkpoint {detail}"
        if how == "restart":
            self.restarted += 1
            return f"{job_id} restarted as attempt {attempt} after a crash ({detail or 'a worker failed'})"
        return f"{job_id} started over as attempt {attempt} from step 0 ({detail or 'no checkpoint'})"

    def not_completed(self) -> list[str]:
        return sorted(j for j, (tag, _) in self.outcomes.items() if tag != "JobCompleted")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _final_reason(ev: object) -> str:
    if isinstance(ev, JobRejected):
        return "; ".join(ev.reasons)
    if isinstance(ev, JobFailed | JobCancelled):
        return ev.reason
    return ""


async def _fresh_start(bus: Bus, client: Client) -> tuple[int, str]:
    """(the log position the demo narrates after, the suffix of this run's job ids).

    A data dir of an earlier run already holds that run's log: the demo must not replay it as if it were
    this run (it would end at once, every job final). Its jobs get ids of their own (`demo-...-2` on the second run), the
    narration starts after the log's end, and jobs an earlier demo left unfinished are cancelled so they do
    not hold the GPUs this run needs. Said in one line, so nobody mistakes it for a replay.
    """
    from orchestrator.cli.state_view import load_state
    from orchestrator.core.model.state import TERMINAL

    start = await bus.last_seq()
    if start == 0:
        return 0, ""
    state = await load_state(bus, to_seq=start)
    n = 1
    while any(f"demo-{name}{'' if n == 1 else f'-{n}'}" in state.jobs
              for name in ("urgent-eval", "ddp-2node", "bert-2x8")):
        n += 1
    run = "" if n == 1 else f"-{n}"
    left = sorted(j.job_id for j in state.jobs.values() if j.submitted_by == DEMO_USER and j.status not in TERMINAL)
    if not run and not left:
        return 0, ""  # no demo ran here before: narrate the whole log, the cluster's start included
    print(f"demo: the log already holds an earlier demo run ({start} events): this is "
          f"a new run{f' (job ids end in {run})' if run else ''}, narrated from #{start + 1}"
          + (f"; cancelling {len(left)} unfinished demo job(s) of an earlier run: {', '.join(left)}" if left else ""),
          flush=True)
    for job_id in left:
        await client.cancel(job_id, reason="a new demo run")
    return start, run


#: Production submits this long after the cluster fills, so the workers it preempts have started and
#: installed their checkpoint-signal handler (signalled before that, a worker dies without a checkpoint).
URGENT_AFTER_S = 2.0


async def run_demo(bus: Bus, url: str, *, duration: float = 0.0, small: tuple[int, str | None] | None = None,
                   from_end: bool = False) -> int:
    """Submit and narrate; `small` = (GPUs per node, image): the small workload (see the module note).

    OK when every job completed; FAILURE, naming them, when any did not (failed, rejected,
    cancelled, or unfinished when `duration` ran out). Raises CliError (exit 2) before writing anything on a
    cluster it did not make (`refuse_a_cluster_not_its_own`). `from_end`: narrate only from the log's end
    (`corral demo`: the cluster's own start is not the demo's story).
    """
    await refuse_a_cluster_not_its_own(bus, small)
    client = Client(bus, user=DEMO_USER)
    start, run = await _fresh_start(bus, client)
    if from_end:
        start = max(start, await bus.last_seq())
    print(f"demo: submitting the workload (watch it too: corral --nats {url} tail)", flush=True)
    if small is None:
        ids, urgent = await _submit_workload(client, run)
        urgent_spec = _job("urgent-eval", "prod", 1, 2, 600, priority=100)
    else:
        w = await _submit_small_workload(client, *small, run=run)
        ids, urgent, urgent_spec = w.ids, w.urgent_id, w.urgent
    pending = set(ids) | {urgent}
    urgent_sent = False
    story = Story()
    deadline = time.monotonic() + (duration or 600.0)
    started: set[str] = set()
    urgent_task: asyncio.Task[None] | None = None

    async def submit_urgent() -> None:
        await asyncio.sleep(URGENT_AFTER_S)
        await client.submit(urgent_spec, job_id=urgent)

    async def narrate() -> None:
        nonlocal urgent_sent, urgent_task
        async with aclosing(bus.tail(from_seq=start + 1)) as events:
            async for env in events:
                ev = env.event
                tag = tag_of(ev)
                print(line(env), flush=True)
                job_id = getattr(ev, "job_id", None)
                if isinstance(ev, GangReserved) and len({p.node_id for p in ev.ranks}) > 1:
                    print(f"demo: >> gang {ev.job_id}: all {len(ev.ranks)} ranks reserved at once across "
                          f"{len({p.node_id for p in ev.ranks})} nodes", flush=True)
                if isinstance(ev, JobRunning):
                    started.add(ev.job_id)
                    if ev.attempt > 1:
                        print(f"demo: >> {story.started_again(ev.job_id, ev.attempt)}", flush=True)
                if isinstance(ev, PreemptionRequested):
                    print(f"demo: >> preempting {ev.job_id} for {ev.preemptor_job_id}: checkpoint signal sent",
                          flush=True)
                if isinstance(ev, Checkpointed):
                    print(f"demo: >> {ev.job_id} checkpointed at step {ev.step}", flush=True)
                if isinstance(ev, Preempted):
                    if ev.resume_from:
                        story.interrupted(ev.job_id, "resume", ev.resume_from)
                        print(f"demo: >> {ev.job_id} yielded its GPUs; requeued, resumes from {ev.resume_from}",
                              flush=True)
                    else:
                        story.interrupted(ev.job_id, "fresh", "preempted before any checkpoint")
                        print(f"demo: >> {ev.job_id} yielded its GPUs without a checkpoint; requeued, starts over",
                              flush=True)
                if isinstance(ev, JobRequeued):
                    if ev.resume_from:
                        story.interrupted(ev.job_id, "resume", ev.resume_from)
                    else:
                        story.interrupted(ev.job_id, "fresh", f"requeued: {ev.reason}, no checkpoint")
                if isinstance(ev, GangRestarted):
                    story.interrupted(ev.job_id, "restart", ev.reason)
                    print(f"demo: >> {ev.job_id} crashed; all its ranks restart as attempt {ev.attempt}", flush=True)
                if job_id in pending and tag in FINAL:
                    pending.discard(job_id)
                    story.outcomes[job_id] = (tag, _final_reason(ev))
                    if tag != "JobCompleted":
                        print(f"demo: >> {job_id} did not complete: {tag} {_final_reason(ev)}".rstrip(), flush=True)
                # Every first job has run (or ended without running): production's turn.
                if not urgent_sent and set(ids) <= started | set(story.outcomes):
                    urgent_sent = True
                    print(f"demo: >> cluster full; production submits an urgent job in {URGENT_AFTER_S:g} s",
                          flush=True)
                    urgent_task = asyncio.create_task(submit_urgent())
                if not pending:
                    return

    try:
        async with asyncio.timeout(max(0.0, deadline - time.monotonic())):  # not wait_for: events/swallowed_cancel.py
            await narrate()
        if urgent_task is not None:
            await urgent_task  # done: its job is final; raises if the submit failed
    except TimeoutError:
        print(f"demo: time is up with {len(pending)} job(s) unfinished: {', '.join(sorted(pending))}", flush=True)
        return FAILURE
    finally:
        if urgent_task is not None and not urgent_task.done():
            urgent_task.cancel()
            await asyncio.gather(urgent_task, return_exceptions=True)
    failed = story.not_completed()
    if failed:
        print(f"demo: failed: {len(failed)} of {len(story.outcomes)} jobs did not complete: "
              + ", ".join(f"{j} ({story.outcomes[j][0]})" for j in failed), flush=True)
        return FAILURE
    extra = [_count(story.resumed, "resume") + " from a checkpoint"] if story.resumed else []
    extra += [_count(story.restarted, "restart") + " after a crash"] if story.restarted else []
    print(f"demo: done; all {len(story.outcomes)} jobs completed" + (f" ({', '.join(extra)})" if extra else ""),
          flush=True)
    return OK
