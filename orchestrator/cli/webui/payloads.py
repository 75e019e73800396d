"""What the web UI's pages show, as JSON-ready dicts: pure functions of (state, now).

Built on the views the CLI prints (orchestrator/cli/views.py), so a job, a node
or a queue reads the same in a browser as in `corral jobs`, `nodes`, `queues`.
Two rules of their own: a job's environment variables never leave the server
(any viewer may open any job's page), and a job row is small, since the live
view sends one per changed job.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice
from typing import Any

from orchestrator.cli.datasets_view import names_by_key
from orchestrator.cli.views import (
    job_detail,
    job_note,
    job_queue,
    job_shape,
    node_state,
    queue_summaries,
    sorted_nodes,
    waiting_message,
)
from orchestrator.core.gating import gate_reason
from orchestrator.core.model.state import FREE, HOLDING, TERMINAL, ClusterState, Job, Node

#: Finished jobs the live table holds (the newest); older ones are the index's (the history search).
FINISHED_SHOWN = 500
#: Pending jobs listed with their reasons on the cluster page.
PENDING_SHOWN = 50


def phase_since(job: Job) -> float:
    """When the job entered its current phase (its age counts from here; views.job_age's rule)."""
    if job.status in TERMINAL:
        return job.finished_at
    if job.status == "running":
        return job.running_at
    if job.status in HOLDING:
        return job.reserved_at
    return job.submitted_at


def job_row(state: ClusterState, job: Job) -> dict[str, Any]:
    """One row of the jobs table: what it filters and sorts on, and its one-line note."""
    gates = job.spec.gating
    array = gates.array
    deps = [*gates.after_ok, *gates.after_any, *gates.after_ok_arrays, *gates.after_any_arrays]
    return {
        "id": job.job_id,
        "name": job.spec.name,
        "user": job.submitted_by or None,
        "queue": job_queue(state, job),
        "status": job.status,
        "gpus": job.spec.total_gpus,
        "shape": job_shape(job),
        "priority": job.spec.priority,
        "preemptible": job.spec.preemptible,
        "attempt": job.attempt,
        "submitted_at": job.submitted_at,
        "since": phase_since(job),
        "array": f"{array.array_id}[{array.index}]" if array is not None else None,
        "deps": deps,
        "held": job.held,
        "note": job_note(job, state),
    }


def shown_job_ids(state: ClusterState) -> set[str]:
    """The jobs the live table holds: every one not finished (pending, or holding GPUs: the fold's own
    sets), and the newest FINISHED_SHOWN finished ones. Never a walk over every job the fold keeps."""
    return {*state.pending, *state.active, *islice(reversed(state.finished), FINISHED_SHOWN)}


def live_counts(state: ClusterState) -> dict[str, int]:
    """Jobs not finished, by status (from the fold's sets: no walk over the finished ones)."""
    counts = {"pending": len(state.pending), "reserved": 0, "running": 0, "preempting": 0}
    for jid in state.active:
        status = state.jobs[jid].status
        counts[status] = counts.get(status, 0) + 1
    return counts


def queue_payload(state: ClusterState, now: float) -> list[dict[str, Any]]:
    """`corral queues` with what the queue page adds: GPUs borrowed above the guarantee, GPUs of the
    guarantee lent to others (idle in this queue, used above their guarantees by others), pending demand."""
    summaries = queue_summaries(state, now)
    demand: dict[str, int] = {}
    for jid in state.pending:
        job = state.jobs[jid]
        name = job_queue(state, job)
        demand[name] = demand.get(name, 0) + job.spec.total_gpus
    borrowed_all = sum(max(0, q["gpus"] - q["guaranteed_gpus"]) for q in summaries)
    for q in summaries:
        q["borrowed"] = max(0, q["gpus"] - q["guaranteed_gpus"])
        idle = max(0, q["guaranteed_gpus"] - q["gpus"])
        q["lent"] = min(idle, borrowed_all - q["borrowed"])
        q["demand_gpus"] = demand.get(q["queue"], 0)
        q["share"] = q["fair_share_usage"] / q["weight"] if q["weight"] else None
    return summaries


def node_entry(state: ClusterState, node: Node, names: dict[str, list[str]]) -> dict[str, Any]:
    """One node of the grid: its GPUs (owner, earmark; the faulty ones with why), state, topology labels,
    clique and cached datasets. Kept small: the live view sends it whenever the node changes."""
    owners = state.owners.get(node.node_id, ())
    marks = state.earmarks.get(node.node_id, ())
    inv = node.inventory
    return {
        "node_id": node.node_id,
        "state": node_state(node),
        "drained": node.drained or None,
        "model": inv.gpus[0].model if inv.gpus else None,
        "labels": dict(sorted(inv.labels.items())),
        "clique": inv.fabric_clique_id,
        "owners": [o or None for o in owners],
        "earmarks": [m or None for m in marks] if any(marks) else [],
        "faults": [{"index": f.index, "reason": f.reason, "xid": f.xid, "source": f.source} for f in node.gpu_faults],
        "used": sum(1 for o in owners if o != FREE),
        "datasets": [", ".join(names.get(key, [])) or key[:19] for key in node.datasets],
    }


def node_payload(state: ClusterState) -> list[dict[str, Any]]:
    """Every node, in name order (`corral nodes`')."""
    names = names_by_key(state)
    return [node_entry(state, node, names) for node in sorted_nodes(state)]


def node_refs(state: ClusterState, node: Node) -> tuple[object, ...]:
    """What a node's entry is built from, compared by identity: the fold replaces these values (frozen
    records, tuples) when they change, so an unchanged node costs the live view one comparison."""
    return (node, state.owners.get(node.node_id), state.earmarks.get(node.node_id), node.datasets)


def pending_reasons(state: ClusterState, n: int) -> list[dict[str, Any]]:
    """The first `n` pending jobs with the scheduler's reason (`corral replay`'s pending list, cut first:
    a backlog of thousands costs the live view nothing more)."""
    out = []
    for jid in islice(state.pending, n):
        job = state.jobs[jid]
        gate = gate_reason(state, job)
        w = job.waiting
        out.append({"job_id": jid, "name": job.spec.name, "queue": job_queue(state, job), "priority": job.spec.priority,
                    "gpus": job.spec.total_gpus, "code": "gated" if gate is not None else w.code if w else None,
                    "message": gate if gate is not None else waiting_message(state, job, w.message) if w else None})
    return out


def cluster_payload(state: ClusterState, now: float) -> dict[str, Any]:
    """The cluster page's header counts, queues, jobs holding GPUs and pending reasons (the nodes apart:
    `node_payload`, which the live view sends as they change)."""
    total = sum(len(o) for o in state.owners.values())
    used = sum(1 for o in state.owners.values() for g in o if g != FREE)
    colors = list(dict.fromkeys([*state.queues, *state.usage,
                                 *(job_queue(state, state.jobs[j]) for j in state.active)]))
    return {
        "seq": state.seq,
        "now": now,
        "epoch": state.epoch,
        "scheduler_id": state.scheduler_id or None,
        "gpus_total": total,
        "gpus_used": used,
        "levels": list(state.config.topology_levels),
        "queue_order": colors,
        "jobs_by_status": live_counts(state),
        "queues": queue_payload(state, now),
        "active": {jid: {"name": state.jobs[jid].spec.name, "queue": job_queue(state, state.jobs[jid]),
                         "status": state.jobs[jid].status, "shape": job_shape(state.jobs[jid])}
                   for jid in state.active},
        "pending": pending_reasons(state, PENDING_SHOWN),
        "pending_count": len(state.pending),
    }


def without_env(spec: dict[str, Any]) -> dict[str, Any]:
    """A spec as any viewer may see it: its environment variables neither named nor shown, only counted."""
    env = spec.pop("env", None) or {}
    spec["env_vars"] = f"{len(env)} (not shown)" if env else "none"
    return spec


def job_page(state: ClusterState, job: Job, now: float) -> dict[str, Any]:
    """`corral job --json` for the job page, without the environment."""
    detail = job_detail(state, job, now)
    detail["spec"] = without_env(detail["spec"])
    detail["row"] = job_row(state, job)
    return detail


def touched_jobs(subject: str, event: object) -> Iterable[str]:
    """The jobs an event changes the row of: the job its subject names, and a preemptor it names."""
    parts = subject.split(".", 3)
    if len(parts) >= 3 and parts[1] == "job":
        yield parts[2]
    other = getattr(event, "preemptor_job_id", None)
    if isinstance(other, str) and other:
        yield other
