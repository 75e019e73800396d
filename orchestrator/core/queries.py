"""Read-only questions agents and the CLI ask of a folded state.

An agent's desired state for its node is `desired_ranks(state, node_id)`: every
rank placed there of each gang holding GPUs, at the gang's current attempt,
with the distributed-training environment it needs. `stop` says the gang is
being stopped or preempted: signal it, wait its grace, kill it.
"""

from __future__ import annotations

from typing import NamedTuple

from orchestrator.core.plan import QueueLoad
from orchestrator.core.state import FREE, ClusterState, Waiting
from orchestrator.core.usage import average_gpus
from schemas.jobspec import JobSpec


class DesiredRank(NamedTuple):
    job_id: str
    attempt: int
    rank: int
    gpus: tuple[int, ...]
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    master_addr: str
    master_port: int
    resume_from: str | None
    #: Stop this rank (cancel, scheduler stop, preemption): checkpoint signal, grace, kill.
    stop: bool
    grace_s: float
    spec: JobSpec

    def env(self) -> dict[str, str]:
        """The rendezvous environment of DESIGN.md (checkpoint dir from the spec when set)."""
        env = {
            "WORLD_SIZE": str(self.world_size),
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "NODE_RANK": str(self.node_rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in self.gpus),
            "CORRAL_JOB_ID": self.job_id,
            "CORRAL_ATTEMPT": str(self.attempt),
            "CORRAL_CHECKPOINT_DIR": self.spec.checkpoint_dir or "",
            "CORRAL_RESUME_FROM": self.resume_from or "",
        }
        return env


def desired_ranks(state: ClusterState, node_id: str) -> list[DesiredRank]:
    out: list[DesiredRank] = []
    for jid in state.active:
        job = state.jobs[jid]
        placement = job.placement
        if not any(rp.node_id == node_id for rp in placement):
            continue
        nodes: list[str] = []
        for rp in placement:
            if not nodes or nodes[-1] != rp.node_id:
                nodes.append(rp.node_id)
        master = state.nodes.get(placement[0].node_id)
        local = [rp for rp in placement if rp.node_id == node_id]
        stopping = job.stop is not None or job.status == "preempting"
        grace = job.preempt_grace_s if job.status == "preempting" else job.spec.grace_period_s
        for i, rp in enumerate(local):
            out.append(
                DesiredRank(
                    job_id=jid,
                    attempt=job.attempt,
                    rank=rp.rank,
                    gpus=rp.gpus,
                    world_size=len(placement),
                    local_rank=i,
                    local_world_size=len(local),
                    node_rank=nodes.index(node_id),
                    master_addr=master.address if master is not None else "",
                    master_port=job.master_port,
                    resume_from=job.resume_from,
                    stop=stopping,
                    grace_s=grace,
                    spec=job.spec,
                )
            )
    return out


def why_pending(state: ClusterState, job_id: str) -> Waiting | None:
    """The scheduler's last structured reason for a pending job (None: not pending or not explained yet)."""
    job = state.jobs.get(job_id)
    if job is None or job.status != "pending":
        return None
    return job.waiting


def gpu_owners(state: ClusterState, node_id: str) -> tuple[str, ...]:
    """Per GPU index of a node, the job holding it ("" when free)."""
    return state.owners.get(node_id, ())


def free_gpu_count(state: ClusterState) -> int:
    """Free GPUs on schedulable nodes (earmarked ones included)."""
    return sum(
        sum(1 for o in state.owners[nid] if o == FREE) for nid, n in state.nodes.items() if n.schedulable
    )


def queue_loads(state: ClusterState, now: float) -> list[QueueLoad]:
    """Every queue (defined or charged) with its GPUs, guarantee, limit and fair-share usage."""
    names = [*state.queues, *(q for q in state.usage if q not in state.queues)]
    half_life = state.config.fairshare_half_life_s
    out = []
    for name in names:
        q = state.queues.get(name)
        u = state.usage.get(name)
        out.append(
            QueueLoad(
                name=name,
                weight=q.weight if q else 1.0,
                guaranteed=q.guaranteed_gpus if q else 0,
                limit=q.limit_gpus if q else None,
                gpus=u.gpus if u else 0,
                usage=average_gpus(u, now, half_life) if u else 0.0,
            )
        )
    return out
