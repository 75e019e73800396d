"""Which nodes hold a job's datasets: what the warm-node preference and `locality: require` read (issue #33).

The fold keeps each node's cached dataset keys (`Node.datasets`, core/staging.py;
a key is `Dataset.key`: the digest when given, else a hash of the source). For a
job with datasets, `located` adds to its GangRequest

- `warm`: the nodes holding any of them, with how many -- placement prefers
  them among placements of equal topology quality (policies/placement.py);
  off with `Policies.prefer_warm` False (the simulator's comparison);
- `only`, for `locality: require`: the nodes holding all of them, the only
  ones it may use. The requirement stands only while such nodes could ever
  hold the gang (enough of their GPUs of its class, busy or not): a job
  whose datasets no node holds yet must be staged somewhere, and one that
  waited for a cache nobody fills would wait forever.

`locality_outcome` is what such a job is told while the nodes holding its
data have no room: which datasets, which nodes hold them, what is free elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.core.explain import Outcome
from orchestrator.core.model.capacity import FreeIndex
from orchestrator.core.model.state import ClusterState
from orchestrator.policies.placement import GangRequest
from schemas.jobspec import JobSpec

#: JobWaiting code of a `locality: require` job whose warm nodes have no room.
LOCALITY = "locality"

#: Nodes named in a reason before "and N more".
NAMED_NODES = 5


def dataset_keys(spec: JobSpec) -> tuple[str, ...]:
    """The cache keys of a spec's datasets, each once, in the spec's order."""
    return tuple(dict.fromkeys(d.key for d in spec.dataset_list))


def cache_index(state: ClusterState) -> dict[str, list[str]]:
    """Cache key -> the nodes holding it, in registration order (one pass over the nodes' caches)."""
    out: dict[str, list[str]] = {}
    for node in state.nodes.values():
        for key in node.datasets:
            out.setdefault(key, []).append(node.node_id)
    return out


def warm_counts(keys: tuple[str, ...], index: Mapping[str, list[str]]) -> dict[str, int]:
    """Node -> how many of `keys` it holds (nodes holding none are left out)."""
    out: dict[str, int] = {}
    for k in keys:
        for n in index.get(k, ()):
            out[n] = out.get(n, 0) + 1
    return out


def located(req: GangRequest, spec: JobSpec, state: ClusterState, index: Mapping[str, list[str]],
            eligible: Mapping[str, frozenset[int]] | None, *, prefer: bool = True) -> GangRequest:
    """`req` with its warm nodes and, for `locality: require`, the nodes it may use (module docstring)."""
    keys = dataset_keys(spec)
    if not keys:
        return req
    counts = warm_counts(keys, index)
    warm = tuple(sorted(counts.items())) if prefer else ()
    only: frozenset[str] | None = None
    if spec.locality_mode == "require":
        holders = frozenset(n for n, c in counts.items() if c == len(keys))
        if holders and _could_hold(req, holders, state, eligible):
            only = holders
    if not warm and only is None:
        return req
    return req._replace(warm=warm, only=only)


def _could_hold(req: GangRequest, nodes: frozenset[str], state: ClusterState,
                eligible: Mapping[str, frozenset[int]] | None) -> bool:
    """Whether the schedulable ones of `nodes` have ranks enough for the gang, all their GPUs of its class counted."""
    g = req.gpus_per_rank
    slots = 0
    for n in nodes:
        node = state.nodes.get(n)
        if node is None or not node.schedulable:
            continue
        if g <= 0:
            return True
        mine = eligible.get(n, frozenset()) if eligible is not None else frozenset(range(node.inventory.gpu_count))
        slots += len(mine - node.unhealthy_gpus) // g
        if slots >= req.ranks:
            return True
    return False


def locality_note(req: GangRequest, spec: JobSpec, order: Mapping[str, int]) -> str:
    """"locality require: datasets X, Y are cached only on n1, n2" (nodes in registration `order`)."""
    assert req.only is not None
    names = ", ".join(d.name for d in spec.dataset_list)
    held = sorted(req.only, key=lambda n: (order.get(n, len(order)), n))
    more = f" and {len(held) - NAMED_NODES} more" if len(held) > NAMED_NODES else ""
    return f"locality require: datasets {names} are cached only on {', '.join(held[:NAMED_NODES])}{more}"


def locality_outcome(req: GangRequest, spec: JobSpec, index: FreeIndex) -> Outcome:
    """Why a `locality: require` job waits: its datasets, the nodes holding them, the room elsewhere."""
    assert req.only is not None
    room = max((len(index.free.get(n, ())) for n in req.only), default=0)
    cold = sum(len(g) for n, g in index.free.items() if n not in req.only)
    noun = "GPU" if req.gpus == 1 else "GPUs"
    return Outcome(LOCALITY, f"{locality_note(req, spec, index.topo.order)}, which have no room for {req.gpus} "
                             f"{noun} (the most free there: {room}); {cold} free on nodes without them are not used")
