"""`corral queue apply FILE`: the queues a YAML file declares, made so in the log (like `kubectl apply`).

Each queue of the file that is new or differs from the log's definition gets
a QueueDefined (parents before children); one that already matches gets
nothing. With `--prune` every defined queue the file does not name gets a
QueueDeleted, unless jobs still wait in it or hold its GPUs (then nothing is
appended and the error names them). The whole file is checked before the
first append: a bad file changes nothing.

    queues:                      # or the list alone
      - {name: org, weight: 1}
      - {name: research, weight: 2, guaranteed_gpus: 8, limit_gpus: 32, parent: org}

`guarantee` and `limit` are accepted for `guaranteed_gpus` and `limit_gpus`
(the flags of `corral queue set`); `limit_gpus: null` or absent is no limit.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from events.sdk import Client
from events.subjects import valid_id
from orchestrator.cli.connect import add_connection_args, connected
from orchestrator.cli.errors import NOT_FOUND, OK, USAGE, CliError
from orchestrator.cli.output import print_json
from orchestrator.cli.state_view import load_state
from orchestrator.core.model.state import HOLDING, ClusterState, Queue
from schemas.specinput import SpecInputError, load_yaml, spec_text

#: A queue file is read up to this many bytes.
MAX_QUEUE_FILE_BYTES = 1 << 20

_FIELDS = {"name": "name", "weight": "weight", "guaranteed_gpus": "guaranteed_gpus", "guarantee": "guaranteed_gpus",
           "limit_gpus": "limit_gpus", "limit": "limit_gpus", "parent": "parent"}


def parse_queue_file(path: str) -> list[Queue]:
    """The queues of the file, in its order; CliError (exit 2) listing every problem."""
    p = Path(path)
    if not p.is_file():
        raise CliError(f"no such queue file: {path}", NOT_FOUND)
    try:
        with p.open("rb") as f:
            doc = load_yaml(spec_text(f.read(MAX_QUEUE_FILE_BYTES + 1), MAX_QUEUE_FILE_BYTES, "a queue file"))
    except SpecInputError as e:
        raise CliError(f"{path}: {e}", USAGE) from None
    except OSError as e:
        raise CliError(f"cannot read queue file {path}: {e.strerror or e}", USAGE) from None
    items = doc.get("queues") if isinstance(doc, dict) and set(doc) == {"queues"} else doc
    if not isinstance(items, list):
        raise CliError(f"{path}: expected a list of queues, or a mapping with only `queues:` holding one", USAGE)
    problems: list[str] = []
    out: list[Queue] = []
    for i, item in enumerate(items):
        q = _queue(item, f"queues[{i}]", problems)
        if q is not None:
            if any(o.name == q.name for o in out):
                problems.append(f"queues[{i}]: queue {q.name} is declared twice")
            out.append(q)
    for q in out:
        if q.parent == q.name:
            problems.append(f"queue {q.name}: cannot be its own parent")
    problems += _cycles(out)
    if problems:
        raise CliError(f"{path} has {len(problems)} problem(s):\n" + "\n".join(f"  {p}" for p in problems), USAGE)
    return out


def queue_problems(q: Queue, prefix: str = "") -> list[str]:
    """What is wrong with a definition's numbers (`prefix`: how the fields are named, `--` for flags)."""
    weight, guarantee, limit = ("weight", "guarantee", "limit") if prefix else ("weight", "guaranteed_gpus",
                                                                              "limit_gpus")
    problems = []
    if not q.weight > 0:
        problems.append(f"{prefix}{weight} must be positive, got {q.weight:g}")
    if q.guaranteed_gpus < 0:
        problems.append(f"{prefix}{guarantee} must be 0 or more, got {q.guaranteed_gpus}")
    if q.limit_gpus is not None and q.limit_gpus < 0:
        problems.append(f"{prefix}{limit} must be 0 or more, got {q.limit_gpus}")
    if q.limit_gpus is not None and q.guaranteed_gpus > q.limit_gpus:
        problems.append(f"guarantee {q.guaranteed_gpus} is above limit {q.limit_gpus}")
    return problems


def _queue(item: Any, where: str, problems: list[str]) -> Queue | None:
    if not isinstance(item, dict):
        problems.append(f"{where}: expected a mapping like {{name: research, weight: 2}}")
        return None
    unknown = [str(k) for k in item if k not in _FIELDS]
    if unknown:
        problems.append(f"{where}: unknown field(s) {', '.join(unknown)}; known: {', '.join(_FIELDS)}")
    fields = {_FIELDS[k]: v for k, v in item.items() if k in _FIELDS}
    name = fields.get("name")
    if not isinstance(name, str) or not valid_id(name):
        problems.append(f"{where}.name: {name!r} is not a valid queue name (1-128 letters, digits, '_' or '-')")
        return None
    where = f"queue {name}"
    before = len(problems)
    weight = fields.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)):
        problems.append(f"{where}: weight must be a number, got {weight!r}")
    for key in ("guaranteed_gpus", "limit_gpus"):
        v = fields.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            problems.append(f"{where}: {key} must be a whole number{' or null' if key == 'limit_gpus' else ''}, "
                            f"got {v!r}")
    parent = fields.get("parent")
    if parent is not None and not valid_id(parent):
        problems.append(f"{where}: parent {parent!r} is not a valid queue name")
    if len(problems) > before:
        return None
    q = Queue(name=name, weight=float(weight), guaranteed_gpus=fields.get("guaranteed_gpus") or 0,
              limit_gpus=fields.get("limit_gpus"), parent=parent)
    problems += [f"{where}: {p}" for p in queue_problems(q)]
    return q


def _cycles(queues: list[Queue]) -> list[str]:
    parents = {q.name: q.parent for q in queues}
    out = []
    for q in queues:
        seen = [q.name]
        p = q.parent
        while p is not None and p in parents and p not in seen:
            seen.append(p)
            p = parents[p]
        if p == q.name and q.parent != q.name:
            out.append(f"queue {q.name}: parents make a cycle ({' -> '.join([*seen, q.name])})")
    return out


@dataclass
class Plan:
    """What applying the file appends, in order."""

    define: list[tuple[Queue, Queue | None]] = field(default_factory=list)  # (new, old or None)
    delete: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)


def plan(state: ClusterState, wanted: list[Queue], *, prune: bool) -> Plan:
    """The appends that make the log's queues the file's; CliError when the result would be invalid."""
    out = Plan()
    names = {q.name for q in wanted}
    remaining = names if prune else names | set(state.queues)
    problems = [f"queue {q.name}: unknown parent {q.parent!r} (not in the file{'' if prune else ' nor defined'})"
                for q in wanted if q.parent is not None and q.parent not in remaining]
    if prune:
        out.delete = [name for name in state.queues if name not in names]
        keep = {q.name for q in state.queues.values() if q.name not in out.delete}
        for name in out.delete:
            busy = [jid for jid, j in state.jobs.items()
                    if (jid in state.pending and j.spec.queue == name) or (j.status in HOLDING and j.queue == name)]
            if busy:
                problems.append(f"queue {name}: not in the file, but jobs still wait in it or hold its GPUs "
                                f"({', '.join(busy[:5])}{' ...' if len(busy) > 5 else ''}): cancel them or keep "
                                "the queue")
            children = [q.name for q in state.queues.values() if q.parent == name and q.name in keep - names]
            if children:
                problems.append(f"queue {name}: parent of {', '.join(children)}")
    if problems:
        raise CliError("queue apply refused, nothing appended:\n" + "\n".join(f"  {p}" for p in problems), USAGE)
    for q in _parents_first(wanted):
        old = state.queues.get(q.name)
        if old == q:
            out.unchanged.append(q.name)
        else:
            out.define.append((q, old))
    return out


def _parents_first(queues: list[Queue]) -> list[Queue]:
    by_name = {q.name: q for q in queues}
    out: list[Queue] = []
    done: set[str] = set()

    def visit(q: Queue) -> None:
        if q.name in done:
            return
        done.add(q.name)
        if q.parent in by_name:
            visit(by_name[q.parent])
        out.append(q)

    for q in queues:
        visit(q)
    return out


def _change(new: Queue, old: Queue | None) -> str:
    if old is None:
        return "created"
    diffs = [f"{k} {getattr(old, k)} -> {getattr(new, k)}" for k in ("weight", "guaranteed_gpus", "limit_gpus",
                                                                     "parent") if getattr(old, k) != getattr(new, k)]
    return "updated (" + ", ".join(diffs) + ")"


async def queue_apply(args: argparse.Namespace) -> int:
    wanted = parse_queue_file(args.file)
    seqs: dict[str, int] = {}
    async with connected(args) as bus:
        state = await load_state(bus)
        todo = plan(state, wanted, prune=args.prune)
        if not args.dry_run:
            client = Client(bus)
            for q, _ in todo.define:
                seqs[q.name] = await client.define_queue(q.name, weight=q.weight, guaranteed_gpus=q.guaranteed_gpus,
                                                         limit_gpus=q.limit_gpus, parent=q.parent)
            for name in reversed(todo.delete):  # (children were defined after their parents)
                seqs[name] = await client.delete_queue(name, reason=f"not in {Path(args.file).name} (queue apply "
                                                                    "--prune)")
    if args.json:
        print_json({"dry_run": args.dry_run,
                    "created": [q.name for q, old in todo.define if old is None],
                    "updated": [q.name for q, old in todo.define if old is not None],
                    "deleted": todo.delete, "unchanged": todo.unchanged, "seq": seqs})
        return OK
    verb = "would be " if args.dry_run else ""
    for q, old in todo.define:
        print(f"queue {q.name} {verb}{_change(q, old)}" + (f" (#{seqs[q.name]})" if q.name in seqs else ""))
    for name in todo.delete:
        print(f"queue {name} {verb}deleted" + (f" (#{seqs[name]})" if name in seqs else ""))
    for name in todo.unchanged:
        print(f"queue {name} unchanged")
    return OK


def register(qsub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    a = qsub.add_parser("apply", help="make the defined queues those of a YAML file",
                        description="Append QueueDefined for each queue of FILE that is new or changed (parents "
                                    "first); with --prune, QueueDeleted for each defined queue FILE does not name. "
                                    "The file is checked whole first: a bad file or a refused deletion appends "
                                    "nothing. FILE: `queues: [{name, weight, guaranteed_gpus, limit_gpus, "
                                    "parent}, ...]`.")
    add_connection_args(a)
    a.add_argument("file", help="YAML (or JSON) file of queues")
    a.add_argument("--prune", action="store_true", help="delete defined queues the file does not name (refused "
                   "while jobs wait in them or hold their GPUs)")
    a.add_argument("--dry-run", action="store_true", help="print what would change, append nothing")
    a.add_argument("--json", action="store_true")
    a.set_defaults(handler=queue_apply)
