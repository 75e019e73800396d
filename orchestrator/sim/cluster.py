"""The simulated cluster, from a small YAML spec, as the events that set it up in the log.

    nodes: 352               # or groups: [{count: 300, gpu_model: H100}, {count: 52, gpus_per_node: 4}]
    gpus_per_node: 8
    gpu_model: H100
    gpu_memory_mib: 81920
    topology:                # coarse to fine; size = children per domain (the finest: nodes)
      - {level: block, size: 4}
      - {level: leaf, size: 8}
    queues:
      - {name: team-a, weight: 2, guaranteed_gpus: 256, limit_gpus: 1024}
    fairshare_half_life_s: 0
    min_runtime_s: 600
    default_queue: default

The setup is what a real cluster would put in its log -- ClusterConfigured,
SchedulerElected, QueueDefined, NodeRegistered -- so a simulated log folds
like a production one. Errors carry the YAML line they are about.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple, cast

import yaml

from schemas.events import ClusterConfigured, Event, NodeRegistered, QueueDefined, SchedulerElected
from schemas.inventory import Gpu, Inventory
from schemas.specinput import BoundedLoader, SpecInputError, load_yaml, shown, spec_text

KNOWN_KEYS = (
    "nodes", "gpus_per_node", "gpu_model", "gpu_memory_mib", "topology", "queues",
    "fairshare_half_life_s", "min_runtime_s", "default_queue",
)
GROUP_KEYS = ("count", "gpus_per_node", "gpu_model", "gpu_memory_mib")
LEVEL_KEYS = ("level", "size")
QUEUE_KEYS = ("name", "weight", "guaranteed_gpus", "limit_gpus", "parent")

#: The scheduler epoch every simulation runs under.
EPOCH = 1
#: Largest cluster spec file read (checked before parsing): a spec of a 100,000-node cluster is a few KiB.
MAX_CLUSTER_SPEC_BYTES = 1 << 20


class ClusterSpecError(ValueError):
    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


class NodeGroup(NamedTuple):
    #: How many nodes of this kind (`count` in the YAML).
    nodes: int
    gpus_per_node: int = 8
    gpu_model: str = "H100"
    gpu_memory_mib: int = 81920


class Level(NamedTuple):
    name: str
    #: Child domains per domain; at the finest level, nodes per domain.
    size: int


class QueueSpec(NamedTuple):
    name: str
    weight: float = 1.0
    guaranteed_gpus: int = 0
    limit_gpus: int | None = None
    parent: str | None = None


class ClusterSpec(NamedTuple):
    groups: tuple[NodeGroup, ...]
    levels: tuple[Level, ...] = ()
    queues: tuple[QueueSpec, ...] = ()
    fairshare_half_life_s: float = 0.0
    min_runtime_s: float = 600.0
    default_queue: str = "default"

    @property
    def node_count(self) -> int:
        return sum(g.nodes for g in self.groups)

    @property
    def total_gpus(self) -> int:
        return sum(g.nodes * g.gpus_per_node for g in self.groups)

    @property
    def gpus_per_node(self) -> int:
        """The largest node: gangs above it are split into ranks of this many GPUs."""
        return max((g.gpus_per_node for g in self.groups), default=0)

    @property
    def level_names(self) -> tuple[str, ...]:
        return tuple(lv.name for lv in self.levels)


def node_id(i: int) -> str:
    return f"n{i:04d}"


def node_labels(i: int, levels: tuple[Level, ...]) -> dict[str, str]:
    """Domain labels of node `i`: consecutive nodes share the finest domain, and so on up."""
    labels: dict[str, str] = {}
    span = 1
    for lv in reversed(levels):
        span *= lv.size
        labels[lv.name] = f"{lv.name[0]}{i // span}"
    return dict(reversed(labels.items()))


def inventory_of(i: int, group: NodeGroup, levels: tuple[Level, ...]) -> Inventory:
    nid = node_id(i)
    gpus = tuple(
        Gpu(index=g, uuid=f"GPU-{nid}-{g}", model=group.gpu_model, memory_mib=group.gpu_memory_mib)
        for g in range(group.gpus_per_node)
    )
    return Inventory(gpus=gpus, labels=node_labels(i, levels))


def registrations(spec: ClusterSpec, at: float = 0.0) -> list[NodeRegistered]:
    out = []
    i = 0
    for group in spec.groups:
        for _ in range(group.nodes):
            nid = node_id(i)
            out.append(NodeRegistered(event_id=f"sim:register:{nid}:1", occurred_at=at, node_id=nid, incarnation="1",
                                      address=f"10.{i // 65536}.{i // 256 % 256}.{i % 256}",
                                      inventory=inventory_of(i, group, spec.levels)))
            i += 1
    return out


def setup_events(spec: ClusterSpec, at: float = 0.0) -> list[Event]:
    """What the log holds before the first job: settings, leader, queues, nodes."""
    out: list[Event] = [
        ClusterConfigured(event_id="sim:configure", occurred_at=at, topology_levels=spec.level_names,
                          fairshare_half_life_s=spec.fairshare_half_life_s, min_runtime_s=spec.min_runtime_s,
                          default_queue=spec.default_queue),
        SchedulerElected(event_id="sim:elect", occurred_at=at, epoch=EPOCH, scheduler_id="sim"),
    ]
    out += [
        QueueDefined(event_id=f"sim:queue:{q.name}", occurred_at=at, queue=q.name, weight=q.weight,
                     guaranteed_gpus=q.guaranteed_gpus, limit_gpus=q.limit_gpus, parent=q.parent)
        for q in spec.queues
    ]
    out += registrations(spec, at)
    return out


# --- YAML with line numbers -----------------------------------------------------------


class _Map(dict[str, Any]):
    line = 0


class _Seq(list[Any]):
    line = 0


class _LineLoader(BoundedLoader):
    """Bounded like every spec loader (depth, alias expansion), and remembering each node's line."""


def _map(loader: _LineLoader, node: yaml.MappingNode) -> _Map:
    m = _Map(cast("dict[str, Any]", loader.construct_mapping(node, deep=True)))
    m.line = node.start_mark.line + 1
    return m


def _seq(loader: _LineLoader, node: yaml.SequenceNode) -> _Seq:
    s = _Seq(loader.construct_sequence(node, deep=True))
    s.line = node.start_mark.line + 1
    return s


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _map)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _seq)


class _Reader:
    """Collects every problem of one spec, each as "file:line: path: what"."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.problems: list[str] = []

    def bad(self, where: Any, path: str, what: str) -> None:
        line = getattr(where, "line", 0)
        self.problems.append(f"{self.name}:{line}: {path}: {what}" if line else f"{self.name}: {path}: {what}")

    def keys(self, m: dict[str, Any], path: str, known: tuple[str, ...]) -> None:
        for k in m:
            if k not in known:
                self.bad(m, f"{path}{k if isinstance(k, str) else shown(k)}", f"unknown key; known keys: {', '.join(known)}")

    def integer(self, m: dict[str, Any], key: str, path: str, default: int | None, lo: int) -> int | None:
        """The whole number at `key`; a bad one is reported and comes back as None (the caller says nothing more)."""
        v = m.get(key, default)
        if v is None:
            return None
        if not isinstance(v, int) or isinstance(v, bool) or v < lo:
            self.bad(m, f"{path}{key}", f"must be a whole number >= {lo}, got {shown(v)}")
            return None
        return v

    def number(self, m: dict[str, Any], key: str, path: str, default: float, *, positive: bool = False) -> float:
        v = m.get(key, default)
        f = float(v) if isinstance(v, float) or (isinstance(v, int) and v.bit_length() <= 1000) else math.nan
        if isinstance(v, bool) or not math.isfinite(f) or not (f > 0 if positive else f >= 0):
            self.bad(m, f"{path}{key}", f"must be a number {'> 0' if positive else '>= 0'}, got {shown(v)}")
            return default
        return f

    def text(self, m: dict[str, Any], key: str, path: str, default: str | None) -> str | None:
        v = m.get(key, default)
        if v is None:
            return None
        if not isinstance(v, str) or not v.strip():
            self.bad(m, f"{path}{key}", f"must be a non-empty string, got {shown(v)}")
            return default
        return v


def _whole(v: Any, fallback: int, lo: int) -> int:
    """A top-level default for the groups: a bad one is reported once, at the top level, not again per group."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= lo else fallback


def _group(r: _Reader, g: Any, path: str, top: dict[str, Any]) -> NodeGroup | None:
    if not isinstance(g, dict):
        r.bad(top, path, "must be a mapping like {count: 8, gpus_per_node: 8, gpu_model: H100}")
        return None
    r.keys(g, f"{path}.", GROUP_KEYS)
    if "count" not in g:
        r.bad(g, f"{path}.count", "is required")
        return None
    count = r.integer(g, "count", f"{path}.", None, 1)
    if count is None:
        return None
    return NodeGroup(
        nodes=count,
        gpus_per_node=r.integer(g, "gpus_per_node", f"{path}.", _whole(top.get("gpus_per_node"), 8, 1), 1) or 8,
        gpu_model=r.text(g, "gpu_model", f"{path}.", top.get("gpu_model", "H100")) or "H100",
        gpu_memory_mib=r.integer(g, "gpu_memory_mib", f"{path}.", _whole(top.get("gpu_memory_mib"), 81920, 0), 0) or 0,
    )


def _node_groups(r: _Reader, doc: dict[str, Any]) -> list[NodeGroup]:
    nodes = doc.get("nodes")
    groups: list[NodeGroup] = []
    if isinstance(nodes, (int, float)) and not isinstance(nodes, bool):
        count = r.integer(doc, "nodes", "", None, 1)
        g = _group(r, {"count": count}, "nodes", doc) if count is not None else None
        groups += [g] if g else []
    elif isinstance(nodes, list):
        for i, item in enumerate(nodes):
            g = _group(r, item, f"nodes[{i}]", doc)
            groups += [g] if g else []
        if not nodes:
            r.bad(nodes, "nodes", "lists no node group")
    elif nodes is None:
        r.bad(doc, "nodes", "is required: a node count or a list of groups")
    else:
        r.bad(doc, "nodes", f"must be a node count or a list of groups, got {shown(nodes)}")
    return groups


def _levels(r: _Reader, doc: dict[str, Any]) -> list[Level]:
    levels: list[Level] = []
    topo = doc.get("topology", [])
    if not isinstance(topo, list):
        r.bad(doc, "topology", "must be a list like [{level: block, size: 4}, {level: leaf, size: 8}]")
        return levels
    for i, lv in enumerate(topo):
        path = f"topology[{i}]"
        if not isinstance(lv, dict):
            r.bad(topo, path, "must be a mapping {level: NAME, size: N}")
            continue
        r.keys(lv, f"{path}.", LEVEL_KEYS)
        missing = [k for k in LEVEL_KEYS if k not in lv]
        if missing:
            r.bad(lv, path, f"needs both level and size (no {' or '.join(missing)})")
            continue
        lname = r.text(lv, "level", f"{path}.", None)
        size = r.integer(lv, "size", f"{path}.", None, 1)
        if lname is None or size is None:
            continue
        if lname in ("node", "cluster") or lname in [x.name for x in levels]:
            r.bad(lv, f"{path}.level", f"{lname!r} is reserved or repeated")
        else:
            levels.append(Level(lname, size))
    return levels


def _queues(r: _Reader, doc: dict[str, Any]) -> list[QueueSpec]:
    queues: list[QueueSpec] = []
    qs = doc.get("queues", [])
    if not isinstance(qs, list):
        r.bad(doc, "queues", "must be a list of {name, weight, guaranteed_gpus, limit_gpus, parent}")
        return queues
    where: dict[str, Any] = {}
    for i, q in enumerate(qs):
        path = f"queues[{i}]"
        if not isinstance(q, dict):
            r.bad(qs, path, "must be a mapping with at least a name")
            continue
        r.keys(q, f"{path}.", QUEUE_KEYS)
        qname = r.text(q, "name", f"{path}.", None)
        if qname is None:
            if "name" not in q:
                r.bad(q, f"{path}.name", "is required")
            continue
        if qname in where:
            r.bad(q, f"{path}.name", f"queue {qname!r} defined twice")
        where[qname] = (q, path)
        queues.append(QueueSpec(
            name=qname,
            weight=r.number(q, "weight", f"{path}.", 1.0, positive=True),
            guaranteed_gpus=r.integer(q, "guaranteed_gpus", f"{path}.", 0, 0) or 0,
            limit_gpus=r.integer(q, "limit_gpus", f"{path}.", None, 0),
            parent=r.text(q, "parent", f"{path}.", None),
        ))
    for q in queues:
        m, path = where[q.name]
        _queue_problems(r, q, queues, m, path)
    return queues


def _queue_problems(r: _Reader, q: QueueSpec, queues: list[QueueSpec], m: Any, path: str) -> None:
    """What `corral queue set` refuses (cli/admin.py): a guarantee above the limit, an unknown parent, a cycle."""
    if q.limit_gpus is not None and q.guaranteed_gpus > q.limit_gpus:
        r.bad(m, f"{path}.guaranteed_gpus", f"{q.guaranteed_gpus} is above the queue's limit_gpus {q.limit_gpus}")
    names = [x.name for x in queues]
    if q.parent is None:
        return
    if q.parent not in names:
        r.bad(m, f"{path}.parent", f"unknown queue {q.parent!r}")
        return
    chain = parent_chain(queues, q.name)
    # A cycle is told once, on its first queue in the file.
    if chain[-1] == q.name and q.name == min(chain, key=names.index):
        r.bad(m, f"{path}.parent", f"makes a cycle: {' -> '.join(chain)}")


def parent_chain(queues: Sequence[QueueSpec], name: str) -> list[str]:
    """`name`, its parent, the parent's parent...; ends on the first name seen twice (a cycle) or at a root."""
    parents = {q.name: q.parent for q in queues}
    chain = [name]
    while (p := parents.get(chain[-1])) is not None:
        chain.append(p)
        if p in chain[:-1]:
            break
    return chain


def parse_cluster(doc: Any, name: str = "<cluster>") -> ClusterSpec:
    r = _Reader(name)
    if not isinstance(doc, dict):
        raise ClusterSpecError([f"{name}: a cluster spec must be a mapping with at least `nodes`"])
    r.keys(doc, "", KNOWN_KEYS)
    groups = _node_groups(r, doc)
    r.integer(doc, "gpus_per_node", "", 8, 1)
    r.integer(doc, "gpu_memory_mib", "", 0, 0)
    r.text(doc, "gpu_model", "", "H100")
    spec = ClusterSpec(
        groups=tuple(groups),
        levels=tuple(_levels(r, doc)),
        queues=tuple(_queues(r, doc)),
        fairshare_half_life_s=r.number(doc, "fairshare_half_life_s", "", 0.0),
        min_runtime_s=r.number(doc, "min_runtime_s", "", 600.0),
        default_queue=r.text(doc, "default_queue", "", "default") or "default",
    )
    if r.problems:
        raise ClusterSpecError(r.problems)
    return spec


def cluster_warnings(spec: ClusterSpec) -> list[str]:
    """What the scheduler accepts but probably is not meant: guarantees the cluster cannot honour all at once.

    `corral queue set` accepts such guarantees on purpose -- a real cluster can
    grow, and the queues are often defined before the nodes join -- so here too
    it is a warning, not an error: reclaiming then gives each queue at most
    what is left.
    """
    guaranteed = sum(q.guaranteed_gpus for q in spec.queues if not _guarantee_above(spec.queues, q))
    if guaranteed > spec.total_gpus:
        return [f"the queues' guarantees add up to {guaranteed} GPUs, more than the cluster's {spec.total_gpus}: "
                f"not every queue can get its guarantee back at once"]
    return []


def _guarantee_above(queues: Sequence[QueueSpec], q: QueueSpec) -> bool:
    """Whether an ancestor of `q` has a guarantee (which then already counts `q`'s)."""
    by_name = {x.name: x for x in queues}
    return any(by_name[a].guaranteed_gpus > 0 for a in parent_chain(queues, q.name)[1:] if a in by_name)


def load_cluster(path: str | Path) -> ClusterSpec:
    """The cluster spec in a YAML file; ClusterSpecError (and nothing else) for any problem, with its line."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            data = f.read(MAX_CLUSTER_SPEC_BYTES + 1)
    except OSError as e:
        raise ClusterSpecError([f"{p}: cannot read: {e.strerror or e}"]) from None
    return read_cluster(data, str(p))


def read_cluster(data: bytes, name: str = "<cluster>") -> ClusterSpec:
    """The cluster spec in a YAML file's bytes; ClusterSpecError (and nothing else) for any problem."""
    try:
        doc = load_yaml(spec_text(data, MAX_CLUSTER_SPEC_BYTES, "a cluster spec"), _LineLoader)
    except SpecInputError as e:
        where = f"{name}:{e.line}" if e.line is not None else name
        raise ClusterSpecError([f"{where}: {e.problem}"]) from None
    return parse_cluster(doc, name)


def dump_cluster(spec: ClusterSpec) -> str:
    """The spec as YAML that `load_cluster` reads back (the generator writes its cluster with it)."""
    doc: dict[str, Any] = {}
    if len(spec.groups) == 1:
        g = spec.groups[0]
        doc.update(nodes=g.nodes, gpus_per_node=g.gpus_per_node, gpu_model=g.gpu_model, gpu_memory_mib=g.gpu_memory_mib)
    else:
        doc["nodes"] = [{"count": g.nodes, "gpus_per_node": g.gpus_per_node, "gpu_model": g.gpu_model,
                         "gpu_memory_mib": g.gpu_memory_mib} for g in spec.groups]
    doc["topology"] = [{"level": lv.name, "size": lv.size} for lv in spec.levels]
    doc["queues"] = [{k: v for k, v in q._asdict().items() if v is not None} for q in spec.queues]
    doc.update(fairshare_half_life_s=spec.fairshare_half_life_s, min_runtime_s=spec.min_runtime_s,
               default_queue=spec.default_queue)
    return yaml.safe_dump(doc, sort_keys=False)
