"""Reading spec text a person wrote (job specs, cluster specs), bounded before and while it is parsed.

A spec file is input from anyone who may submit: it is refused early and in
one clear sentence when it is too large (checked before parsing), not UTF-8
(the byte offset is named), not YAML/JSON (line and column), nested too
deeply, or larger than `MAX_NODES` once YAML aliases are expanded (a "billion
laughs" document is a few hundred bytes that expand to 10^9 nodes in every
consumer that walks it). PyYAML and json raise a zoo of exception types on
odd input (ValueError for an integer of 5,000 digits or a 13th month,
RecursionError for deep nesting); every one of them becomes `SpecInputError`.
"""

from __future__ import annotations

import json
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

#: Deepest nesting a spec may have (a job spec needs 3 levels, a cluster spec 3).
MAX_DEPTH = 64
#: Most YAML nodes a document may have, an alias counting as the whole node it names.
MAX_NODES = 100_000


class SpecError(ValueError):
    """The one error a spec loader raises: the input is unreadable or invalid, and the message says why."""


class SpecInputError(SpecError):
    """Spec text that cannot be read as data: too large, not UTF-8, not YAML/JSON, or past a bound."""

    def __init__(self, problem: str, line: int | None = None, column: int | None = None) -> None:
        self.problem = problem
        self.line = line
        self.column = column
        where = "" if line is None else f" at line {line}" + ("" if column is None else f", column {column}")
        super().__init__(f"{problem}{where}" if ":" not in problem else problem.replace(":", f"{where}:", 1))


def spec_text(data: bytes, limit: int, what: str = "a spec") -> str:
    """`data` as text, refused when over `limit` bytes or not UTF-8 (a leading byte-order mark is allowed)."""
    if len(data) > limit:
        raise SpecInputError(f"too large: {what} may be at most {limit:,} bytes ({limit / 2**20:g} MiB)")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise SpecInputError(f"not UTF-8 text: byte 0x{data[e.start]:02x} at offset {e.start} (line {line})") \
            from None


class BoundedLoader(yaml.SafeLoader):
    """A SafeLoader that refuses documents nested deeper than MAX_DEPTH or larger than MAX_NODES expanded.

    Nodes are counted while composing (so a huge flat document stops early),
    and the alias-expanded size is checked before anything is constructed (so
    a small document of nested aliases never becomes a huge object).
    """

    max_depth = MAX_DEPTH
    max_nodes = MAX_NODES

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._composed = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
        if self._depth >= self.max_depth:
            raise yaml.MarkedYAMLError(problem=f"nested deeper than {self.max_depth} levels", problem_mark=mark)
        self._composed += 1
        if self._composed > self.max_nodes:
            raise yaml.MarkedYAMLError(problem=f"more than {self.max_nodes:,} values", problem_mark=mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> Node | None:
        node = super().compose_document()
        if node is not None:
            _check_expanded(node, self.max_nodes)
        return node


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [n for kv in node.value for n in kv]
    return []


def _check_expanded(root: Node, limit: int) -> None:
    """Refuse a node graph (aliases make it a DAG, or a cycle) whose expansion exceeds `limit` nodes."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            size = 1 + sum(sizes[id(c)] for c in _children(node))
            if size > limit:
                raise yaml.MarkedYAMLError(problem=f"more than {limit:,} values once aliases are expanded",
                                           problem_mark=node.start_mark)
            sizes[key] = size
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise yaml.MarkedYAMLError(problem="an alias refers to a node that contains it",
                                       problem_mark=node.start_mark)
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in sizes)


def load_yaml(text: str, loader: type[BoundedLoader] = BoundedLoader) -> Any:
    """The one YAML document in `text`; SpecInputError (with line and column when known) for anything wrong."""
    try:
        return yaml.load(text, Loader=loader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        problem = e.problem or e.context or "unreadable"
        raise SpecInputError(f"not valid YAML: {problem}", *_line_col(mark)) from None
    except yaml.YAMLError as e:
        raise SpecInputError(f"not valid YAML: {_one_line(e)}") from None
    except RecursionError:
        raise SpecInputError(f"not valid YAML: nested too deeply (at most {MAX_DEPTH} levels)") from None
    except Exception as e:  # PyYAML's constructors: ValueError/OverflowError/TypeError on odd scalars
        raise SpecInputError(f"not valid YAML: a value cannot be read ({_one_line(e)})") from None


def load_json(text: str) -> Any:
    """The JSON value in `text`; SpecInputError (with line and column) for anything wrong."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecInputError(f"not valid JSON: {e.msg}", e.lineno, e.colno) from None
    except RecursionError:
        raise SpecInputError("not valid JSON: nested too deeply") from None
    except ValueError as e:  # an integer of more digits than Python converts
        raise SpecInputError(f"not valid JSON: {_one_line(e)}") from None


def shown(v: Any) -> str:
    """A value a spec holds, for an error message: short, and never raising (an int of 5,000 digits has no
    decimal repr: Python refuses to make one)."""
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 128:
        return f"an integer of {v.bit_length()} bits"
    try:
        text = repr(v)
    except (ValueError, RecursionError):
        return f"a {type(v).__name__}"
    return text if len(text) <= 80 else text[:77] + "..."


def _line_col(mark: Any) -> tuple[int | None, int | None]:
    return (mark.line + 1, mark.column + 1) if mark is not None else (None, None)


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return (text[:200] + "...") if len(text) > 200 else text or type(e).__name__
