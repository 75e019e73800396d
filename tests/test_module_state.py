"""The pure rooms hold no module-level mutable state: no caches, registries or counters behind decide's back.

A memo the core needs is a field of an object its caller owns and passes in
(core/model/memo.py: the scheduler service keeps one for its life, the simulator one
per run), so its scope and lifetime are stated where it is declared. This
reads every module of schemas/, orchestrator/core/ and orchestrator/policies/
and fails on a module-level (or class-level) dict, list or set, a call that
builds something that may change, a `functools.cache`/`lru_cache` memo, or a
`global` statement. What may stand at module level is immutable: literals,
tuples, frozensets, MappingProxyType tables, compiled patterns, type aliases,
and the few frozen values allowed by name below, each with why.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PURE = ["schemas", "orchestrator/core", "orchestrator/policies"]

#: Calls whose result cannot change: immutable containers and values, stateless codecs.
IMMUTABLE_CALLS = frozenset({
    "frozenset", "tuple", "MappingProxyType", "types.MappingProxyType", "re.compile", "TypeVar", "NewType",
    "attrgetter", "itemgetter", "operator.attrgetter", "operator.itemgetter", "math.log", "float", "int", "str",
    "msgspec.msgpack.Encoder", "msgspec.msgpack.Decoder", "msgspec.json.Encoder", "msgspec.json.Decoder",
})

#: (module, name) built by a call the rule above cannot judge, and why it holds no state.
ALLOWED: dict[tuple[str, str], str] = {
    ("schemas/codec.py", "CODEC"): "msgspec encoders/decoders and the read-only UPCASTERS table",
    ("orchestrator/policies/__init__.py", "DEFAULT_POLICIES"): "a frozen dataclass of functions and numbers",
    ("orchestrator/policies/named.py", "BASELINE"): "DEFAULT_POLICIES replaced: the same frozen dataclass",
    ("orchestrator/policies/victims.py", "PRIORITY_AND_RECLAIM"): "a PreemptionRule (NamedTuple) of functions",
    ("orchestrator/policies/las.py", "LEAST_ATTAINED_SERVICE"): "a PreemptionRule (NamedTuple) of functions",
    ("orchestrator/policies/in_queue_service.py", "IN_QUEUE_SERVICE"): "a PreemptionRule (NamedTuple) of functions",
    ("orchestrator/policies/victims.py", "STARVATION"): "a PreemptionRule (NamedTuple) of functions",
    ("orchestrator/policies/level_order.py", "service_order_key"): "a closure over a float and a tuple",
    ("schemas/jobspec.py", "NO_GATES"): "a frozen msgspec Struct of tuples, a bool and None",
}

#: Functions memoised by a cache decorator, and why that memo is no hidden state.
ALLOWED_CACHES: dict[tuple[str, str], str] = {
    ("orchestrator/policies/links.py", "best_gpu_set"): (
        "a bounded memo of a pure function of immutable values (free GPUs, count, link matrix): no entry "
        "refers to a state or a record, none can go stale, and no answer depends on it"
    ),
    ("orchestrator/policies/in_queue_service.py", "_service_rule"): (
        "one immutable PreemptionRule per (int, bool) setting, so searches' memos keyed on the rule see one "
        "record: no entry refers to a state, and an answer is the same with or without it"
    ),
    ("orchestrator/policies/victims.py", "longest_remaining_first"): (
        "one immutable PreemptionRule per loss threshold (a float), so searches' memos keyed on the rule see "
        "one record: no entry refers to a state, and an answer is the same with or without it"
    ),
}


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Call):
        return _dotted(node.func)
    return ast.unparse(node)


def _immutable(node: ast.expr) -> bool:
    """Whether a module-level value can never change (names and attributes are judged where they are bound)."""
    match node:
        case ast.Constant() | ast.Name() | ast.Attribute() | ast.Lambda():
            return True
        case ast.Subscript():  # a type alias: dict[str, int], Literal[...]
            return True
        case ast.Tuple(elts=elts):
            return all(_immutable(e) for e in elts)
        case ast.BinOp(left=left, right=right):
            return _immutable(left) and _immutable(right)
        case ast.UnaryOp(operand=operand):
            return _immutable(operand)
        case ast.Call(func=func):
            return _dotted(func) in IMMUTABLE_CALLS
    return False  # dict/list/set literals and comprehensions, and any other call


def _targets(node: ast.Assign | ast.AnnAssign | ast.AugAssign) -> list[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return [ast.unparse(t) for t in targets]


def _bindings(body: list[ast.stmt]) -> list[ast.Assign | ast.AnnAssign | ast.AugAssign]:
    """Assignments run at import, through module-level if/try blocks."""
    out: list[ast.Assign | ast.AnnAssign | ast.AugAssign] = []
    for stmt in body:
        if isinstance(stmt, ast.Assign | ast.AnnAssign | ast.AugAssign):
            out.append(stmt)
        elif isinstance(stmt, ast.If | ast.Try):
            for block in (stmt.body, stmt.orelse, *(h.body for h in getattr(stmt, "handlers", []))):
                out.extend(_bindings(block))
    return out


def module_state(path: Path, rel: str) -> list[str]:
    """Every piece of module-level mutable state in one source file, as 'line: what'."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[str] = []
    for stmt in _bindings(tree.body):
        names = _targets(stmt)
        if names == ["__all__"] or stmt.value is None:
            continue
        if isinstance(stmt, ast.AugAssign):
            found.append(f"{stmt.lineno}: {names[0]} changed at import")
        elif not _immutable(stmt.value) and not all((rel, n) in ALLOWED for n in names):
            found.append(f"{stmt.lineno}: {', '.join(names)} = {ast.unparse(stmt.value)[:60]}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found.append(f"{node.lineno}: global {', '.join(node.names)}")
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for dec in node.decorator_list:
                if _dotted(dec).split(".")[-1] in ("cache", "lru_cache") and (rel, node.name) not in ALLOWED_CACHES:
                    found.append(f"{node.lineno}: @{ast.unparse(dec)} on {node.name}")
        elif isinstance(node, ast.ClassDef):
            for stmt in node.body:  # class attributes are shared by every instance (fields are annotated)
                if (isinstance(stmt, ast.Assign) and _targets(stmt) != ["__slots__"]
                        and not _immutable(stmt.value)):
                    found.append(f"{stmt.lineno}: {node.name}.{', '.join(_targets(stmt))} = {ast.unparse(stmt.value)[:60]}")
    return found


def _pure_files() -> list[Path]:
    return [p for d in PURE for p in sorted((ROOT / d).rglob("*.py"))]


@pytest.mark.parametrize("path", _pure_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_pure_module_holds_no_mutable_state(path: Path) -> None:
    rel = str(path.relative_to(ROOT))
    found = module_state(path, rel)
    assert not found, f"{rel} holds module-level mutable state (make it an owned object's field, core/model/memo.py):\n" + \
        "\n".join(found)


def test_the_scan_finds_each_kind(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text(
        "import functools\nfrom types import MappingProxyType\n"
        "A = {}\nB: list[int] = []\nC = dict()\nD = {k: 1 for k in 'ab'}\nE = Thing()\n"
        "OK1 = frozenset({1})\nOK2 = (1, 'a')\nOK3 = MappingProxyType({'a': 1})\nOK4 = dict[str, int]\n"
        "@functools.lru_cache(maxsize=8)\ndef f(x): return x\n"
        "def g():\n    global A\n"
        "class K:\n    __slots__ = ('a',)\n    shared = []\n    field: int = 0\n"
    )
    found = module_state(src, "m.py")
    assert sorted(int(f.split(":")[0]) for f in found) == [3, 4, 5, 6, 7, 13, 15, 18], found
    assert list(ALLOWED) and all(Path(ROOT / m).exists() for m, _ in [*ALLOWED, *ALLOWED_CACHES])
