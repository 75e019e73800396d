"""The few pending jobs a cycle must look at beyond each queue's heads.

The fold keeps them apart, so no cycle scans the whole backlog: jobs never
explained yet (they are checked for admission and get a first reason) and
pending jobs asked to stop (they end at once). Everything else waits in its
queue's line.

A cycle checks and explains at most `Policies.fresh_per_cycle` of the
unexplained jobs up front, oldest arrival first (the fold keeps them in the
order they joined the backlog). A burst of 50,000 submissions otherwise made
one call check and explain them all: 1.3 CPU s that held the scheduler's
loop, its lease renewal and heartbeat judging past the lease's TTL
(bench/RESULTS.md, #34). The rest keep their place in their lines: one that
admission meets as a head is checked there (reject.Rejecter.admissible) and
judged like any head, so no job is overtaken for arriving in a burst; the
others are told their first reason by the next cycles (`more`), which the
cycle's own JobWaitings wake, so a burst is explained in
ceil(burst / fresh_per_cycle) cycles.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from orchestrator.core.model.facts import SETTLE_S
from orchestrator.core.model.state import ClusterState, Job


class Backlog(NamedTuple):
    fresh: list[Job]
    stopping: list[Job]
    #: Unexplained jobs past the bound are left for the next cycles (see the module docstring).
    more: bool = False

    @classmethod
    def of(cls, state: ClusterState, now: float, limit: int) -> Backlog:
        jobs = state.jobs
        stopping = [j for jid in state.stopping if (j := jobs[jid]).status == "pending"]
        unexplained = state.unexplained
        if len(unexplained) <= limit:
            return cls([jobs[jid] for jid in unexplained], stopping)
        # Over the bound. A job explained before the cluster settled stays unexplained until the
        # reject stage judges it once more after settling (reject.py); until then it needs nothing
        # and takes no slot (else a batch of such jobs would hold the rest back until then).
        settled_at = state.newest_node_at + SETTLE_S if state.nodes else math.inf
        recheck_before = settled_at if settled_at <= now else -math.inf
        fresh: list[Job] = []
        for jid in unexplained:
            job = jobs[jid]
            w = job.waiting
            if w is not None and w.at >= recheck_before:
                continue
            if len(fresh) == limit:
                return cls(fresh, stopping, True)
            fresh.append(job)
        return cls(fresh, stopping)
