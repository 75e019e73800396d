"""One decide call's inputs, and the deterministic ids of what it appends.

An event id is f"{kind}:{job_id}:{attempt}:{seq}": two schedulers deciding the
same thing at the same log position produce the same id (NATS stores it once),
and decisions at different positions never collide.
"""

from __future__ import annotations

from typing import NamedTuple

from orchestrator.core.model.memo import Memo
from orchestrator.core.model.state import ClusterState, Job
from orchestrator.core.model.topology import Topology
from orchestrator.policies import Policies


class Cycle(NamedTuple):
    state: ClusterState
    now: float
    epoch: int
    policies: Policies
    #: The domain tree of the state's nodes (built once per node change, see build_topology).
    topo: Topology
    #: What decide keeps between calls (its owner's, or fresh for this call: see memo.py).
    memo: Memo

    def event_id(self, kind: str, job: Job, attempt: int | None = None) -> str:
        return f"{kind}:{job.job_id}:{job.attempt if attempt is None else attempt}:{self.state.seq}"
