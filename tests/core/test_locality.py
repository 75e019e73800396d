"""Placement prefers warm nodes (issue #33, acceptance 2): nodes whose dataset cache holds a job's datasets win
among placements of equal topology quality; `locality: require` waits for them and says why."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.core.locality import LOCALITY
from orchestrator.core.model.capacity import FreeIndex
from orchestrator.core.model.eligibility import ANY_GPU
from orchestrator.core.model.topology import CLUSTER, NODE, build_topology
from orchestrator.policies import DEFAULT_POLICIES
from orchestrator.policies.links import set_score
from orchestrator.policies.placement import GangRequest, place_gang
from schemas.datasets import Dataset
from schemas.events import CachedDataset, GangReserved, JobWaiting, NodeDatasets
from tests.core.harness import DGX1_LINKS, Sim, of_type
from tests.core.strategies import LEVELS, PROFILE, nodes
from tests.core.test_properties import build, check_invariants, play_agents

IMAGENET = Dataset(name="imagenet", source="https://data.example/imagenet.tar", mount="/data/imagenet")
TOKENS = Dataset(name="tokens", source="/shared/tokens", mount="/data/tokens")


def cache(s: Sim, node: str, *datasets: Dataset) -> None:
    """The node's agent tells what its cache holds (as it does on start)."""
    s.emit(NodeDatasets(event_id=s.eid(), occurred_at=s.now, node_id=node,
                        datasets=tuple(CachedDataset(key=d.key, size_bytes=1 << 30) for d in datasets)))


def reserved(events: list[Any], job_id: str) -> GangReserved | None:
    found = [e for e in of_type(events, GangReserved) if e.job_id == job_id]
    return found[0] if found else None


def waiting(events: list[Any], job_id: str) -> JobWaiting | None:
    found = [e for e in of_type(events, JobWaiting) if e.job_id == job_id]
    return found[-1] if found else None


def test_one_node_job_goes_to_the_warm_node_of_two_free_ones() -> None:
    s = Sim()
    s.node("cold")
    s.node("warm")  # registered second: without the preference the first free node would win
    cache(s, "warm", IMAGENET)
    s.submit("j", gpus_per_rank=1, datasets=(IMAGENET,))
    g = reserved(s.decide(), "j")
    assert g is not None and [r.node_id for r in g.ranks] == ["warm"]
    assert "warm" in g.reason


def test_without_datasets_or_with_the_preference_off_best_fit_decides() -> None:
    for policies, datasets in ((DEFAULT_POLICIES, ()), (replace(DEFAULT_POLICIES, prefer_warm=False), (IMAGENET,))):
        s = Sim(policies=policies)
        s.node("cold")
        s.node("warm")
        cache(s, "warm", IMAGENET)
        s.submit("j", gpus_per_rank=1, datasets=datasets)
        g = reserved(s.decide(), "j")
        assert g is not None and [r.node_id for r in g.ranks] == ["cold"]


def _three(free: dict[str, tuple[int, ...]]) -> FreeIndex:
    s = Sim()
    for n in ("cold", "one", "both"):
        s.node(n)
    return FreeIndex(build_topology(s.state.nodes.values(), ()), ANY_GPU, free, None)


def test_warm_wins_over_best_fit_and_more_datasets_win_over_fewer() -> None:
    index = _three({"cold": (6, 7), "one": (4, 5, 6, 7), "both": (3, 4, 5, 6, 7)})
    req = GangRequest("j", 1, 2, ANY_GPU)
    assert place_gang(req, index, lambda n: ()).ranks[0].node_id == "cold"  # type: ignore[union-attr]
    p = place_gang(req._replace(warm=(("both", 2), ("one", 1))), index, lambda n: ())
    assert p is not None and p.ranks[0].node_id == "both" and p.ranks[0].gpus == (3, 4)
    assert p.reason == "best fit in node both; warm: it holds 2 of the job's datasets"


def test_an_idle_warm_node_is_not_broken_into_while_best_fit_uses_a_busy_one() -> None:
    """Best fit keeps idle nodes whole for big gangs: the preference does not undo that (bench/RESULTS.md)."""
    index = _three({"cold": (6, 7), "one": (4, 5, 6, 7), "both": tuple(range(8))})
    req = GangRequest("j", 1, 2, ANY_GPU, warm=(("both", 2), ("one", 1)))
    p = place_gang(req, index, lambda n: ())
    assert p is not None and p.ranks[0].node_id == "one"  # warm and already busy: no idle node broken
    p = place_gang(req._replace(warm=(("both", 2),)), index, lambda n: ())
    assert p is not None and p.ranks[0].node_id == "cold"  # only the idle node is warm: best fit decides
    whole = place_gang(GangRequest("j", 1, 8, ANY_GPU, warm=(("both", 1),)), index, lambda n: ())
    assert whole is not None and whole.ranks[0].node_id == "both"  # taking all of it breaks nothing


def test_warm_node_is_not_taken_at_the_cost_of_worse_links() -> None:
    """Two DGX-1s (partial NVLink): a 4-GPU rank gets an NVLink quad; a warm node without an intact quad loses."""
    s = Sim()
    s.node("cold", links=DGX1_LINKS, model="V100", memory_mib=16384)
    s.node("warm", links=DGX1_LINKS, model="V100", memory_mib=16384)
    topo = build_topology(s.state.nodes.values(), ())
    req = GangRequest("four", 1, 4, ANY_GPU, warm=(("warm", 1),))
    quad = set_score(DGX1_LINKS, (0, 1, 2, 3))
    broken = FreeIndex(topo, ANY_GPU, {"cold": (0, 1, 2, 3), "warm": (1, 2, 3, 5, 6, 7)}, None)
    p = place_gang(req, broken, lambda n: DGX1_LINKS)
    assert p is not None and p.ranks[0].node_id == "cold" and set_score(DGX1_LINKS, p.ranks[0].gpus) == quad
    intact = FreeIndex(topo, ANY_GPU, {"cold": (0, 1, 2, 3), "warm": (1, 2, 3, 4, 5, 6, 7)}, None)
    p = place_gang(req, intact, lambda n: DGX1_LINKS)
    assert p is not None and p.ranks[0].node_id == "warm" and p.ranks[0].gpus == (4, 5, 6, 7)


def test_multi_node_gang_goes_to_the_leaf_holding_its_data() -> None:
    s = Sim(levels=("leaf",))
    for i, leaf in enumerate(["l0", "l0", "l1", "l1"]):
        s.node(f"n{i}", labels={"leaf": leaf})
    cache(s, "n2", IMAGENET)
    cache(s, "n3", IMAGENET)
    s.submit("gang", ranks=2, gpus_per_rank=8, datasets=(IMAGENET,), topology=("leaf", "prefer"))
    g = reserved(s.decide(), "gang")
    assert g is not None
    assert sorted(r.node_id for r in g.ranks) == ["n2", "n3"]
    assert [r.rank for r in g.ranks] == [0, 1]


def test_require_waits_while_only_cold_nodes_are_free_and_says_why() -> None:
    s = Sim()
    s.node("warm")
    s.node("cold")
    cache(s, "warm", IMAGENET)
    s.submit("big", gpus_per_rank=8)  # fills the warm node (registered first, best fit)
    s.run()
    assert s.job("big").placement[0].node_id == "warm"
    s.submit("j", gpus_per_rank=1, datasets=(IMAGENET,), locality="require")
    events = s.decide()
    assert reserved(events, "j") is None
    w = waiting(events, "j")
    # It waits for the warm node -- as the first gang blocked, holding a backfill reservation there -- and says why.
    assert w is not None and w.code in (LOCALITY, "backfill_head")
    assert "locality require: datasets imagenet are cached only on warm" in w.message
    assert all(r.node_id == "warm" for r in w.hold_ranks)
    # The same job with `prefer` would start on the cold node at once.
    s.submit("p", gpus_per_rank=1, datasets=(IMAGENET,))
    g = reserved(s.decide(), "p")
    assert g is not None and g.ranks[0].node_id == "cold"
    # The warm node frees up: the required job starts there.
    s.finish("big")
    s.run(cycles=3)
    assert s.job("j").status in ("reserved", "running")
    assert s.job("j").placement[0].node_id == "warm"


def test_require_with_no_node_holding_the_data_stages_somewhere() -> None:
    """Nobody holds it yet: someone has to stage it, so `require` does not wait for a cache nobody fills."""
    s = Sim()
    s.node("n0")
    s.submit("j", gpus_per_rank=1, datasets=(IMAGENET,), locality="require")
    assert reserved(s.decide(), "j") is not None


def test_require_lifted_while_the_warm_nodes_could_never_hold_the_gang() -> None:
    s = Sim()
    s.node("n0")
    s.node("n1")
    cache(s, "n0", IMAGENET)  # one warm node, a 2-node gang: it would wait forever
    s.submit("gang", ranks=2, gpus_per_rank=8, datasets=(IMAGENET,), locality="require")
    g = reserved(s.decide(), "gang")
    assert g is not None and sorted(r.node_id for r in g.ranks) == ["n0", "n1"]


def test_require_uses_only_nodes_holding_every_dataset() -> None:
    s = Sim()
    s.node("one")
    s.node("both")
    cache(s, "one", IMAGENET)
    cache(s, "both", IMAGENET, TOKENS)
    s.submit("big", gpus_per_rank=8)
    s.run()
    busy = s.job("big").placement[0].node_id
    s.submit("j", gpus_per_rank=1, datasets=(IMAGENET, TOKENS), locality="require")
    g = reserved(s.decide(), "j")
    if busy == "both":
        w = s.job("j").waiting
        assert g is None and w is not None and "cached only on both" in w.message
    else:
        assert g is not None and g.ranks[0].node_id == "both"


# --- the property: the preference never costs topology quality or gang wholeness -----------------------------


def _index(cluster: list[dict[str, Any]], levels: tuple[str, ...], taken: list[int]) -> tuple[FreeIndex, dict[str, Any]]:
    s = Sim(levels=levels)
    for n in cluster:
        s.node(n["node_id"], gpus=n["gpus"], model=n["model"], memory_mib=n["memory_mib"], labels=n["labels"],
               links=n["links"])
    topo = build_topology(s.state.nodes.values(), levels)
    free = {}
    for n, k in zip(cluster, taken + [0] * len(cluster), strict=False):
        free[n["node_id"]] = tuple(range(min(k, n["gpus"]), n["gpus"]))
    links = {n["node_id"]: n["links"] for n in cluster}
    return FreeIndex(topo, ANY_GPU, free, None), links


@PROFILE
@given(cluster=nodes(), levels=LEVELS, data=st.data())
def test_warm_preference_keeps_topology_quality_and_whole_gangs(cluster: list[dict[str, Any]],
                                                                 levels: tuple[str, ...], data: Any) -> None:
    taken = data.draw(st.lists(st.integers(0, 8), max_size=len(cluster)))
    index, links = _index(cluster, levels, taken)
    ids = [n["node_id"] for n in cluster]
    warm = data.draw(st.lists(st.sampled_from(ids), unique=True, max_size=len(ids)))
    counts = tuple(sorted((n, data.draw(st.integers(1, 3))) for n in warm))
    g = data.draw(st.sampled_from([1, 2, 4, 8]))
    ranks = data.draw(st.integers(1, 6))
    level = data.draw(st.sampled_from([None, NODE, CLUSTER, *levels]))
    required = level is not None and data.draw(st.booleans())
    cold_req = GangRequest("j", ranks, g, ANY_GPU, level, required)
    warm_req = cold_req._replace(warm=counts)

    def links_of(node: str) -> Any:
        return links[node]

    cold = place_gang(cold_req, index.copy(), links_of)
    hot = place_gang(warm_req, index.copy(), links_of)
    assert (cold is None) == (hot is None)  # a score, never a constraint
    if hot is None or cold is None:
        return
    # Gang wholeness: every rank once, in order, each with its GPUs, all free and none twice.
    assert [r.rank for r in hot.ranks] == list(range(ranks))
    seen: set[tuple[str, int]] = set()
    for r in hot.ranks:
        assert len(r.gpus) == g
        for gpu in r.gpus:
            assert gpu in index.free[r.node_id]
            assert (r.node_id, gpu) not in seen
            seen.add((r.node_id, gpu))
    # Topology quality: the smallest domain holding the whole gang is no coarser, no more nodes, links no worse.
    def depth(p: Any) -> int:
        used = {r.node_id for r in p.ranks}
        if len(used) == 1:
            return len(index.topo.levels) + 1
        return max(d for d in range(len(index.topo.levels) + 1) if len({index.topo.paths[n][d] for n in used}) == 1)

    assert depth(hot) >= depth(cold)
    assert len({r.node_id for r in hot.ranks}) <= len({r.node_id for r in cold.ranks})

    def score(p: Any) -> int:
        per: dict[str, list[int]] = {}
        for r in p.ranks:
            per.setdefault(r.node_id, []).extend(r.gpus)
        return sum(set_score(links[n], tuple(sorted(gs))) for n, gs in per.items())

    assert score(hot) >= score(cold)

    def idle_broken(p: Any) -> int:  # idle nodes (all of the widest node's GPUs free) it takes part of
        width = max((n["gpus"] for n in cluster), default=0)
        taken: dict[str, int] = {}
        for r in p.ranks:
            taken[r.node_id] = taken.get(r.node_id, 0) + len(r.gpus)
        return sum(1 for n, k in taken.items() if len(index.free[n]) == width and 0 < k < width)

    assert idle_broken(hot) <= idle_broken(cold)
    # And it is at least as warm.
    heat = dict(counts)
    assert sum(heat.get(n, 0) for n in {r.node_id for r in hot.ranks}) >= sum(
        heat.get(n, 0) for n in {r.node_id for r in cold.ranks})


@PROFILE
@given(cluster=nodes(), levels=LEVELS, data=st.data())
def test_require_places_only_on_the_nodes_it_names(cluster: list[dict[str, Any]], levels: tuple[str, ...],
                                                     data: Any) -> None:
    index, links = _index(cluster, levels, data.draw(st.lists(st.integers(0, 8), max_size=len(cluster))))
    ids = [n["node_id"] for n in cluster]
    only = frozenset(data.draw(st.lists(st.sampled_from(ids), unique=True, min_size=1, max_size=len(ids))))
    req = GangRequest("j", data.draw(st.integers(1, 4)), data.draw(st.sampled_from([1, 2, 8])), ANY_GPU, only=only)
    p = place_gang(req, index, lambda n: links[n])
    if p is not None:
        assert {r.node_id for r in p.ranks} <= only
        assert [r.rank for r in p.ranks] == list(range(req.ranks))


def test_require_without_a_reservation_waits_with_the_locality_reason() -> None:
    s = Sim(policies=replace(DEFAULT_POLICIES, reservations=0))
    s.node("warm")
    s.node("cold")
    cache(s, "warm", IMAGENET)
    s.submit("big", gpus_per_rank=8)
    s.run()
    s.submit("j", gpus_per_rank=2, datasets=(IMAGENET,), locality="require")
    events = s.decide()
    assert reserved(events, "j") is None
    w = waiting(events, "j")
    assert w is not None and w.code == LOCALITY
    assert w.message == ("locality require: datasets imagenet are cached only on warm, which have no room for 2 GPUs "
                         "(the most free there: 0); 8 free on nodes without them are not used")


POOL = (IMAGENET, TOKENS, Dataset(name="books", source="s3://bucket/books.tar", mount="/data/books"))


@PROFILE
@given(cluster=nodes(), levels=LEVELS, data=st.data())
def test_decide_with_warm_caches_keeps_every_invariant_and_require(cluster: list[dict[str, Any]],
                                                                    levels: tuple[str, ...], data: Any) -> None:
    """Through decide: caches on random nodes, jobs with datasets (prefer and require) among plain ones, agents
    starting and finishing them; no decision is void (the harness checks), gangs stay whole and GPUs single-owned
    (test_properties' invariants), and a `require` job runs only on nodes holding all its datasets -- unless no
    such node set could ever hold it."""
    s = build(cluster, [], levels)
    ids = [n["node_id"] for n in cluster]
    for nid in ids:
        held = data.draw(st.lists(st.sampled_from(POOL), unique=True, max_size=3))
        if held:
            cache(s, nid, *held)
    holders = {d.key: {n for n in ids if d.key in s.state.nodes[n].datasets} for d in POOL}
    required: dict[str, frozenset[str]] = {}
    for i in range(data.draw(st.integers(1, 12))):
        ds = tuple(data.draw(st.lists(st.sampled_from(POOL), unique=True, max_size=2)))
        loc = data.draw(st.sampled_from(["prefer", "require"])) if ds else "prefer"
        extra: dict[str, Any] = {"datasets": ds, "locality": loc} if ds else {}
        s.submit(f"j{i}", ranks=data.draw(st.integers(1, 3)), gpus_per_rank=data.draw(st.sampled_from([1, 2, 8])),
                 **extra)
        if loc == "require":
            required[f"j{i}"] = frozenset.intersection(*(frozenset(holders[d.key]) for d in ds))
    for _ in range(data.draw(st.integers(1, 6))):
        s.decide()
        play_agents(s)
        check_invariants(s.state)
        for jid, only in required.items():
            job = s.state.jobs[jid]
            if job.placement and only:
                used = {rp.node_id for rp in job.placement}
                could = sum(s.state.nodes[n].inventory.gpu_count // job.spec.gpus_per_rank for n in only)
                assert used <= only or could < job.spec.ranks, (jid, used, only)
        done = [j for j in s.state.active if s.state.jobs[j].status == "running"]
        if done:
            s.finish(data.draw(st.sampled_from(sorted(done))))
        s.tick(10)
