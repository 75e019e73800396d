"""backfill.earliest_start: the counting first pass answers exactly as the plain loop it replaced.

The oracle is the plain loop, kept here verbatim: copy the index, give back
each ending gang's GPUs in turn, and after each ask the necessary conditions,
`fits` and `place`. The fast version must give the same Hold (job, until,
ranks), read the same number of endings, and leave the caller's index as it was.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core.model.capacity import FreeIndex
from orchestrator.core.model.eligibility import ANY_GPU, gpu_class
from orchestrator.core.model.plan import Hold
from orchestrator.core.model.topology import ROOT, Topology
from orchestrator.policies.backfill import Ending, FitsFn, PlaceFn, earliest_start
from orchestrator.policies.placement import GangRequest, LinksOf, fits, place_gang
from schemas.events import RankPlacement
from tests.core.harness import DGX1_LINKS
from tests.core.strategies import PROFILE

INF = math.inf


def oracle(
    req: GangRequest, index: FreeIndex, ending: Iterable[Ending], fits: FitsFn, place: PlaceFn, links_of: LinksOf
) -> Hold | None:
    """earliest_start as it was before the counting first pass (one give and one capacity check per ending)."""
    idx = index.copy()
    until = -math.inf
    for e in ending:
        until = max(until, e.ends_at)
        for rp in e.placement:
            idx.give(rp.node_id, rp.gpus)
        if idx.free_gpus(ROOT) < req.gpus or idx.capacity(ROOT, req.gpus_per_rank, req.ranks) < req.ranks:
            continue
        if not fits(req, idx):
            continue
        p = place(req, idx, links_of)
        if p is not None:
            return Hold(job_id=req.job_id, until=until, ranks=p.ranks)
    return None


def links_of(node: str) -> tuple[tuple[int, ...], ...]:
    return DGX1_LINKS if node.endswith(("0", "3")) else ()


def snapshot(idx: FreeIndex) -> tuple[Any, ...]:
    return (dict(idx.free), list(idx.hist), list(idx.totals), [list(b) for b in idx.buckets])


def run_both(req: GangRequest, index: FreeIndex, endings: list[Ending], fits_fn: FitsFn = fits) -> tuple[Any, Any]:
    """(outcome, endings read) of each implementation; an outcome is the Hold, None, or the error's type."""
    results = []
    for fn in (oracle, earliest_start):
        before = snapshot(index)
        read = 0

        def counted() -> Iterator[Ending]:
            nonlocal read
            for e in endings:
                read += 1
                yield e

        try:
            out: Any = fn(req, index, counted(), fits_fn, place_gang, links_of)
        except Exception as err:  # an inconsistent index may make give itself fail: then both must
            out = type(err)
        assert snapshot(index) == before, f"{fn.__name__} changed the caller's index"
        results.append((out, read))
    return results[0], results[1]


def ending(job_id: str, ends_at: float, *ranks: tuple[str, tuple[int, ...]]) -> Ending:
    placement = tuple(RankPlacement(rank=i, node_id=n, gpus=g) for i, (n, g) in enumerate(ranks))
    return Ending(job_id=job_id, ends_at=ends_at, started_at=0.0, placement=placement)


def cluster(count: int, levels: tuple[str, ...] = ("block", "leaf")) -> Topology:
    topo = Topology(levels)
    for i in range(count):
        topo.add(f"n{i}", {"block": f"b{i // 4}", "leaf": f"l{i // 2}"}, 8)
    return topo


# --- examples -----------------------------------------------------------------------------------

ALL = tuple(range(8))


def test_two_node_gang_waits_for_the_latest_of_the_gangs_it_needs() -> None:
    topo = cluster(4)
    # n0 and n1 fully busy, n2 half busy, n3 fully busy.
    index = FreeIndex(topo, ANY_GPU, {"n0": (), "n1": (), "n2": (4, 5, 6, 7), "n3": ()}, None)
    endings = [
        ending("a", 100.0, ("n2", (0, 1, 2, 3))),  # 8 free now, but on one node only
        ending("b", 300.0, ("n0", ALL)),  # two whole nodes: n0 and n2
        ending("c", 200.0, ("n1", ALL)),  # (out of order: `until` is the max, not the last)
    ]
    req = GangRequest(job_id="big", ranks=2, gpus_per_rank=8, cls=ANY_GPU)
    hold = earliest_start(req, index, endings, fits, place_gang, links_of)
    assert hold is not None
    assert hold.until == 300.0
    assert sorted(r.node_id for r in hold.ranks) == ["n0", "n2"]
    want, got = run_both(req, index, endings)
    assert got == want == (hold, 2)


def test_gpus_given_twice_ineligible_gpus_and_unindexed_nodes_do_not_count() -> None:
    topo = cluster(4)
    # Only GPUs 0-3 of n0/n1 are of the class; n3 cannot host it at all (not indexed).
    eligible = {"n0": frozenset(range(4)), "n1": frozenset(range(4))}
    index = FreeIndex(topo, gpu_class("H100", 0), {"n0": (), "n1": ()}, eligible)
    endings = [
        ending("a", 10.0, ("n0", (0, 1)), ("n0", (1, 2))),  # overlapping: 3 GPUs, not 4
        ending("b", 20.0, ("n0", (4, 5, 6, 7)), ("n3", ALL), ("n9", ALL)),  # none of these count
        ending("c", INF, ("n0", ()), ("n1", (0, 1, 2))),  # an empty rank; 6 GPUs now
        ending("d", 30.0, ("n0", (3,))),  # 7 GPUs: three ranks of 2
        ending("e", 40.0, ("n1", (3,))),  # 8: four ranks
    ]
    req = GangRequest(job_id="g", ranks=4, gpus_per_rank=2, cls=gpu_class("H100", 0))
    (want, want_read), (got, got_read) = run_both(req, index, endings)
    assert got == want and got_read == want_read == 5
    assert got is not None and got.until == INF and {r.node_id for r in got.ranks} == {"n0", "n1"}
    assert earliest_start(req, index, endings[:4], fits, place_gang, links_of) is None


def test_a_required_leaf_keeps_asking_after_the_counts_suffice() -> None:
    topo = cluster(4)
    index = FreeIndex(topo, ANY_GPU, {f"n{i}": () for i in range(4)}, None)
    endings = [
        ending("a", 10.0, ("n0", ALL)),
        ending("b", 20.0, ("n2", ALL)),  # 16 GPUs, but in two leaves
        ending("c", 30.0, ("n3", ALL)),  # leaf l1 = n2 + n3
    ]
    req = GangRequest(job_id="g", ranks=2, gpus_per_rank=8, cls=ANY_GPU, level="leaf", required=True)
    (want, want_read), (got, got_read) = run_both(req, index, endings)
    assert got == want and got_read == want_read == 3
    assert got is not None and got.until == 30.0 and {r.node_id for r in got.ranks} == {"n2", "n3"}


def test_an_index_with_a_repeated_free_gpu_is_left_to_give() -> None:
    topo = cluster(2)
    index = FreeIndex(topo, ANY_GPU, {"n0": (0, 0, 1), "n1": ()}, None)  # inconsistent on purpose
    endings = [ending("a", 1.0, ("n0", (2,))), ending("b", 2.0, ("n0", (0,))), ending("c", 3.0, ("n1", ALL))]
    for g in (1, 2, 4, 8):
        req = GangRequest(job_id="g", ranks=2, gpus_per_rank=g, cls=ANY_GPU)
        want, got = run_both(req, index, endings)
        assert got == want


# --- property -----------------------------------------------------------------------------------


@st.composite
def scenario(draw: Any) -> tuple[GangRequest, FreeIndex, list[Ending]]:
    levels = draw(st.sampled_from([(), ("leaf",), ("block", "leaf")]))
    count = draw(st.integers(1, 10))
    topo = Topology(levels)
    size: dict[str, int] = {}
    for i in range(count):
        size[f"n{i}"] = draw(st.sampled_from([8, 8, 8, 4]))
        labels = {"block": f"b{draw(st.integers(0, 2))}", "leaf": f"l{draw(st.integers(0, 3))}"}
        if draw(st.booleans()) and draw(st.booleans()):
            del labels["leaf"]  # a node of its own at that level
        topo.add(f"n{i}", labels, size[f"n{i}"])
    odd = draw(st.integers(0, 19)) == 0  # now and then: an inconsistent index, GPUs beyond the node's

    def gpus_on(node: str) -> tuple[int, ...]:
        top = 9 if odd else size.get(node, 8) - 1  # odd: GPUs the node does not have
        return tuple(sorted(set(draw(st.lists(st.integers(0, top), max_size=8)))))

    restricted = draw(st.booleans())
    eligible: dict[str, frozenset[int]] | None = None
    if restricted:
        eligible = {}
        for node in size:
            kind = draw(st.sampled_from(["all", "all", "half", "none"]))
            if kind != "none":
                eligible[node] = frozenset(range(size[node]) if kind == "all" else range(2))
        if draw(st.booleans()):
            eligible["ghost"] = frozenset(range(8))  # eligible but not in the index
    free: dict[str, tuple[int, ...]] = {}
    for node in size:
        if eligible is not None and node not in eligible:
            continue
        if draw(st.integers(0, 7)) == 0:
            continue  # a failed or cordoned node: not indexed
        gs = tuple(draw(st.lists(st.integers(0, size[node] - 1), max_size=8, unique=True)))
        if eligible is not None:
            gs = tuple(x for x in gs if x in eligible[node])
        if odd and 0 < len(gs) < topo.width and draw(st.booleans()):
            gs = (*gs, gs[0])  # a repeated free GPU
        free[node] = gs
    index = FreeIndex(topo, gpu_class("H100", 0) if restricted else ANY_GPU, free, eligible)
    nodes = [*size, "ghost"]
    ends = st.one_of(st.sampled_from([10.0, 20.0, 20.0, 30.0, INF]), st.floats(0, 1000, allow_nan=False))
    endings = []
    for j in range(draw(st.integers(0, 25))):
        ranks = [(n, gpus_on(n)) for n in draw(st.lists(st.sampled_from(nodes), max_size=4))]
        endings.append(ending(f"r{j}", draw(ends), *ranks))
    if draw(st.booleans()):
        endings.sort(key=lambda e: e.ends_at)
    level = draw(st.sampled_from([None, None, "node", "leaf", "block", "cluster"]))
    req = GangRequest(
        job_id="head",
        ranks=draw(st.integers(0, 16)),
        gpus_per_rank=draw(st.sampled_from([1, 2, 4, 8, 8, 0])),
        cls=index.cls,
        level=level,
        required=level is not None and draw(st.booleans()),
    )
    return req, index, endings


def stricter_fits(req: GangRequest, idx: FreeIndex) -> bool:
    """A policy's own `fits`, not placement's: asked as given (one spare GPU wanted)."""
    return fits(req, idx) and idx.free_gpus(ROOT) > req.gpus


@settings(PROFILE, max_examples=10 * (PROFILE.max_examples or 40))
@given(scenario(), st.sampled_from([fits, fits, lambda req, idx: fits(req, idx), stricter_fits]))
def test_same_hold_as_the_plain_loop(case: tuple[GangRequest, FreeIndex, list[Ending]], fits_fn: FitsFn) -> None:
    req, index, endings = case
    want, got = run_both(req, index, endings, fits_fn)
    assert got == want
