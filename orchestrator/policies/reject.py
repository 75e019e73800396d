"""Admission: specs that can never run on this cluster are rejected, with the numbers.

"Never" means: not even with every registered GPU free (failed and cordoned
nodes included, they may come back), unless the spec says `allow_future_nodes`. A job asking for an unknown queue runs
in the default queue when there is one, and anywhere when no queue is defined
at all. A cluster that is empty or still growing (a node joined in the last
SETTLE_S seconds) rejects nothing on capacity: nodes may still come.
"""

from __future__ import annotations

import msgspec

from orchestrator.core.model.facts import ClusterFacts
from orchestrator.core.model.state import Job
from orchestrator.core.model.topology import NODE
from orchestrator.policies.placement import fits, request_for
from schemas.jobspec import JobSpec, jobspec_problems


def _gpus(count: int | None, model: str | None, memory_mib: int) -> str:
    """ "16 H100 GPUs with >= 80000 MiB", "a GPU", ... """
    noun = f"{model} GPU" if model else "GPU"
    words = f"a {noun}" if count is None else f"{count} {noun}{'' if count == 1 else 's'}"
    return words + (f" with >= {memory_mib} MiB" if memory_mib > 0 else "")


def unfit_reasons(job: Job, facts: ClusterFacts) -> tuple[str, ...]:
    """Every reason `job` can never run here; empty when it might."""
    spec = job.spec
    # The SDK validates, but a JobSubmitted can reach the log without it (a raw publish, an
    # old client): the scheduler applies the same validator, so e.g. 10**9 ranks is a clear
    # rejection instead of a poison pill that makes every decide build 10**9 placements.
    problems = jobspec_problems(msgspec.to_builtins(spec))
    if problems:
        return tuple(f"invalid spec: {p}" for p in problems)
    topo = spec.topology
    shape = (spec.queue, spec.ranks, spec.gpus_per_rank, spec.gpu_model, spec.min_gpu_memory_mib,
             topo.level if topo else None, topo.mode if topo else None, spec.waits_for_nodes)
    found = facts.unfit.get(shape)
    if found is None:
        found = facts.unfit[shape] = _unfit(spec, facts)
    return found


def _unfit(spec: JobSpec, facts: ClusterFacts) -> tuple[str, ...]:
    out: list[str] = []
    total = spec.total_gpus
    queue = facts.queue_of(spec.queue)
    default = facts.state.config.default_queue
    if queue is None:
        known = ", ".join(facts.queue_names())
        out.append(f"unknown queue {spec.queue!r} and no {default!r} queue; queues are: {known}")
    else:
        over = facts.limit_of(queue, total)
        if over is not None:
            out.append(f"needs {total} GPUs, more than queue {over[0]}'s limit {over[1]}")
    level_known = True
    if spec.topology is not None and not facts.topo.known_level(spec.topology.level):
        level_known = False
        known = ", ".join([*facts.topo.levels, NODE])
        out.append(f"unknown topology level {spec.topology.level!r}; this cluster has: {known}")
    # A job whose submitter said more nodes are coming waits for them (reason "capacity") instead.
    if facts.capacity_settled and spec.gpus_per_rank > 0 and not spec.waits_for_nodes:
        req = request_for("", spec)
        if not level_known:
            req = req._replace(level=None, required=False)
        idx = facts.empty_index(req.cls)
        model, memory = spec.gpu_model, spec.min_gpu_memory_mib
        if not idx.free:
            out.append(f"no cluster node has {_gpus(None, model, memory)}; it has: {', '.join(facts.models())}")
        elif idx.largest_node_free() < spec.gpus_per_rank:
            what = _gpus(spec.gpus_per_rank, model, memory)
            out.append(f"a rank needs {what}, the largest node has {idx.largest_node_free()}")
        elif not fits(req, idx):
            shape = f"{_gpus(total, model, memory)} ({spec.ranks}x{spec.gpus_per_rank})"
            if req.required and req.level == NODE:
                out.append(f"needs {shape} on one node, the largest node has {idx.largest_node_free()}")
            elif req.required and req.level is not None:
                biggest = max((idx.free_gpus(d) for d in facts.topo.domains_at.get(req.level, [])), default=0)
                out.append(f"needs {shape} in one {req.level}, the largest {req.level} has {biggest}")
            else:
                out.append(f"needs {shape}, the whole cluster has {idx.free_gpus('*')}")
    return tuple(out)
