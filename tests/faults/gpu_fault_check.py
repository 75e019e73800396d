"""An independent check of GPU health in a log: no work on a GPU while a fatal fault holds it out.

It reads the events themselves (schemas only), not the fold it checks: a
fatal GpuUnhealthy opens a fault on (node, GPU), a GpuHealthy closes it. While
one is open no GangReserved may name that GPU, and no worker of an attempt
reserved after the fault opened may start on it.
"""

from __future__ import annotations

from collections.abc import Iterable

from schemas import AnyEvent, GangReserved, GpuHealthy, GpuUnhealthy, Unknown, WorkerStarted


def work_on_faulted_gpus(events: Iterable[tuple[int, AnyEvent | Unknown]]) -> list[str]:
    """Every reservation or worker start on a GPU while a fatal fault held it out of service."""
    open_since: dict[tuple[str, int], int] = {}
    reserved_at: dict[tuple[str, int], int] = {}
    bad: list[str] = []
    for seq, e in events:
        if isinstance(e, GpuUnhealthy) and e.severity == "fatal":
            open_since.setdefault((e.node_id, e.gpu_index), seq)
        elif isinstance(e, GpuHealthy):
            open_since.pop((e.node_id, e.gpu_index), None)
        elif isinstance(e, GangReserved):
            reserved_at[(e.job_id, e.attempt)] = seq
            for rp in e.ranks:
                for g in rp.gpus:
                    if (rp.node_id, g) in open_since:
                        bad.append(f"#{seq} GangReserved {e.job_id}/{e.attempt} on {rp.node_id}:{g}, faulty since "
                                   f"#{open_since[(rp.node_id, g)]}")
        elif isinstance(e, WorkerStarted):
            for g in e.gpus:
                since = open_since.get((e.node_id, g))
                if since is not None and reserved_at.get((e.job_id, e.attempt), 0) > since:
                    bad.append(f"#{seq} WorkerStarted {e.job_id}/{e.attempt} on {e.node_id}:{g}, faulty since #{since}")
    return bad
