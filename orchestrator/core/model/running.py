"""The gangs holding GPUs as admission and the plan see them: facts kept between decide calls, ends, preemptions.

A decide call asks which running gangs are preemptible (and at which
priorities per queue), which are CPU-only, when each lets go of its GPUs,
and which preemptions are in flight; reading every gang's record for that is
O(gangs) per call, so `RunningGangs` follows the fold's changes instead.
"""

from __future__ import annotations

import math

from orchestrator.core.model.memo import Memo
from orchestrator.core.model.state import FREE, ClusterState, EndKey, Job


class RunningGangs:
    """What admission asks about the gangs holding GPUs, kept up to date between decide calls.

    Per entry of the fold's `ends` (one per reservation: a gang requeued and
    reserved again is a new entry) the facts fixed while it holds its GPUs:
    queue, priority, whether it is a preemptible GPU gang or a CPU-only one.
    A call follows the entries the fold added and removed since the previous
    call (`ClusterState.ends_changes`) instead of reading every gang's record:
    an answer for the same `ends` list object (the same folded state) is
    updated by them (or by a diff of the whole list, if the fold dropped some),
    any other list is read afresh. It answers for the state's values either way.
    Unlike freegpus.FreeGpus it is updated in place: one decide call at a
    time per Memo (its owner, the scheduler shell or the simulator, calls it so).
    """

    __slots__ = ("counts", "cpu_only", "ends", "facts", "lowest", "preemptible", "rev", "seq")

    def __init__(self, state: ClusterState) -> None:
        self.ends = state.ends
        #: entry -> (queue, priority, kind): kind 1 preemptible GPU gang, 2 CPU-only gang, 0 neither.
        self.facts: dict[EndKey, tuple[str, int, int]] = {}
        #: queue -> priority -> preemptible GPU gangs.
        self.counts: dict[str, dict[int, int]] = {}
        self.lowest: dict[str, int] = {}
        self.cpu_only: dict[str, None] = {}
        self.preemptible: dict[str, None] = {}
        #: The state's alloc_rev and log position when last read (-1: never).
        self.rev = self.seq = -1
        self.update(state)

    def update(self, state: ClusterState) -> None:
        """Follow the fold's `ends_changes` since the last read, or diff the whole list if they were dropped."""
        touched: set[str] = set()
        if self.seq >= state.ends_dropped:
            changes = state.ends_changes
            i = len(changes)
            while i > 0 and changes[i - 1][0] > self.seq:
                i -= 1
            for _, key, added in changes[i:]:
                if added:
                    self._add(key, state, touched)
                else:
                    self._remove(key, touched)
        else:
            now = set(state.ends)
            for key in self.facts.keys() - now:
                self._remove(key, touched)
            for key in sorted(now - self.facts.keys()):
                self._add(key, state, touched)
        for queue in touched:
            c = self.counts[queue]
            if c:
                self.lowest[queue] = min(c)
            else:
                del self.counts[queue]
                self.lowest.pop(queue, None)
        self.rev, self.seq = state.alloc_rev, state.seq

    def _add(self, key: EndKey, state: ClusterState, touched: set[str]) -> None:
        j = state.jobs[key[2]]
        kind = 2 if j.gpus == 0 else 1 if j.spec.preemptible else 0
        self.facts[key] = (j.queue, j.spec.priority, kind)
        if kind == 1:
            c = self.counts.setdefault(j.queue, {})
            c[j.spec.priority] = c.get(j.spec.priority, 0) + 1
            touched.add(j.queue)
            self.preemptible[key[2]] = None
        elif kind == 2:
            self.cpu_only[key[2]] = None

    def _remove(self, key: EndKey, touched: set[str]) -> None:
        queue, prio, kind = self.facts.pop(key)
        if kind == 1:
            c = self.counts[queue]
            c[prio] -= 1
            if not c[prio]:
                del c[prio]
            touched.add(queue)
            self.preemptible.pop(key[2], None)
        elif kind == 2:
            self.cpu_only.pop(key[2], None)


def preemptions_in_flight(state: ClusterState) -> tuple[list[Job], list[Job]]:
    """The gangs being preempted, and the pending preemptors whose earmarks claim GPUs for them."""
    victims = [j for jid in state.watch if (j := state.jobs[jid]).status == "preempting"]  # all are watched
    claimants: dict[str, None] = {}
    for marks in state.earmarks.values():
        claimants.update(dict.fromkeys(m for m in marks if m != FREE))
    preemptors = [p for jid in claimants
                  if (p := state.jobs.get(jid)) is not None and p.status == "pending" and p.earmark]
    return victims, preemptors


def running_gangs(state: ClusterState, memo: Memo) -> RunningGangs:
    """Facts about the active gangs (see RunningGangs), kept in `memo.running`. Preemptible ones may
    be stopping or preempting already: callers check the current record; `lowest` counts them too."""
    found = memo.running
    if found is not None and found.ends is state.ends:
        if found.rev != state.alloc_rev:  # (the fold bumps it whenever `ends` changes)
            found.update(state)
    else:
        found = memo.running = RunningGangs(state)
    return found


def ends_at(job: Job, margin_s: float) -> float:
    """When a gang is expected to let go of its GPUs (math.inf when nothing says)."""
    if job.status == "preempting":
        return job.preempt_at + job.preempt_grace_s + margin_s
    if job.stop is not None:
        return job.stop.requested_at + job.spec.grace_period_s + margin_s
    limit = job.spec.time_limit_s
    if limit is None:
        return math.inf
    return job.reserved_at + limit + job.spec.grace_period_s + margin_s
