"""Gang placement: every rank placed or none, in the smallest topology domain that fits.

Search order, fine to coarse: one node, then each configured level from the
finest (leaf) to the coarsest (block), then the whole cluster -- unless the job
*requires* a level, where the search stops at it. Among the domains of one
level that fit, the one with the fewest free GPUs wins (best fit: big holes
stay whole for big gangs); ties go to the domain listed first.

Inside the chosen domain ranks are handed out top-down: if one child domain
fits the remaining ranks, the best-fitting one takes them all; otherwise the
child with the most room is filled first (packing), and so on. Ranks of one
node are contiguous and rank 0 is on the first node chosen. Inside a node the
GPU set with the best pairwise links is picked (`links.py`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from typing import NamedTuple

from orchestrator.core.capacity import FreeIndex
from orchestrator.core.eligibility import ANY_GPU, GpuClass, gpu_class
from orchestrator.core.state import Job
from orchestrator.core.topology import CLUSTER, NODE, ROOT, Topology
from orchestrator.policies.links import Links, best_gpu_set, split_ranks
from schemas.events import RankPlacement
from schemas.jobspec import JobSpec

LinksOf = Callable[[str], Links]


class GangRequest(NamedTuple):
    """What a gang needs, independent of where it runs."""

    job_id: str
    ranks: int
    gpus_per_rank: int
    cls: GpuClass
    #: Keep every rank inside one domain of this level (None: anywhere).
    level: str | None = None
    required: bool = False

    @property
    def gpus(self) -> int:
        return self.ranks * self.gpus_per_rank


def request_of(job: Job) -> GangRequest:
    return request_for(job.job_id, job.spec)


def request_for(job_id: str, spec: JobSpec) -> GangRequest:
    """(Positional: a cycle asks for the requests of the same few heads again and again.)"""
    g = spec.gpus_per_rank
    cls = gpu_class(spec.gpu_model, spec.min_gpu_memory_mib) if g > 0 else ANY_GPU
    topo = spec.topology
    if topo is None:
        return GangRequest(job_id, spec.ranks, g, cls)
    return GangRequest(job_id, spec.ranks, g, cls, topo.level, topo.mode == "require")


class DomainChoice(NamedTuple):
    level: str
    #: The domain id, or the node id when level == "node".
    domain: str


class Placement(NamedTuple):
    ranks: tuple[RankPlacement, ...]
    #: Why there, for GangReserved.reason ("best fit in leaf l3").
    reason: str


def search_levels(req: GangRequest, topo: Topology) -> list[str]:
    """Levels to try, finest first; a required level is the last one tried."""
    order = [NODE, *reversed(topo.levels), CLUSTER]
    if req.required and req.level in order:
        return order[: order.index(req.level) + 1]
    return order


def smallest_fitting_domain(req: GangRequest, index: FreeIndex) -> DomainChoice | None:
    """The finest, then best-fitting, domain that can host the whole gang; None if none can."""
    g, n = req.gpus_per_rank, req.ranks
    if index.capacity(ROOT, g, n) < n:
        return None
    topo = index.topo
    for level in search_levels(req, topo):
        if level == NODE:
            node = index.best_fit_node(req.gpus)
            if node is not None:
                return DomainChoice(NODE, node)
        elif level == CLUSTER:
            return DomainChoice(CLUSTER, ROOT)
        else:
            best: tuple[int, str] | None = None
            for d in topo.domains_at[level]:
                if index.capacity(d, g, n) >= n:
                    free = index.free_gpus(d)
                    if best is None or free < best[0]:
                        best = (free, d)
            if best is not None:
                return DomainChoice(level, best[1])
    return None


def fits(req: GangRequest, index: FreeIndex) -> bool:
    return smallest_fitting_domain(req, index) is not None


def _spread(index: FreeIndex, domain: str, ranks: int, g: int) -> list[tuple[str, int]]:
    """(node, ranks) pairs covering `ranks` inside `domain`, packed and best-fitting."""
    topo = index.topo
    kids = topo.children.get(domain) or []
    is_leaf = not kids
    members = topo.nodes_in[domain] if is_leaf else kids
    room: list[tuple[int, int, str]] = []  # (-capacity, position, member): most room first
    for pos, m in enumerate(members):
        cap = index.node_slots(m, g, ranks) if is_leaf else index.capacity(m, g, ranks)
        if cap > 0:
            room.append((-min(cap, ranks), pos, m))
    room.sort()
    out: list[tuple[str, int]] = []
    left = ranks
    while left > 0 and room:
        # Best fit for the remainder: the member with the least room that still holds it all.
        i = bisect_left(room, (-left, len(members) + 1, "")) - 1
        if i >= 0 and -room[i][0] >= left:
            j = bisect_left(room, (room[i][0], -1, ""))  # first member with that much room
            take, member = left, room.pop(j)[2]
        else:
            cap, _, member = room.pop(0)
            take = -cap
        out.extend([(member, take)] if is_leaf else _spread(index, member, take, g))
        left -= take
    return out


def assign_ranks(req: GangRequest, index: FreeIndex, choice: DomainChoice, links_of: LinksOf) -> tuple[RankPlacement, ...]:
    g = req.gpus_per_rank
    single = choice.level == NODE
    per_node = [(choice.domain, req.ranks)] if single else _spread(index, choice.domain, req.ranks, g)
    out: list[RankPlacement] = []
    for node, k in per_node:
        if g == 0:
            groups: list[tuple[int, ...]] = [() for _ in range(k)]
        else:
            links = links_of(node)
            chosen = best_gpu_set(index.free[node], k * g, links)
            groups = split_ranks(chosen, g, links)
        for gpus in groups:
            out.append(RankPlacement(rank=len(out), node_id=node, gpus=gpus))
    return tuple(out)


def describe(req: GangRequest, choice: DomainChoice, index: FreeIndex) -> str:
    topo = index.topo
    if choice.level == NODE:
        where = f"node {choice.domain}"
    elif choice.level == CLUSTER:
        where = "the cluster"
    else:
        where = f"{choice.level} {topo.label_of(choice.domain)}"
    if req.level and req.level != choice.level and not req.required and choice.level == CLUSTER:
        return f"best fit in {where} (no single {req.level} had room)"
    return f"best fit in {where}"


def place_gang(req: GangRequest, index: FreeIndex, links_of: LinksOf) -> Placement | None:
    """A whole-gang placement on the free GPUs of `index`, or None (never a partial one)."""
    choice = smallest_fitting_domain(req, index)
    if choice is None:
        return None
    ranks = assign_ranks(req, index, choice, links_of)
    if len(ranks) != req.ranks:  # the capacity index and the spread disagree: refuse, never go partial
        return None
    return Placement(ranks=ranks, reason=describe(req, choice, index))
