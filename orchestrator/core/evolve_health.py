"""The fold of GPU health: faulty GPUs leave service, their gangs are marked for a requeue, nodes drain by policy.

A fatal GpuUnhealthy puts a `GpuFault` on the node record: from that log
position no reservation may name the GPU (evolve_jobs.reservation_problem) and
decide no longer sees it free (freegpus). The gang holding it, if any, gets
`Job.gpu_fault`, and react requeues it from its newest checkpoint without
spending a restart. A GpuHealthy takes the fault off again.

A node drains for new work (`Node.drained`, so `Node.schedulable` is false)
while its health check fails or while it has at least
`Config.drain_unhealthy_gpus` faulty GPUs; the drain lifts by itself when the
cause goes, unlike an operator's cordon, which only an uncordon lifts. Gangs
already running on its healthy GPUs keep running.
"""

from __future__ import annotations

from msgspec.structs import replace

from orchestrator.core.model.state import FREE, ClusterState, GpuFault, Node
from schemas.events import GPU_FATAL, GpuHealthy, GpuUnhealthy, NodeHealthChecked


def drain_reason(node: Node, threshold: int) -> str:
    """Why `node` takes no new work by policy, or ""."""
    if node.health_check:
        return f"health check failed: {node.health_check}"
    faults = node.gpu_faults
    if threshold > 0 and len(faults) >= threshold:
        gpus = ",".join(str(f.index) for f in faults)
        return f"{len(faults)} unhealthy GPUs ({gpus}) >= {threshold}"
    return ""


def set_node_health(state: ClusterState, node: Node, **changes: object) -> None:
    """Replace the node record with `changes` and its drain reason recomputed."""
    new = replace(node, **changes)
    new = replace(new, drained=drain_reason(new, state.config.drain_unhealthy_gpus))
    if new.drained != node.drained and not new.drained:
        state.freed_seq = state.seq  # capacity came back
    state.nodes[node.node_id] = new


def redrain_all(state: ClusterState) -> None:
    """The threshold changed (ClusterConfigured): every node's drain reason again."""
    for node in list(state.nodes.values()):
        if node.gpu_faults or node.health_check or node.drained:
            set_node_health(state, node)


def gpu_fault_text(e: GpuUnhealthy) -> str:
    """How a job's requeue names the fault: "GPU n1:3 (GPU-1234) unhealthy: Xid 79 ..."."""
    uuid = f" ({e.gpu_uuid})" if e.gpu_uuid else ""
    return f"GPU {e.node_id}:{e.gpu_index}{uuid} unhealthy: {e.reason or 'fault'}"


def gpu_unhealthy(state: ClusterState, e: GpuUnhealthy) -> None:
    if e.severity != GPU_FATAL:
        return  # a warning is recorded in the log, not acted on
    node = state.nodes.get(e.node_id)
    owners = state.owners.get(e.node_id, ())
    if node is None or not 0 <= e.gpu_index < len(owners):
        return
    fault = GpuFault(index=e.gpu_index, uuid=e.gpu_uuid, reason=e.reason, xid=e.xid, source=e.source,
                     since=e.occurred_at, seq=state.seq)
    old = node.gpu_faults
    if not any(f.index == e.gpu_index for f in old):  # the first report stands; repeats add nothing
        faults = tuple(sorted((*old, fault), key=lambda f: f.index))
        set_node_health(state, node, gpu_faults=faults)
    owner = owners[e.gpu_index]
    job = state.jobs.get(owner) if owner != FREE else None
    if job is not None and owner in state.active and not job.gpu_fault:
        state.jobs[owner] = replace(job, gpu_fault=gpu_fault_text(e))
        state.watch[owner] = job.submit_seq


def gpu_healthy(state: ClusterState, e: GpuHealthy) -> None:
    node = state.nodes.get(e.node_id)
    if node is None or not any(f.index == e.gpu_index for f in node.gpu_faults):
        return
    state.freed_seq = state.seq
    set_node_health(state, node, gpu_faults=tuple(f for f in node.gpu_faults if f.index != e.gpu_index))


def node_health_checked(state: ClusterState, e: NodeHealthChecked) -> None:
    node = state.nodes.get(e.node_id)
    if node is None:
        return
    verdict = "" if e.ok else (e.output.strip() or f"exit code {e.exit_code}")
    if verdict != node.health_check:
        set_node_health(state, node, health_check=verdict)
