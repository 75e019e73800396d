"""Malformed and hostile inputs for the bad-input suite, and the checks every fold must pass.

Everything here is pure (no IO): the in-process cases feed these straight to
`schemas.decode`, `evolve` and `decide`; test_bad_input.py also publishes a
sample through a real nats-server to the running services.

Strategies are derived from msgspec's type info (so a new event type or field
is covered without touching this file), with values biased to where readers
break: ids of entities that exist next to ones that do not, integers at the
edges (negative, zero, 10^9 ranks, int64 limits), floats from -1e308 to
1e308, unknown tags, wrong types, missing and extra fields.
"""

from __future__ import annotations

import json
import random
from typing import Any

import msgspec
import msgspec.inspect as mi
from hypothesis import strategies as st

from orchestrator.core.decide import decide
from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import FREE, HOLDING, ClusterState, restore, snapshot
from schemas import EVENT_TAGS, EVENT_TYPES, Event, encode
from schemas.events import (
    CancelRequested,
    Checkpointed,
    ClusterConfigured,
    GangReserved,
    JobCompleted,
    JobSubmitted,
    JobWaiting,
    NodeCordoned,
    NodeFailed,
    NodeRecovered,
    NodeRegistered,
    PreemptionRequested,
    QueueDefined,
    RankPlacement,
    SchedulerElected,
    Unknown,
    WorkerExited,
    WorkerStarted,
)
from schemas.inventory import Gpu, Inventory
from schemas.jobspec import JobSpec

NOW = 1_800_000_000.0
EPOCH = 3
NODES = ("n0", "n1", "n2", "n3")
QUEUES = ("prod", "research")  # no "default": an unknown queue is rejected, not defaulted

# --- the cluster every in-process case starts from ------------------------------------------


def _inventory(node: str, i: int) -> Inventory:
    gpus = tuple(Gpu(index=g, uuid=f"GPU-{node}-{g}", model="H100", memory_mib=81920) for g in range(8))
    links = tuple(tuple(0 if a == b else 118 for b in range(8)) for a in range(8))
    return Inventory(gpus=gpus, links=links, labels={"block": f"b{i // 2}", "leaf": f"l{i}"})


def _fold(state: ClusterState, events: list[Event]) -> None:
    for e in events:
        evolve(state, e)


def build_base() -> ClusterState:
    """4 nodes x 8 H100 in two blocks; queues prod (limit 16) and research; jobs in every state.

    "run" runs (2x4 in prod), "res" is reserved (1x8 in research), "big" is pending (2x8 in prod,
    would pass its queue's limit), "done" completed.
    """
    s = ClusterState()
    _fold(s, [
        ClusterConfigured(event_id="cfg", occurred_at=NOW, topology_levels=("block", "leaf"), min_runtime_s=0.0),
        SchedulerElected(event_id="elect", occurred_at=NOW, epoch=EPOCH, scheduler_id="s1"),
        QueueDefined(event_id="q1", occurred_at=NOW, queue="prod", limit_gpus=16),
        QueueDefined(event_id="q2", occurred_at=NOW, queue="research", guaranteed_gpus=8),
        *(NodeRegistered(event_id=f"reg-{n}", occurred_at=NOW, node_id=n, incarnation=f"i-{n}", address="10.0.0.1",
                         inventory=_inventory(n, i)) for i, n in enumerate(NODES)),
    ])  # fmt: skip

    def submit(job_id: str, queue: str, ranks: int, gpus: int) -> JobSubmitted:
        spec = JobSpec(name=job_id, queue=queue, ranks=ranks, gpus_per_rank=gpus, command=("sleep", "1"),
                       checkpoint_dir="/ckpt")
        return JobSubmitted(event_id=f"submit:{job_id}", occurred_at=NOW, job_id=job_id, spec=spec)

    _fold(s, [submit("done", "prod", 1, 1), submit("run", "prod", 2, 4), submit("res", "research", 1, 8)])
    _fold(s, decide(s, NOW, epoch=EPOCH))  # places done, run, res
    _fold(s, [submit("big", "prod", 2, 8)])
    _fold(s, decide(s, NOW, epoch=EPOCH))  # big waits: prod's limit
    starts = [WorkerStarted(event_id=f"ws-{j}-{p.rank}", occurred_at=NOW, job_id=j, attempt=1, rank=p.rank,
                            node_id=p.node_id) for j in ("done", "run") for p in s.jobs[j].placement]
    _fold(s, starts)
    _fold(s, decide(s, NOW + 1, epoch=EPOCH))  # JobRunning
    _fold(s, [WorkerExited(event_id="we-done", occurred_at=NOW, job_id="done", attempt=1, rank=0,
                           node_id=s.jobs["done"].placement[0].node_id, exit_code=0)])
    _fold(s, decide(s, NOW + 2, epoch=EPOCH))  # JobCompleted
    got = {j: s.jobs[j].status for j in s.jobs}
    assert got == {"done": "completed", "run": "running", "res": "reserved", "big": "pending"}, got
    return s


BASE = build_base()
BASE_BYTES = snapshot(BASE)
JOBS = tuple(BASE.jobs)
INCARNATIONS = tuple(n.incarnation for n in BASE.nodes.values())


def fresh() -> ClusterState:
    """An independent copy of the base state (decoded from bytes: nothing shared with BASE)."""
    return restore(BASE_BYTES)


# --- checks -------------------------------------------------------------------------------------


def normalized(state: ClusterState, like: ClusterState) -> bytes:
    """The snapshot with the fields garbage may legitimately touch (position, counters) taken from `like`."""
    s = restore(snapshot(state))
    s.seq, s.unknown_events, s.voids, s.last_void = like.seq, like.unknown_events, like.voids, like.last_void
    s.refused_events = like.refused_events  # an event off its subject (#39): counted, folded as no change
    s.alloc_rev, s.nodes_rev = like.alloc_rev, like.nodes_rev  # "may have changed" counters: any event moves them
    return snapshot(s)


def structure_problems(s: ClusterState) -> list[str]:
    """Invariants 1 and 2 on one state, plus the owner table agreeing with the live gangs."""
    out: list[str] = []
    seen: dict[tuple[str, int], str] = {}
    for job_id in s.active:
        job = s.jobs[job_id]
        if job.status not in HOLDING:
            out.append(f"{job_id} active but {job.status}")
        if sorted(p.rank for p in job.placement) != list(range(job.spec.ranks)):
            out.append(f"{job_id}: partial gang {[p.rank for p in job.placement]} of {job.spec.ranks}")
        for p in job.placement:
            for g in p.gpus:
                other = seen.setdefault((p.node_id, g), job_id)
                if other != job_id:
                    out.append(f"GPU {p.node_id}/{g} in {other} and {job_id}")
    for node_id, owners in s.owners.items():
        node = s.nodes.get(node_id)
        if node is None or len(owners) != node.inventory.gpu_count:
            out.append(f"owners of {node_id} do not match its inventory")
        for g, owner in enumerate(owners):
            if owner != FREE and seen.get((node_id, g)) != owner:
                out.append(f"GPU {node_id}/{g} owned by {owner}, which does not hold it")
    return out


#: Decide long after the nodes joined: the core rejects nothing on capacity while a cluster is still
#: growing (orchestrator/core/model/facts.py SETTLE_S).
LATER = NOW + 3600


def fold_and_decide(state: ClusterState, event: Any, now: float = LATER) -> list[Event]:
    """Fold one (possibly hostile) event, check the state, decide, fold the decisions, check again."""
    evolve(state, event, state.seq + 1)
    assert not structure_problems(state), structure_problems(state)
    decisions = decide(state, now, epoch=max(state.epoch, EPOCH))
    for d in decisions:
        evolve(state, d, state.seq + 1)
    assert not structure_problems(state), structure_problems(state)
    return decisions


# --- strategies ----------------------------------------------------------------------------------

EDGE_INTS = st.sampled_from([0, 1, 2, 3, 4, 7, 8, 9, 64, 65, 65_536, 65_537, 10**9, -1, -2, -(10**9), 2**31,
                             2**63 - 1, -(2**63)]) | st.integers(-3, 12)  # fmt: skip
EDGE_FLOATS = st.sampled_from([0.0, -0.0, -1.0, 1e-9, 0.5, 30.0, NOW, NOW + 1e6, 1e308, -1e308, 5e-324]) | st.floats(
    allow_nan=False, allow_infinity=False)
TEXT = st.text(max_size=12)
ID_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789-_"
ID_LIKE = st.text(alphabet=ID_CHARS, min_size=1, max_size=10)


def _ids(known: tuple[str, ...]) -> st.SearchStrategy[str]:
    return st.sampled_from(known) | ID_LIKE | st.sampled_from(["", " ", "a.b", "*", ">", "x" * 200])


JOB_IDS = _ids(JOBS)
NODE_IDS = _ids(NODES)
QUEUE_NAMES = _ids((*QUEUES, "default"))
LEVELS = st.sampled_from(["node", "leaf", "block", "rack", "", "NODE", "cluster"]) | TEXT

#: Values by field name, where a name says more than its type.
BY_NAME: dict[str, st.SearchStrategy[Any]] = {
    "job_id": JOB_IDS, "preemptor_job_id": JOB_IDS, "node_id": NODE_IDS, "queue": QUEUE_NAMES,
    "parent": st.none() | QUEUE_NAMES, "incarnation": st.sampled_from(INCARNATIONS) | TEXT,
    "epoch": st.sampled_from([0, EPOCH - 1, EPOCH, EPOCH + 1]) | EDGE_INTS,
    "attempt": st.sampled_from([1, 2]) | EDGE_INTS, "rank": st.sampled_from([0, 1]) | EDGE_INTS,
    "level": LEVELS, "topology_levels": st.lists(LEVELS, max_size=4).map(tuple),
    "occurred_at": EDGE_FLOATS, "event_id": TEXT.filter(lambda t: bool(t.strip())) | st.just("x"),
}  # fmt: skip


def value(t: mi.Type, name: str = "") -> st.SearchStrategy[Any]:
    """A strategy for msgspec type `t`, hostile within the type (decodable, not necessarily sane)."""
    if name in BY_NAME:
        return BY_NAME[name]
    match t:
        case mi.StructType():
            return st.builds(t.cls, **{f.name: value(f.type, f.name) for f in t.fields})
        case mi.StrType():
            return TEXT
        case mi.BoolType():
            return st.booleans()
        case mi.IntType():
            return EDGE_INTS
        case mi.FloatType():
            return EDGE_FLOATS
        case mi.NoneType():
            return st.none()
        case mi.LiteralType():
            return st.sampled_from(t.values)
        case mi.UnionType():
            return st.one_of(*(value(x, name) for x in t.types))
        case mi.VarTupleType() | mi.ListType():
            return st.lists(value(t.item_type), max_size=4).map(tuple if isinstance(t, mi.VarTupleType) else list)
        case mi.TupleType():
            return st.tuples(*(value(x) for x in t.item_types))
        case mi.DictType():
            return st.dictionaries(value(t.key_type), value(t.value_type), max_size=3)
        case mi.BytesType():
            return st.binary(max_size=8)
    raise NotImplementedError(f"no strategy for {t!r}: extend tests/faults/badinput.py")


#: Every event type, each field hostile-but-typed. (Inventories are kept small: 0-4 GPUs.)
EVENTS: st.SearchStrategy[Event] = st.one_of(*(value(mi.type_info(cls)) for cls in EVENT_TYPES))

_SCALAR = st.none() | st.booleans() | EDGE_INTS | EDGE_FLOATS | TEXT
JSON = st.recursive(
    _SCALAR, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4), max_leaves=8)
TAGS = st.sampled_from([*EVENT_TAGS, "JobSubmitted.v0", "Unknown", "", "jobsubmitted"]) | TEXT
FIELD_NAMES = st.sampled_from(sorted({f.name for c in EVENT_TYPES for f in msgspec.structs.fields(c)})) | TEXT


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A real event's JSON with one thing wrong: a field's type, a missing field, an extra one, the tag."""
    event = draw(EVENTS)
    d = json.loads(encode(event))
    how = draw(st.sampled_from(["retype", "drop", "extra", "tag", "nest"]))
    keys = sorted(d)
    if how == "retype":
        d[draw(st.sampled_from(keys))] = draw(JSON)
    elif how == "drop":
        d.pop(draw(st.sampled_from(keys)))
    elif how == "extra":
        d[draw(FIELD_NAMES)] = draw(JSON)
    elif how == "tag":
        d["type"] = draw(TAGS)
    else:
        d = {"type": d["type"], "payload": d}
    return json.dumps(d).encode()


_BYTES = st.binary(max_size=256)
_JSON_BYTES = JSON.map(lambda v: json.dumps(v).encode())

#: Bytes no reader should choke on: random bytes, random JSON, tagged dicts of random fields, mutations
#: (weighted by repetition towards the cheap kinds, so 4,000 cases cost seconds, not a minute).
GARBAGE: st.SearchStrategy[bytes] = st.one_of(
    _BYTES, _BYTES, _BYTES, _JSON_BYTES, _JSON_BYTES,
    st.tuples(st.dictionaries(FIELD_NAMES, _SCALAR | st.lists(_SCALAR, max_size=3), max_size=5), TAGS).map(
        lambda p: json.dumps({**p[0], "type": p[1]}).encode()),
    mutated(),
)

#: Events about jobs and nodes the base state never saw (ids that cannot collide with JOBS/NODES).
_NOBODY = {"job_id": ID_LIKE.map(lambda i: f"zz-{i}"), "preemptor_job_id": JOB_IDS,
           "node_id": ID_LIKE.map(lambda i: f"zz-{i}")}
NOBODY_EVENTS: st.SearchStrategy[Event] = st.one_of(*(
    st.builds(cls, **{f.name: _NOBODY[f.name] if f.name in _NOBODY else value(f.type, f.name)
                    for f in mi.type_info(cls).fields})
    for cls in EVENT_TYPES
    if cls not in (JobSubmitted, NodeRegistered, QueueDefined, ClusterConfigured, SchedulerElected)
    and any(f.name in ("job_id", "node_id") for f in mi.type_info(cls).fields)
))


# --- a deterministic sample for the end-to-end test (publishing is slow; hypothesis covers breadth) ---

_NOBODY_TEMPLATES: tuple[Event, ...] = (
    WorkerStarted(event_id="t", occurred_at=NOW, job_id="zz", attempt=1, rank=0, node_id="n0"),
    WorkerExited(event_id="t", occurred_at=NOW, job_id="zz", attempt=1, rank=0, node_id="n0", exit_code=1),
    GangReserved(event_id="t", occurred_at=NOW, job_id="zz", attempt=1, epoch=10**6,
                 ranks=(RankPlacement(rank=0, node_id="n0", gpus=(0, 1)),)),
    JobCompleted(event_id="t", occurred_at=NOW, job_id="zz", attempt=1),
    CancelRequested(event_id="t", occurred_at=NOW, job_id="zz"),
    Checkpointed(event_id="t", occurred_at=NOW, job_id="zz", attempt=1, rank=0, step=10**9, path="/etc/passwd"),
    PreemptionRequested(event_id="t", occurred_at=NOW, job_id="zz", attempt=1, preemptor_job_id="zz2", reason="",
                        grace_s=-1.0),
    NodeFailed(event_id="t", occurred_at=NOW, node_id="zz", incarnation="x"),
    NodeRecovered(event_id="t", occurred_at=NOW, node_id="zz", incarnation="x"),
    NodeCordoned(event_id="t", occurred_at=NOW, node_id="zz"),
    JobWaiting(event_id="t", occurred_at=NOW, job_id="zz", code="x", message="y", epoch=10**6),
)


def _random_json(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(7 if depth < 3 else 4)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([0, -1, 1, 2**63 - 1, -(2**63), 10**9, rng.randrange(-100, 100)])
    if kind == 2:
        return rng.choice([0.5, -1e308, 1e308, NOW, -0.0])
    if kind == 3:
        return "".join(rng.choice("ab.*> \u00e9\x00{}\"") for _ in range(rng.randrange(6)))
    if kind == 4:
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    keys = [*rng.sample(sorted(EVENT_TAGS), 1), "type", "job_id", "spec", "ranks", "x"]
    return {rng.choice(keys): _random_json(rng, depth + 1) for _ in range(rng.randrange(5))}


def server_garbage(rng: random.Random, n: int) -> list[bytes]:
    """`n` payloads that must fold to no change: undecodable ones, and events about nobody."""
    from schemas import decode

    out: list[bytes] = []
    while len(out) < n:
        kind = rng.randrange(5)
        if kind == 0:
            raw = rng.randbytes(rng.randrange(1, 300))
        elif kind == 1:
            raw = json.dumps(_random_json(rng)).encode()
        elif kind == 2:  # a known tag, fields of the wrong type or missing
            d = json.loads(encode(rng.choice(_NOBODY_TEMPLATES)))
            key = rng.choice(sorted(d))
            if rng.random() < 0.5:
                del d[key]
            else:
                d[key] = _random_json(rng, 2) if key != "type" else rng.choice(["Nope", "", "jobsubmitted", 7])
            raw = json.dumps(d).encode()
        else:  # well-formed, about a job or node that never existed
            e = rng.choice(_NOBODY_TEMPLATES)
            ids = {k: f"zz-{rng.randrange(10**6)}" for k in ("job_id", "node_id") if hasattr(e, k)}
            raw = encode(msgspec.structs.replace(e, event_id=f"g{len(out)}", **ids))
        event = decode(raw)
        if isinstance(event, Unknown) or str(getattr(event, "job_id", getattr(event, "node_id", ""))).startswith("zz"):
            out.append(raw)
    return out
