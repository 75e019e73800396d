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

Warm nodes (issue #33): a request may name the nodes whose dataset cache holds
some of the job's datasets (`GangRequest.warm`, from core/locality.py). Among
the placements of equal topology quality, those on warm nodes win: the same
level is searched, and among its domains that fit the one whose fitting nodes
hold the most of the datasets is taken before best fit; inside it, members of
equal room go warm first. The result is kept only if it is as good as the
placement without the preference -- the same level, no more nodes, pairwise
links scoring no lower, and no more idle nodes broken into (an idle node --
every GPU of the widest node free -- that a rank takes only part of: best
fit keeps those whole for big gangs, and a preference that broke them cost
more queueing than the staging it saved, bench/RESULTS.md) -- so the
preference is a score, never a constraint.
With `locality: require` (`GangRequest.only`) only the nodes holding every
dataset are searched at all.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Mapping
from typing import NamedTuple

from orchestrator.core.model.capacity import FreeIndex
from orchestrator.core.model.eligibility import ANY_GPU, GpuClass, gpu_class
from orchestrator.core.model.state import Job
from orchestrator.core.model.topology import CLUSTER, NODE, ROOT, Topology
from orchestrator.policies.links import Links, best_gpu_set, set_score, split_ranks
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
    #: Nodes whose dataset cache holds some of the job's datasets, with how many (sorted by node; empty: no
    #: datasets, none cached, or the preference is off). Placement prefers them (module docstring).
    warm: tuple[tuple[str, int], ...] = ()
    #: `locality: require`: the only nodes it may use (those holding every dataset); None: any node.
    only: frozenset[str] | None = None

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


def only_nodes(index: FreeIndex, nodes: frozenset[str]) -> FreeIndex:
    """`index` restricted to `nodes` (`locality: require`): a new index, `index` is left as it is."""
    return FreeIndex(index.topo, index.cls, {n: g for n, g in index.free.items() if n in nodes}, index.eligible)


def fits(req: GangRequest, index: FreeIndex) -> bool:
    if req.only is not None:
        index = only_nodes(index, req.only)
    return smallest_fitting_domain(req, index) is not None


def _spread(index: FreeIndex, domain: str, ranks: int, g: int,
            warmth: Mapping[str, int] | None = None) -> list[tuple[str, int]]:
    """(node, ranks) pairs covering `ranks` inside `domain`, packed and best-fitting; with `warmth`
    (member -> how warm), members of equal room go warmest first (the packing is the same)."""
    topo = index.topo
    kids = topo.children.get(domain) or []
    is_leaf = not kids
    members = topo.nodes_in[domain] if is_leaf else kids
    order = range(len(members)) if not warmth else _warm_first(members, warmth)
    room: list[tuple[int, int, str]] = []  # (-capacity, position, member): most room first
    for pos, m in zip(order, members, strict=True):
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
        out.extend([(member, take)] if is_leaf else _spread(index, member, take, g, warmth))
        left -= take
    return out


def _warm_first(members: list[str], warmth: Mapping[str, int]) -> list[int]:
    """Each member's position in the order warmest first, then as listed."""
    ranked = sorted(range(len(members)), key=lambda i: (-warmth.get(members[i], 0), i))
    pos = [0] * len(members)
    for p, i in enumerate(ranked):
        pos[i] = p
    return pos


def assign_ranks(req: GangRequest, index: FreeIndex, choice: DomainChoice, links_of: LinksOf,
                 warmth: Mapping[str, int] | None = None) -> tuple[RankPlacement, ...]:
    g = req.gpus_per_rank
    single = choice.level == NODE
    per_node = [(choice.domain, req.ranks)] if single else _spread(index, choice.domain, req.ranks, g, warmth)
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
    if req.only is not None:
        index = only_nodes(index, req.only)
    choice = smallest_fitting_domain(req, index)
    if choice is None:
        return None
    ranks = assign_ranks(req, index, choice, links_of)
    if len(ranks) != req.ranks:  # the capacity index and the spread disagree: refuse, never go partial
        return None
    if req.warm:
        warmer = _warm_placement(req, index, choice, ranks, links_of)
        if warmer is not None:
            return warmer
    return Placement(ranks=ranks, reason=describe(req, choice, index))


def link_quality(ranks: tuple[RankPlacement, ...], links_of: LinksOf) -> int:
    """Sum over nodes of the pairwise link score of the GPUs a placement takes there (higher is better)."""
    per_node: dict[str, list[int]] = {}
    for rp in ranks:
        per_node.setdefault(rp.node_id, []).extend(rp.gpus)
    return sum(set_score(links_of(n), tuple(sorted(g))) for n, g in per_node.items() if len(g) > 1)


def heat_of(ranks: tuple[RankPlacement, ...], warm: Mapping[str, int]) -> int:
    """How warm a placement is: the datasets its nodes hold, summed over its nodes."""
    return sum(warm.get(n, 0) for n in dict.fromkeys(rp.node_id for rp in ranks))


def _warm_placement(req: GangRequest, index: FreeIndex, choice: DomainChoice, cold: tuple[RankPlacement, ...],
                    links_of: LinksOf) -> Placement | None:
    """The placement on the warmest domain of `choice`'s level, if it is as good as `cold` and warmer
    (module docstring); None keeps `cold`."""
    warm = dict(req.warm)
    better = _warmest_domain(req, index, choice, warm, cold)
    warmth = dict(warm)  # nodes, and each domain above them: what its warm nodes hold
    for node, count in warm.items():
        for d in index.topo.paths.get(node, ())[1:]:
            warmth[d] = warmth.get(d, 0) + count
    ranks = assign_ranks(req, index, better, links_of, warmth)
    if len(ranks) != req.ranks:
        return None
    nodes = list(dict.fromkeys(rp.node_id for rp in ranks))
    heat = heat_of(ranks, warm)
    if heat == 0 or (ranks != cold and heat <= heat_of(cold, warm)):
        return None
    if len(nodes) > len({rp.node_id for rp in cold}) or link_quality(ranks, links_of) < link_quality(cold, links_of):
        return None
    if idle_broken(ranks, index) > idle_broken(cold, index):
        return None
    where = describe(req, better, index)
    if len(nodes) == 1:
        return Placement(ranks=ranks, reason=f"{where}; warm: it holds {warm[nodes[0]]} of the job's datasets")
    held = sum(1 for n in nodes if warm.get(n, 0) > 0)
    return Placement(ranks=ranks, reason=f"{where}; warm: {held} of its {len(nodes)} nodes hold the job's datasets")


def idle_broken(ranks: tuple[RankPlacement, ...], index: FreeIndex) -> int:
    """Idle nodes (every GPU of the widest node free) of which the placement takes some GPUs but not all."""
    taken: dict[str, int] = {}
    for rp in ranks:
        taken[rp.node_id] = taken.get(rp.node_id, 0) + len(rp.gpus)
    width = index.topo.width
    return sum(1 for n, k in taken.items() if len(index.free.get(n, ())) == width and 0 < k < width)


def _warmest_domain(req: GangRequest, index: FreeIndex, choice: DomainChoice, warm: Mapping[str, int],
                    cold: tuple[RankPlacement, ...]) -> DomainChoice:
    """Among the domains of `choice`'s level that fit the gang, the one whose nodes with room hold the most of
    the datasets; then best fit (fewest free GPUs), then registration order (a node) or listing order. A single
    node is not taken if that breaks into an idle node where `cold` does not (module docstring)."""
    topo, g = index.topo, req.gpus_per_rank
    if choice.level == CLUSTER:
        return choice
    if choice.level == NODE:
        may_break = idle_broken(cold, index) > 0 or req.gpus >= topo.width
        best: tuple[int, int, int, str] | None = None
        for node, count in warm.items():
            free = index.free.get(node)
            if free is None or len(free) < req.gpus or (g > 0 and len(free) // g < req.ranks):
                continue
            if not may_break and len(free) == topo.width:
                continue
            key = (-count, len(free), topo.order[node], node)
            if best is None or key < best:
                best = key
        return DomainChoice(NODE, best[3]) if best is not None else choice
    depth = topo.levels.index(choice.level) + 1  # a node's path: ROOT, then one domain per level
    heat: dict[str, int] = {}
    for node, count in warm.items():
        path = topo.paths.get(node)
        if path is not None and index.node_slots(node, g, req.ranks) > 0:
            heat[path[depth]] = heat.get(path[depth], 0) + count
    chosen: tuple[int, int, int, str] | None = None
    for pos, d in enumerate(topo.domains_at[choice.level]):
        if d not in heat or index.capacity(d, g, req.ranks) < req.ranks:
            continue
        key = (-heat[d], index.free_gpus(d), pos, d)
        if chosen is None or key < chosen:
            chosen = key
    return DomainChoice(choice.level, chosen[3]) if chosen is not None else choice
