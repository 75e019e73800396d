"""DESIGN.md's safety invariants, checked on a folded state (the simulator's strict mode and tests).

Checked from the state alone, independently of how it was reached:
1. no GPU belongs to two gangs, and every owned GPU belongs to a gang holding it;
2. every gang holding GPUs is whole: all its ranks, each with all its GPUs;
4. no queue holds more than its limit (its subtree's GPUs included);
and no decision of the scheduler was recorded as void.
"""

from __future__ import annotations

from orchestrator.core.model.state import FREE, HOLDING, ClusterState


def violations(state: ClusterState) -> list[str]:
    out: list[str] = []
    seen: dict[tuple[str, int], str] = {}
    held: dict[str, int] = {}
    for jid in state.active:
        job = state.jobs[jid]
        spec = job.spec
        if job.status not in HOLDING:
            out.append(f"{jid} is {job.status} but listed as holding GPUs")
        if len(job.placement) != spec.ranks:
            out.append(f"{jid} holds {len(job.placement)} ranks of {spec.ranks}")
        for rp in job.placement:
            if len(set(rp.gpus)) != spec.gpus_per_rank:
                out.append(f"{jid} rank {rp.rank} has GPUs {rp.gpus}, needs {spec.gpus_per_rank}")
            owners = state.owners.get(rp.node_id, ())
            for g in rp.gpus:
                other = seen.setdefault((rp.node_id, g), jid)
                if other != jid:
                    out.append(f"GPU {rp.node_id}/{g} is held by {other} and {jid}")
                if g >= len(owners) or owners[g] != jid:
                    out.append(f"GPU {rp.node_id}/{g} of {jid} is owned by {owners[g] if g < len(owners) else '?'}")
        held[job.queue] = held.get(job.queue, 0) + job.gpus
    for node, owners in state.owners.items():
        for g, owner in enumerate(owners):
            if owner != FREE and seen.get((node, g)) != owner:
                out.append(f"GPU {node}/{g} is owned by {owner}, whose gang does not hold it")
    for name, u in state.usage.items():
        if u.gpus != held.get(name, 0):
            out.append(f"queue {name} is charged {u.gpus} GPUs, its gangs hold {held.get(name, 0)}")
        q = state.queues.get(name)
        if q is not None and q.limit_gpus is not None and u.tree_gpus > q.limit_gpus:
            out.append(f"queue {name} holds {u.tree_gpus} GPUs, over its limit {q.limit_gpus}")
    if state.voids:
        out.append(f"{state.voids} void decision(s), last: {state.last_void}")
    return out
