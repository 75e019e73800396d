"""The few pending jobs a cycle must look at beyond each queue's heads.

The fold keeps them apart, so no cycle scans the whole backlog: jobs never
explained yet (they are checked for admission and get a first reason) and
pending jobs asked to stop (they end at once). Everything else waits in its
queue's line.
"""

from __future__ import annotations

from typing import NamedTuple

from orchestrator.core.model.state import ClusterState, Job


class Backlog(NamedTuple):
    fresh: list[Job]
    stopping: list[Job]

    @classmethod
    def of(cls, state: ClusterState) -> Backlog:
        jobs = state.jobs
        fresh = [jobs[jid] for jid in state.unexplained]
        stopping = [j for jid in state.stopping if (j := jobs[jid]).status == "pending"]
        return cls(fresh, stopping)
