"""The fold of the cluster around the jobs: nodes (registered, failed, recovered, cordoned), queues, settings."""

from __future__ import annotations

from msgspec.structs import replace

from orchestrator.core.evolve_fencing import stale
from orchestrator.core.evolve_health import redrain_all
from orchestrator.core.model.state import FREE, ClusterState, Config, Node, Queue
from orchestrator.core.model.usage import recompute_trees
from schemas.events import ClusterConfigured, NodeFailed, NodeRecovered, NodeRegistered, QueueDefined, QueueDeleted


def cluster_configured(state: ClusterState, e: ClusterConfigured) -> None:
    if stale(state, e.event_id, e.epoch, unstamped_ok=True):
        return
    state.config = Config(
        topology_levels=tuple(e.topology_levels),
        fairshare_half_life_s=e.fairshare_half_life_s,
        min_runtime_s=e.min_runtime_s,
        default_queue=e.default_queue,
        drain_unhealthy_gpus=e.drain_unhealthy_gpus,
    )
    redrain_all(state)


def node_registered(state: ClusterState, e: NodeRegistered, at: float) -> None:
    state.freed_seq = state.seq
    size = e.inventory.gpu_count
    old = state.nodes.get(e.node_id)
    if old is None:
        state.nodes[e.node_id] = Node(
            node_id=e.node_id,
            incarnation=e.incarnation,
            address=e.address,
            inventory=e.inventory,
            registered_at=at,
        )
        state.newest_node_at = max(state.newest_node_at, at)
        state.owners[e.node_id] = (FREE,) * size
        return
    # A re-registration (agent restart, new inventory): keep owners of GPUs that still exist;
    # a gang holding a GPU that disappeared has lost a rank, and decide requeues it.
    owners = state.owners.get(e.node_id, ())
    for owner in dict.fromkeys(owners[size:]):
        job = state.jobs.get(owner)
        if job is not None and owner in state.active:
            state.jobs[owner] = replace(job, lost=job.lost + 1)
            state.watch[owner] = job.submit_seq
    state.owners[e.node_id] = tuple(owners[:size]) + (FREE,) * max(0, size - len(owners))
    marks = state.earmarks.get(e.node_id)
    if marks is not None:
        state.earmarks[e.node_id] = tuple(marks[:size]) + (FREE,) * max(0, size - len(marks))
    state.nodes[e.node_id] = replace(
        old, incarnation=e.incarnation, address=e.address, inventory=e.inventory, failed=False, failed_seq=0
    )


def node_failed(state: ClusterState, e: NodeFailed) -> None:
    if stale(state, e.event_id, e.epoch, unstamped_ok=True):
        return  # a paused leader judged heartbeat ages by its own stale clock
    node = state.nodes.get(e.node_id)
    if node is None or node.failed or (e.incarnation and e.incarnation != node.incarnation):
        return  # unknown, already failed, or about an older incarnation
    state.nodes[e.node_id] = replace(node, failed=True, failed_seq=state.seq)


def node_recovered(state: ClusterState, e: NodeRecovered) -> None:
    node = state.nodes.get(e.node_id)
    if node is None or not node.failed:
        return
    state.freed_seq = state.seq
    state.nodes[e.node_id] = replace(node, failed=False, failed_seq=0, incarnation=e.incarnation or node.incarnation)


def node_cordon(state: ClusterState, node_id: str, cordoned: bool) -> None:
    node = state.nodes.get(node_id)
    if node is not None and node.cordoned != cordoned:
        state.nodes[node_id] = replace(node, cordoned=cordoned)
        if not cordoned:
            state.freed_seq = state.seq


def queue_deleted(state: ClusterState, e: QueueDeleted) -> None:
    """The definition goes; usage charged to the queue stays until its gangs end (their `queue` names it)."""
    if state.queues.pop(e.queue, None) is not None:
        recompute_trees(state)


def queue_defined(state: ClusterState, e: QueueDefined) -> None:
    old = state.queues.get(e.queue)
    new = Queue(
        name=e.queue, weight=e.weight, guaranteed_gpus=e.guaranteed_gpus, limit_gpus=e.limit_gpus, parent=e.parent
    )
    state.queues[e.queue] = new
    if old is None or old.parent != new.parent:
        recompute_trees(state)
