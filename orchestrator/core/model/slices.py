"""What one node was told and reported: its slice of the fold (issue #40).

An agent reads only its node's slice of the log (events/subjects.py:
`slice_filters`): the scheduler's orders to the node (WorkAssigned,
WorkChanged), the node's own facts and reports, the elections. Both folds keep
the part of a node's state those orders and reports make, with the same code
(core/evolve_slices.py): the scheduler's `ClusterState.slices` for every node,
and each agent's `NodeView` (core/node_view.py) for its own. So the scheduler
knows exactly what each node was told, sends only what is missing
(core/orders.py), and can hand an agent its node's state at any position.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from schemas.events import RankPlacement
from schemas.jobspec import JobSpec

RankStatus = Literal["started", "restarting", "exited"]

#: A worker's identity on its node: (job id, attempt, rank).
WorkerId = tuple[str, int, int]


class RankState(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    node_id: str
    status: RankStatus
    exit_code: int | None = None
    reason: str = ""
    #: The worker generation last reported (WorkerStarted/WorkerExited `restarts`): an agent that
    #: restarts a "restarting" rank after its own restart goes on from here.
    restarts: int = 0
    #: When its newest worker started and when it last exited (0.0: not reported; a time is told
    #: apart from "not reported" by the status, as a simulated clock starts at 0).
    started_at: float = 0.0
    exited_at: float = 0.0


class NodeJob(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One job's attempt on one node as the node was told it (WorkAssigned, then WorkChanged) and reported it."""

    job_id: str
    attempt: int
    spec: JobSpec
    #: This node's ranks, ascending.
    ranks: tuple[RankPlacement, ...]
    world_size: int
    node_rank: int = 0
    master_addr: str = ""
    master_port: int = 29500
    resume_from: str | None = None
    not_before: float = 0.0
    staged: bool = True
    #: schemas.events INTENT_RUN | INTENT_CHECKPOINT | INTENT_STOP.
    intent: str = "run"
    grace_s: float = 0.0
    #: This node's ranks as its agent reported them (WorkerStarted / WorkerExited of this attempt), by rank.
    reports: tuple[tuple[int, RankState], ...] = ()
    #: Log position of the WorkAssigned.
    seq: int = 0

    def report(self, rank: int) -> RankState | None:
        for r, st in self.reports:
            if r == rank:
                return st
        return None

    @property
    def done(self) -> bool:
        """Every rank here exited for good: the node is through with the attempt (both folds drop it)."""
        exited = sum(1 for _, st in self.reports if st.status == "exited")
        return exited >= len(self.ranks)


class NodeSlice(msgspec.Struct, kw_only=True):
    """A node's orders and reports (mutable, like the fold it is part of; records inside are replaced)."""

    #: Job id -> the attempt the node was told to run, while it has ranks of it that did not exit for good.
    work: dict[str, NodeJob] = msgspec.field(default_factory=dict)
    #: Workers this node reported started and not yet exited, any attempt, with their generation: what a
    #: restarted agent tells the log about if it finds them gone (nodeagent/agent.py `_adopt`).
    unended: dict[WorkerId, int] = msgspec.field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.work and not self.unended
