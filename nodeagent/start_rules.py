"""When the agent starts a rank's worker, and when a crashed one starts again: the agent's decisions, pure.

The agent (agent.py) does the IO -- it runs workers, reads the clock, logs,
stages datasets -- and asks these rules, which read only the fold and what
the agent knows of its own workers. They import no asyncio, clock or logger
(tests/test_purity.py), so tests/agent/test_start_rules.py checks them
without processes or a server.

A rank the log wants running here (`node_work`) starts when, in this order:
it is not waiting out a rank restart (the agent's own backoff) or a failed
start's report; its attempt's gang restart backoff is over (`backoff_left`);
no worker on its way out still holds one of its GPUs (`held_gpus`,
`blocked`); and its datasets are staged. It starts as the generation after
a "restarting" rank's (`next_generation`). A worker that ended starts again
on this node only by `restarts_rank`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from orchestrator.core.model.slices import NodeJob
from orchestrator.core.model.state import Node
from orchestrator.core.node_view import NodeView
from orchestrator.core.node_work import Intent, WorkerKey


class Holder(Protocol):
    """What the rules read of a worker the agent tracks (agent.py: `Tracked`)."""

    @property
    def ending(self) -> str | None: ...  # why the agent is ending it; None while it should run

    @property
    def exited(self) -> bool: ...  # its process ended and the log says so

    @property
    def gpus_unknown(self) -> bool: ...  # adopted after an agent restart: which GPUs it holds is not recorded

    @property
    def gpus(self) -> tuple[int, ...]: ...


def backoff_left(job: NodeJob | None, attempt: int, log_now: float | None, tick_s: float) -> float | None:
    """Seconds left of the gang restart backoff that began `attempt` (`not_before`); None when none is running.

    Judged on the log's clock (the one the fold put `not_before` on), never this node's wall clock,
    which may be minutes off the scheduler's and the server's. Without a log clock yet the backoff
    counts as running for one more tick (`tick_s`): a lower bound, so it is never cut short.
    """
    if job is None or job.attempt != attempt or job.not_before <= 0.0:
        return None
    if log_now is not None and job.not_before <= log_now:
        return None
    return job.not_before - log_now if log_now is not None else tick_s


def next_generation(view: NodeView, key: WorkerKey) -> int:
    """The generation to start: 0, or the one after a "restarting" rank's in the log.

    From the log, not memory: this process may not be the one that decided the restart, and a
    reused generation's events would dedupe away (their ids carry it).
    """
    job = view.work.get(key[0])
    rank = job.report(key[2]) if job is not None and job.attempt == key[1] else None
    return rank.restarts + 1 if rank is not None and rank.status == "restarting" else 0


def held_gpus(workers: Mapping[WorkerKey, Holder], work: Mapping[WorkerKey, Intent]) -> set[int] | None:
    """GPUs still held by workers on their way out; None: unknown, so all of them.

    The log frees a gang's GPUs as soon as it is requeued (node failed, partition) or
    superseded, but its old workers here may still be running (orphans adopted after an
    agent restart, stale workers after a partition heals, a stop in its grace period).
    """
    held: set[int] = set()
    for key, w in workers.items():
        if key in work and w.ending is None:
            continue  # wanted: its GPUs are its own in the log too
        if w.exited:
            continue  # ended: its GPUs are free, whatever is left to tell or remove
        if w.gpus_unknown:
            return None
        held.update(w.gpus)
    return held


def blocked(held: set[int] | None, gpus: Iterable[int]) -> bool:
    """Whether a new worker on `gpus` must wait: an old one still holds one of them (or, unknown, may)."""
    return held is None or not held.isdisjoint(gpus)


def on_faulty_gpu(node: Node | None, gpus: tuple[int, ...]) -> bool:
    """Whether a worker on `gpus` ran on a GPU the fold marks faulty on `node`: its gang is requeued, not restarted."""
    return node is not None and bool(node.gpu_faults) and not node.unhealthy_gpus.isdisjoint(gpus)


def restarts_rank(*, ending: str | None, exit_reason: str, restart_policy: str, restarts: int, max_restarts: int,
                  intent: Intent | None, faulty_gpu: bool) -> bool:
    """Whether a worker that ended starts again here, as its rank's next generation (restart policy `rank`).

    Only a worker nobody was ending (not preempted, cancelled or killed by the agent) that crashed or
    was killed, with restarts left, whose attempt the log still wants running here, and not on a faulty
    GPU (the fold requeues that gang elsewhere, its restarts unspent). A `gang` policy's restart is
    the scheduler's (a GangRestarted), not the agent's.
    """
    return (
        ending is None
        and exit_reason in ("crashed", "killed")
        and restart_policy == "rank"
        and restarts < max_restarts
        and intent == "run"
        and not faulty_gpu
    )
