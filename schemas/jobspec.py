"""The job specification a user submits, and its validator.

Validation collects *every* problem with its field path, so a user fixes a
spec in one round trip instead of one error at a time.
"""

from __future__ import annotations

import re
from types import MappingProxyType
from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from schemas.datasets import LOCALITIES, Dataset, Locality, dataset_problems
from schemas.specinput import SpecError, load_json, load_yaml, spec_text
from schemas.specinput import shown as _show

TopologyMode = Literal["require", "prefer"]
RestartPolicy = Literal["never", "rank", "gang"]

#: Signals a worker may ask for as its checkpoint signal.
CHECKPOINT_SIGNALS = ("SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT", "SIGHUP")

#: Hard ceilings: anything above is a typo, not a job.
MAX_RANKS = 65_536
MAX_GPUS_PER_RANK = 64
MAX_NAME_LEN = 128
#: Largest job spec file read: a spec is a few hundred bytes, and the event carrying it must fit in one
#: NATS message (1 MiB by default). Checked before parsing, so a 50 MB file is refused at once.
MAX_JOBSPEC_BYTES = 1 << 20
#: A reservation's name: one subject-safe token (it is not in a subject, but it is typed on command lines).
_RESERVATION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_NOTIFY_URL = re.compile(r"https?://[^\s]+")
MAX_NOTIFY_URL = 2048


class Topology(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Keep all ranks inside one domain of `level` (e.g. "node", "leaf")."""

    level: str
    mode: TopologyMode = "prefer"


class Mount(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    source: str
    target: str
    read_only: bool = True


class ArrayElement(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One element of a job array (`corral submit --array 0-99%8`): a job of its own, `index` in its
    CORRAL_ARRAY_INDEX, at most `limit` elements of `array_id` holding GPUs at once (0: no limit)."""

    array_id: str
    index: int
    limit: int = 0
    #: The indexes as asked ("0-99"), for `explain`.
    indexes: str = ""
    #: How many elements the array has: what a dependency on the whole array waits for (core/array_deps.py).
    #: UNSET (not written) in logs from before it existed: the elements submitted then count.
    count: int | UnsetType = UNSET


class Gates(msgspec.Struct, frozen=True, kw_only=True, gc=False, omit_defaults=True):
    """What must happen before a job may start, beyond room for it (orchestrator/core/gating.py)."""

    #: Start only once each of these jobs completed; a failed, cancelled or unknown one ends this job.
    after_ok: tuple[str, ...] = ()
    #: Start only once each of these jobs ended, however it ended.
    after_any: tuple[str, ...] = ()
    #: Job arrays (by array id), each one dependency however many elements it has: start only once every
    #: element completed (a failed, cancelled or unknown one ends this job) ...
    after_ok_arrays: tuple[str, ...] = ()
    #: ... or once every element ended, however.
    after_any_arrays: tuple[str, ...] = ()
    array: ArrayElement | None = None
    #: Submitted held (`corral submit --hold`): it waits for `corral release`.
    hold: bool = False


#: A spec without gates (what `JobSpec.gating` returns for one that has none).
NO_GATES = Gates()
#: Most jobs (or job arrays, each one dependency) one job may name in each of its dependency lists.
MAX_DEPENDENCIES = 1_000
#: Largest index of a job array.
MAX_ARRAY_INDEX = 1_000_000


class Interactive(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Rank 0 reads what its submitter's `corral run` types or pipes (README "Interactive jobs").

    The bytes never enter the log: they go over core NATS to rank 0's agent (schemas/stdin.py). Only
    a sender holding the key whose SHA-256 is `key_sha256` is heard (the `corral run` that submitted
    the job keeps the key in memory; the log, which everyone reads, holds only its hash).
    """

    #: A pseudo-terminal for rank 0 (`corral run --pty`: a shell, an editor); else a pipe whose EOF is the sender's.
    pty: bool = False
    key_sha256: str = ""


class JobSpec(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    name: str
    queue: str = "default"
    priority: int = 0
    ranks: int = 1
    gpus_per_rank: int = 1
    gpu_model: str | None = None
    min_gpu_memory_mib: int = 0
    topology: Topology | None = None
    image: str | None = None
    command: tuple[str, ...] = ()
    env: dict[str, str] = {}
    mounts: tuple[Mount, ...] = ()
    checkpoint_dir: str | None = None
    checkpoint_signal: str = "SIGUSR1"
    grace_period_s: float = 30.0
    restart_policy: RestartPolicy = "gang"
    max_restarts: int = 3
    time_limit_s: float | None = None
    preemptible: bool = True
    #: /dev/shm of each container (MiB) where the agent gives containers private IPC; None: the agent's.
    shm_size_mb: int | None = None
    #: Queue it even if no registered node could ever hold it: it waits for nodes to join instead of
    #: being rejected (`corral submit --allow-future-nodes`). UNSET when not given, like `gates`, so a spec
    #: without it encodes as before the field existed (read it through `waits_for_nodes`).
    allow_future_nodes: bool | UnsetType = UNSET
    #: Dependencies, array element, submitted held. UNSET (not written at all) for a job without any, so
    #: a log without them is byte-for-byte what it was before gates existed.
    gates: Gates | UnsetType = UNSET
    #: Where the process runtime starts each rank (an absolute path; `corral submit`/`run` put the submitter's
    #: directory here). UNSET, not None, so a spec without it encodes as before this field existed: old logs
    #: and the simulator's logs keep their bytes; unset means the agent's own directory, as it always did.
    workdir: str | UnsetType = UNSET
    #: Datasets staged onto every node of the gang before its ranks start (schemas/datasets.py). UNSET, like
    #: `gates`, so a spec without any encodes byte-for-byte as before datasets existed.
    datasets: tuple[Dataset, ...] | UnsetType = UNSET
    #: "prefer": nodes already holding the datasets win among placements of equal topology quality;
    #: "require": only such nodes. UNSET reads as "prefer".
    locality: Locality | UnsetType = UNSET
    #: Rank 0's stdin comes from its submitter (`corral run`, not `--detach`). UNSET, like `gates`, so a spec
    #: without it encodes byte-for-byte as before it existed: rank 0 reads /dev/null.
    interactive: Interactive | UnsetType = UNSET
    #: The node reservation it runs in (`--reservation`, README "Day-two controls"): only on its nodes, only
    #: over its window. UNSET, like `gates`, so a spec without one encodes as before reservations existed.
    reservation: str | UnsetType = UNSET
    #: Where the notifier POSTs a JSON note when the job ends (`--notify-url`, an http(s) URL). UNSET: none.
    notify_url: str | UnsetType = UNSET

    @property
    def reservation_name(self) -> str | None:
        """`reservation`, or None when the spec names none."""
        return self.reservation if isinstance(self.reservation, str) else None

    @property
    def notify_to(self) -> str | None:
        """`notify_url`, or None when the spec has none."""
        return self.notify_url if isinstance(self.notify_url, str) else None

    @property
    def dataset_list(self) -> tuple[Dataset, ...]:
        """`datasets`, or () when the spec has none."""
        return () if isinstance(self.datasets, UnsetType) else self.datasets

    @property
    def locality_mode(self) -> Locality:
        """`locality`, "prefer" when not written."""
        return "prefer" if isinstance(self.locality, UnsetType) else self.locality

    @property
    def working_dir(self) -> str | None:
        """`workdir`, or None when the spec has none."""
        return self.workdir if isinstance(self.workdir, str) else None

    @property
    def waits_for_nodes(self) -> bool:
        """`allow_future_nodes`, False when not written."""
        return self.allow_future_nodes is True

    @property
    def total_gpus(self) -> int:
        return self.ranks * self.gpus_per_rank

    @property
    def gating(self) -> Gates:
        return NO_GATES if isinstance(self.gates, UnsetType) else self.gates


class Problem(msgspec.Struct, frozen=True):
    """One thing wrong with an input: where (`path`) and what to do about it."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class InvalidJobSpec(SpecError):
    """A job spec that was read but is not valid: every problem, each with its field path."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems))


_FIELDS = MappingProxyType({f.name: f for f in msgspec.structs.fields(JobSpec)})


def _text_ok(v: Any, depth: int = 0) -> bool:
    """No string in `v` (walked as `_text_problems` walks it) has a lone surrogate; no paths built.

    The scheduler checks every new job's spec (policies/reject.py): most strings are ASCII, and
    building every field's path only to find nothing cost more than the rest of the check (#34).
    """
    if isinstance(v, str):
        return v.isascii() or _encodes(v)
    if depth < 8 and isinstance(v, dict):
        for k, x in v.items():
            if not (_leaf_ok(k) or _text_ok(k, depth + 1)) or not (_leaf_ok(x) or _text_ok(x, depth + 1)):
                return False
    elif depth < 8 and isinstance(v, (list, tuple)):
        for x in v:
            if not (_leaf_ok(x) or _text_ok(x, depth + 1)):
                return False
    return True


def _leaf_ok(v: Any) -> bool:
    """True for an ASCII string or a value that holds no string (a number, None): no walk needed."""
    return v.isascii() if type(v) is str else not isinstance(v, (str, dict, list, tuple))


def _encodes(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _text_problems(v: Any, path: str, out: list[Problem], depth: int = 0) -> None:
    """Strings that are not Unicode text (a lone surrogate from a "\\ud800" escape cannot go on the wire)."""
    if depth == 0 and _text_ok(v):
        return  # the common case, found without building a path for every field
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError as e:
            out.append(Problem(path, f"is not valid Unicode text (character {e.start} is a lone surrogate)"))
    elif depth < 8 and isinstance(v, dict):
        for k, x in v.items():
            _text_problems(k, f"{path}.{_key(k)}" if path else _key(k), out, depth + 1)
            _text_problems(x, f"{path}.{_key(k)}" if path else _key(k), out, depth + 1)
    elif depth < 8 and isinstance(v, (list, tuple)):
        for i, x in enumerate(v):
            _text_problems(x, f"{path}[{i}]", out, depth + 1)


def _key(k: Any) -> str:
    """A mapping key as a field path part (keys of YAML need not be strings)."""
    if isinstance(k, str):
        return k.encode("utf-8", "backslashreplace").decode("utf-8")
    return _show(k)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return (isinstance(v, (int, float))) and not isinstance(v, bool)


def _check_int(obj: dict[str, Any], key: str, lo: int, hi: int, out: list[Problem]) -> None:
    if key not in obj:
        return
    v = obj[key]
    if not _is_int(v):
        out.append(Problem(key, f"must be an integer, got {_show(v)}"))
    elif not lo <= v <= hi:
        out.append(Problem(key, f"must be between {lo} and {hi}, got {_show(v)}"))


def _check_str(obj: dict[str, Any], key: str, out: list[Problem], *, optional: bool = False) -> None:
    if key not in obj or (optional and obj[key] is None):
        return
    v = obj[key]
    if not isinstance(v, str) or not v.strip():
        out.append(Problem(key, f"must be a non-empty string, got {_show(v)}"))


def _topology_problems(t: Any, out: list[Problem]) -> None:
    if t is None:
        return
    if isinstance(t, str):  # shorthand: "node" means prefer node
        t = {"level": t}
    if not isinstance(t, dict):
        out.append(Problem("topology", "must be a mapping like {level: node, mode: require}"))
        return
    for k in t:
        if k not in ("level", "mode"):
            out.append(Problem(f"topology.{_key(k)}", "unknown field; expected level, mode"))
    if not isinstance(t.get("level"), str) or not t.get("level"):
        out.append(Problem("topology.level", "must name a topology level such as node, leaf or block"))
    if t.get("mode", "prefer") not in ("require", "prefer"):
        out.append(Problem("topology.mode", f"must be 'require' or 'prefer', got {_show(t.get('mode'))}"))


def _mount_problems(mounts: Any, out: list[Problem]) -> None:
    if not isinstance(mounts, (list, tuple)):
        out.append(Problem("mounts", "must be a list of {source, target, read_only}"))
        return
    for i, m in enumerate(mounts):
        p = f"mounts[{i}]"
        if not isinstance(m, dict):
            out.append(Problem(p, "must be a mapping with source and target"))
            continue
        for key in ("source", "target"):
            v = m.get(key)
            if not isinstance(v, str) or not v.startswith("/"):
                out.append(Problem(f"{p}.{key}", f"must be an absolute path, got {_show(v)}"))
        if "read_only" in m and not isinstance(m["read_only"], bool):
            out.append(Problem(f"{p}.read_only", "must be true or false"))
        for k in m:
            if k not in ("source", "target", "read_only"):
                out.append(Problem(f"{p}.{_key(k)}", "unknown field; expected source, target, read_only"))


def _id_list_problems(v: Any, path: str, out: list[Problem]) -> None:
    what = "job array ids" if path.endswith("_arrays") else "job ids"
    if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) and 0 < len(x) <= MAX_NAME_LEN for x in v):
        out.append(Problem(path, f"must be a list of {what}"))
    elif len(v) > MAX_DEPENDENCIES:
        out.append(Problem(path, f"must name at most {MAX_DEPENDENCIES} {what}, got {len(v)} (a job array counts as "
                                 "one dependency: name the array's id, not its elements)"))


def _gates_problems(g: Any, out: list[Problem]) -> None:
    if not isinstance(g, dict):
        out.append(Problem("gates", "must be a mapping like {after_ok: [j-1], after_any: [], hold: false}"))
        return
    known = ("after_ok", "after_any", "after_ok_arrays", "after_any_arrays", "array", "hold")
    for k in g:
        if k not in known:
            out.append(Problem(f"gates.{_key(k)}", f"unknown field; expected {', '.join(known)}"))
    for k in ("after_ok", "after_any", "after_ok_arrays", "after_any_arrays"):
        if k in g:
            _id_list_problems(g[k], f"gates.{k}", out)
    if "hold" in g and not isinstance(g["hold"], bool):
        out.append(Problem("gates.hold", "must be true or false"))
    a = g.get("array")
    if a is None:
        return
    if not isinstance(a, dict):
        out.append(Problem("gates.array", "must be a mapping {array_id, index, limit, indexes, count}"))
        return
    for k in a:
        if k not in ("array_id", "index", "limit", "indexes", "count"):
            out.append(Problem(f"gates.array.{_key(k)}",
                               "unknown field; expected array_id, index, limit, indexes, count"))
    if not isinstance(a.get("array_id"), str) or not 0 < len(a["array_id"]) <= MAX_NAME_LEN:
        out.append(Problem("gates.array.array_id", "must be the array's job id"))
    inner: list[Problem] = []
    if "index" not in a:
        inner.append(Problem("index", "is required"))
    _check_int(a, "index", 0, MAX_ARRAY_INDEX, inner)
    _check_int(a, "limit", 0, MAX_ARRAY_INDEX + 1, inner)
    _check_int(a, "count", 1, MAX_ARRAY_INDEX + 1, inner)
    if "indexes" in a and not isinstance(a["indexes"], str):
        inner.append(Problem("indexes", "must be a string such as 0-99"))
    out.extend(Problem(f"gates.array.{p.path}", p.message) for p in inner)


def _interactive_problems(v: Any, out: list[Problem]) -> None:
    if not isinstance(v, dict) or not set(v) <= {"pty", "key_sha256"}:
        out.append(Problem("interactive", "must be a mapping with pty (true/false) and key_sha256"))
        return
    if "pty" in v and not isinstance(v["pty"], bool):
        out.append(Problem("interactive.pty", "must be true or false"))
    key = v.get("key_sha256")
    if not isinstance(key, str) or not re.fullmatch(r"[0-9a-f]{64}", key):
        out.append(Problem("interactive.key_sha256", "must be 64 lowercase hex digits (a SHA-256)"))


def jobspec_problems(obj: Any) -> list[Problem]:
    """Every problem in a raw (decoded YAML/JSON) job spec; empty means valid."""
    if not isinstance(obj, dict):
        return [Problem("$", "a job spec must be a mapping of fields")]
    out: list[Problem] = []
    for key in obj:
        if key not in _FIELDS:
            out.append(Problem(_key(key), f"unknown field; known fields are {', '.join(sorted(_FIELDS))}"))
    if "name" not in obj:
        out.append(Problem("name", "is required"))
    else:
        _check_str(obj, "name", out)
        if isinstance(obj["name"], str) and len(obj["name"]) > MAX_NAME_LEN:
            out.append(Problem("name", f"must be at most {MAX_NAME_LEN} characters"))
    _check_str(obj, "queue", out)
    _check_str(obj, "gpu_model", out, optional=True)
    _check_str(obj, "image", out, optional=True)
    _check_str(obj, "checkpoint_dir", out, optional=True)
    if obj.get("workdir") is not None:
        w = obj["workdir"]
        if not isinstance(w, str) or not w.startswith("/") or "\0" in w:
            out.append(Problem("workdir", f"must be an absolute path, got {_show(w)}"))
    _check_int(obj, "priority", -1_000_000, 1_000_000, out)
    _check_int(obj, "ranks", 1, MAX_RANKS, out)
    _check_int(obj, "gpus_per_rank", 0, MAX_GPUS_PER_RANK, out)
    _check_int(obj, "min_gpu_memory_mib", 0, 10_000_000, out)
    _check_int(obj, "max_restarts", 0, 1_000, out)
    if obj.get("shm_size_mb") is not None:
        _check_int(obj, "shm_size_mb", 1, 1 << 20, out)  # up to 1 TiB
    if obj.get("gpus_per_rank") == 0 and obj.get("gpu_model") is not None:
        out.append(Problem("gpu_model", "makes no sense with gpus_per_rank: 0"))
    for key in ("grace_period_s", "time_limit_s"):
        if key in obj and obj[key] is not None:
            v = obj[key]
            if not _is_num(v) or v != v or v < 0 or v > 365 * 86400:
                out.append(Problem(key, f"must be a number of seconds between 0 and one year, got {_show(v)}"))
    if obj.get("time_limit_s") == 0:
        out.append(Problem("time_limit_s", "must be positive (omit it for no limit)"))
    if "checkpoint_signal" in obj and obj["checkpoint_signal"] not in CHECKPOINT_SIGNALS:
        out.append(
            Problem("checkpoint_signal",
                    f"must be one of {', '.join(CHECKPOINT_SIGNALS)}, got {_show(obj['checkpoint_signal'])}")
        )
    if "restart_policy" in obj and obj["restart_policy"] not in ("never", "rank", "gang"):
        out.append(Problem("restart_policy", f"must be never, rank or gang, got {_show(obj['restart_policy'])}"))
    if "preemptible" in obj and not isinstance(obj["preemptible"], bool):
        out.append(Problem("preemptible", "must be true or false"))
    if "allow_future_nodes" in obj and not isinstance(obj["allow_future_nodes"], bool):
        out.append(Problem("allow_future_nodes", "must be true or false"))
    if "command" in obj:
        c = obj["command"]
        if isinstance(c, str):
            pass  # shorthand for ["sh", "-c", c], see parse_jobspec
        elif not isinstance(c, (list, tuple)) or not all(isinstance(a, str) for a in c):
            out.append(Problem("command", "must be a list of strings or one shell string"))
    if "env" in obj:
        e = obj["env"]
        if not isinstance(e, dict):
            out.append(Problem("env", "must be a mapping of NAME: value"))
        else:
            for k, v in e.items():
                if not isinstance(k, str) or not k or "=" in k or k.startswith("CORRAL_"):
                    out.append(Problem(f"env.{_key(k)}", "must be a variable name without '=' and not starting with CORRAL_"))
                elif not isinstance(v, (str, int, float, bool)):
                    out.append(Problem(f"env.{_key(k)}", "value must be a string or number"))
                elif isinstance(v, int) and v.bit_length() > 128:
                    out.append(Problem(f"env.{_key(k)}", "is too large a number; quote it to pass it as text"))
    if "mounts" in obj:
        _mount_problems(obj["mounts"], out)
    _topology_problems(obj.get("topology"), out)
    if obj.get("datasets") is not None:
        found: list[tuple[str, str]] = []
        dataset_problems(obj["datasets"], found)
        out.extend(Problem(path, msg) for path, msg in found)
    if obj.get("locality") is not None and obj["locality"] not in LOCALITIES:
        out.append(Problem("locality", f"must be 'prefer' or 'require', got {_show(obj['locality'])}"))
    elif obj.get("locality") == "require" and not obj.get("datasets"):
        out.append(Problem("locality", "'require' needs datasets: there is nothing a node could hold"))
    if "gates" in obj:
        _gates_problems(obj["gates"], out)
    if "interactive" in obj:
        _interactive_problems(obj["interactive"], out)
    if obj.get("reservation") is not None:
        r = obj["reservation"]
        if not isinstance(r, str) or not _RESERVATION_NAME.fullmatch(r):
            out.append(Problem("reservation", f"must be a reservation name (letters, digits, '-', '_'), got {_show(r)}"))
    if obj.get("notify_url") is not None:
        u = obj["notify_url"]
        if not isinstance(u, str) or not _NOTIFY_URL.fullmatch(u) or len(u) > MAX_NOTIFY_URL:
            out.append(Problem("notify_url", f"must be an http:// or https:// URL of at most {MAX_NOTIFY_URL} "
                                             f"characters, got {_show(u)}"))
    _text_problems(obj, "", out)
    return out


def parse_jobspec(obj: Any) -> JobSpec:
    """Validated JobSpec from a decoded mapping; raises InvalidJobSpec listing every problem."""
    problems = jobspec_problems(obj)
    if problems:
        raise InvalidJobSpec(problems)
    obj = dict(obj)
    if isinstance(obj.get("command"), str):
        obj["command"] = ["sh", "-c", obj["command"]]
    if isinstance(obj.get("topology"), str):
        obj["topology"] = {"level": obj["topology"]}
    for key in ("workdir", "datasets", "locality", "reservation", "notify_url"):
        if key in obj and (obj[key] is None or obj[key] == []):  # `workdir: null` in a file: none, as if not written
            del obj[key]
    if isinstance(obj.get("env"), dict):
        obj["env"] = {k: v if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v)
                      for k, v in obj["env"].items()}
    try:
        return msgspec.convert(obj, JobSpec)
    except msgspec.ValidationError as e:  # a gap in jobspec_problems: still one clear error
        raise InvalidJobSpec([Problem("$", str(e))]) from e


def read_jobspec(data: bytes, *, json: bool = False) -> JobSpec:
    """A validated JobSpec from the bytes of a spec file (YAML, a superset of JSON; `json`: JSON only).

    Raises only SpecError: SpecInputError when the bytes are not readable spec
    text (over MAX_JOBSPEC_BYTES, not UTF-8, not YAML/JSON, past the YAML
    bounds), InvalidJobSpec listing every problem of a readable one.
    """
    text = spec_text(data, MAX_JOBSPEC_BYTES, "a job spec")
    return parse_jobspec(load_json(text) if json else load_yaml(text))
