"""What a simulation records for its metrics, read off job status transitions of the fold.

The engine reports every change of a job's status as the log is folded
(pending -> reserved, running -> preempting, ...), so the numbers come from
the same state every reader of the log sees, not from the simulator's own
bookkeeping. Per instant it keeps one sample of the GPUs each queue holds and
asks for (pending), which is all allocation, fair share and Jain's index need.
"""

from __future__ import annotations

from array import array

from orchestrator.core.model.state import HOLDING, ClusterState, Job
from orchestrator.core.model.usage import resolve_queue


class Timeline:
    def __init__(self) -> None:
        self.queues: list[str] = []
        self._qi: dict[str, int] = {}
        #: Per queue index: GPUs held now, GPUs asked for by pending jobs now.
        self.alloc: list[int] = []
        self.pending: list[int] = []
        #: GPUs on schedulable nodes now.
        self.capacity = 0
        # Per job.
        self.submit: dict[str, float] = {}
        self.first_start: dict[str, float] = {}
        self.end: dict[str, float] = {}
        self.status: dict[str, str] = {}
        self.gpus: dict[str, int] = {}
        self.priority: dict[str, int] = {}
        self.queue_of: dict[str, int] = {}
        self.preempted: dict[str, int] = {}
        #: Seconds each job held GPUs (reserved, running or preempting), and since when it holds them now.
        self.held_s: dict[str, float] = {}
        self._held_since: dict[str, float] = {}
        # Counters.
        self.preemptions = 0
        self.requeues = 0
        # Samples: time, then per sample a tuple per queue (queues added later are missing at the end).
        self.t = array("d")
        self.alloc_at: list[tuple[int, ...]] = []
        self.pending_at: list[tuple[int, ...]] = []
        self.capacity_at = array("q")
        self._dirty = True

    def queue_index(self, name: str) -> int:
        i = self._qi.get(name)
        if i is None:
            i = self._qi[name] = len(self.queues)
            self.queues.append(name)
            self.alloc.append(0)
            self.pending.append(0)
        return i

    def set_capacity(self, gpus: int) -> None:
        if gpus != self.capacity:
            self.capacity = gpus
            self._dirty = True

    def transition(self, state: ClusterState, job: Job, prev: str | None, now: float) -> None:
        """`job` (as folded) moved from status `prev` (None: it was just submitted)."""
        jid, new = job.job_id, job.status
        if prev is None:
            self.submit[jid] = job.submitted_at
            self.gpus[jid] = job.spec.total_gpus
            self.priority[jid] = job.spec.priority
            self.queue_of[jid] = self.queue_index(resolve_queue(state, job.spec.queue))
        q = self.queue_of[jid]
        g = self.gpus[jid]
        if prev == "pending":
            self.pending[q] -= g
        if new == "pending":
            self.pending[q] += g
            if prev == "preempting":
                self.preempted[jid] = self.preempted.get(jid, 0) + 1
            elif prev is not None:
                self.requeues += 1
        was, holds = prev in HOLDING, new in HOLDING
        if holds and not was:
            self.alloc[q] += g
            self.first_start.setdefault(jid, now)
            self._held_since[jid] = now
        elif was and not holds:
            self.alloc[q] -= g
            self.held_s[jid] = self.held_s.get(jid, 0.0) + now - self._held_since.pop(jid, now)
        if new == "preempting":
            self.preemptions += 1
        if new in ("completed", "failed", "cancelled", "rejected"):
            self.end[jid] = now
        self.status[jid] = new
        self._dirty = True

    def sample(self, now: float) -> None:
        """Record the instant `now` if anything changed since the last sample."""
        if not self._dirty:
            return
        self._dirty = False
        if self.t and self.t[-1] == now:
            self.alloc_at[-1] = tuple(self.alloc)
            self.pending_at[-1] = tuple(self.pending)
            self.capacity_at[-1] = self.capacity
            return
        self.t.append(now)
        self.alloc_at.append(tuple(self.alloc))
        self.pending_at.append(tuple(self.pending))
        self.capacity_at.append(self.capacity)
