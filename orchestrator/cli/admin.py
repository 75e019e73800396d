"""Operator commands: `corral queue set`, `corral node cordon|uncordon` and `corral gpu drain|undrain`.

Both read the folded state first, so a typo in a node name is a clear
"unknown node" instead of an event nobody acts on, and `queue set` changes
only the options given (a QueueDefined replaces the whole definition, so the
others are carried over from the current one).
"""

from __future__ import annotations

import argparse
from typing import Any

from events.sdk import Client
from orchestrator.cli import queuefile
from orchestrator.cli.connect import add_connection_args, connected
from orchestrator.cli.errors import NOT_FOUND, OK, USAGE, CliError
from orchestrator.cli.listing import checked_id
from orchestrator.cli.output import print_json
from orchestrator.cli.queuefile import queue_problems
from orchestrator.cli.state_view import load_state
from orchestrator.core.model.state import ClusterState, Node, Queue
from orchestrator.core.model.usage import ancestors

NONE_WORDS = ("none", "-", "")


def _optional_int(text: str) -> int | None:
    if text.strip().lower() in NONE_WORDS:
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of GPUs or 'none', got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def merged_queue(state: ClusterState, name: str, args: argparse.Namespace) -> Queue:
    """The new definition: the given options over the current one (or the defaults)."""
    old = state.queues.get(name) or Queue(name=name)
    parent = old.parent
    if args.parent is not None:
        parent = None if args.parent.strip().lower() in NONE_WORDS else checked_id(args.parent, "parent queue")
    new = Queue(
        name=name,
        weight=old.weight if args.weight is None else args.weight,
        guaranteed_gpus=old.guaranteed_gpus if args.guarantee is None else args.guarantee,
        limit_gpus=old.limit_gpus if args.limit is ... else args.limit,
        parent=parent,
    )
    problems = queue_problems(new, "--")
    if problems:
        raise CliError(f"queue {name}: " + "; ".join(problems), USAGE)
    if new.parent is not None:
        if new.parent == name:
            raise CliError(f"queue {name} cannot be its own parent", USAGE)
        if new.parent not in state.queues:
            raise CliError(f"unknown parent queue {new.parent!r}: define it first with `corral queue set`",
                           NOT_FOUND)
        if name in ancestors(state.queues, new.parent):
            raise CliError(f"parent {new.parent} would make a cycle: {name} is already one of its ancestors", USAGE)
    return new


def _queue_dict(q: Queue) -> dict[str, Any]:
    return {"queue": q.name, "weight": q.weight, "guaranteed_gpus": q.guaranteed_gpus, "limit_gpus": q.limit_gpus,
            "parent": q.parent}


async def queue_set(args: argparse.Namespace) -> int:
    name = checked_id(args.name, "queue")
    async with connected(args) as bus:
        state = await load_state(bus)
        q = merged_queue(state, name, args)
        seq = await Client(bus).define_queue(name, weight=q.weight, guaranteed_gpus=q.guaranteed_gpus,
                                             limit_gpus=q.limit_gpus, parent=q.parent)
    if args.json:
        print_json({**_queue_dict(q), "seq": seq})
    else:
        limit = "-" if q.limit_gpus is None else q.limit_gpus
        print(f"queue {name}: weight={q.weight:g} guarantee={q.guaranteed_gpus} limit={limit} "
              f"parent={q.parent or '-'} (#{seq})")
    return OK


def known_node(state: ClusterState, node_id: str) -> Node:
    """The node the log registered as `node_id`, or a NOT_FOUND error naming the known ones."""
    node = state.nodes.get(node_id)
    if node is None:
        known = ", ".join(state.nodes) or "none registered"
        raise CliError(f"unknown node {node_id!r}; known: {known}", NOT_FOUND)
    return node


async def node_cordon(args: argparse.Namespace) -> int:
    node_id = checked_id(args.node, "node id")
    cordon = args.node_command == "cordon"
    async with connected(args) as bus:
        state = await load_state(bus)
        known_node(state, node_id)
        client = Client(bus)
        seq = await (client.cordon(node_id, reason=args.reason) if cordon else client.uncordon(node_id))
    if args.json:
        print_json({"node_id": node_id, "cordoned": cordon, "seq": seq})
    elif cordon:
        print(f"{node_id} cordoned: no new gangs are placed there; running ones continue (#{seq})")
    else:
        print(f"{node_id} uncordoned: schedulable again (#{seq})")
    return OK


def gpu_address(text: str) -> tuple[str, int]:
    """`NODE:IDX` -> (node id, GPU index); an argparse type, so a bad one is a usage error naming it."""
    node, sep, index = text.rpartition(":")
    if not sep or not node or not index.isdigit():
        raise argparse.ArgumentTypeError(f"expected NODE:IDX (e.g. dgx-07:3), got {text!r}")
    return node, int(index)


async def gpu_drain(args: argparse.Namespace) -> int:
    """`corral gpu drain|undrain NODE:IDX`: GpuUnhealthy / GpuHealthy by an operator."""
    node_id, index = args.gpu
    checked_id(node_id, "node id")
    drain = args.gpu_command == "drain"
    async with connected(args) as bus:
        state = await load_state(bus)
        node = known_node(state, node_id)
        gpus = node.inventory.gpus
        # (a GPU that fell off the bus may be gone from the inventory the agent registered since: undrain it anyway)
        if not 0 <= index < len(gpus) and (drain or index not in node.unhealthy_gpus):
            raise CliError(f"node {node_id} has GPUs 0-{len(gpus) - 1}, not {index}", NOT_FOUND)
        owners = state.owners.get(node_id, ())
        owner = owners[index] if index < len(owners) else ""
        client = Client(bus)
        uuid = gpus[index].uuid if index < len(gpus) else next(f.uuid for f in node.gpu_faults if f.index == index)
        if drain:
            seq = await client.drain_gpu(node_id, index, reason=args.reason, gpu_uuid=uuid)
        else:
            seq = await client.undrain_gpu(node_id, index, reason=args.reason, gpu_uuid=uuid)
    if args.json:
        print_json({"node_id": node_id, "gpu_index": index, "gpu_uuid": uuid, "drained": drain, "seq": seq})
    elif drain:
        hit = f"; job {owner} on it is requeued from its checkpoint" if owner else ""
        print(f"{node_id}:{index} ({uuid}) drained: no work is placed on it{hit} (#{seq})")
    else:
        print(f"{node_id}:{index} ({uuid}) undrained: takes work again (#{seq})")
    return OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("queue", help="define or change a queue", description="Queue administration.")
    qsub = p.add_subparsers(dest="queue_command", metavar="ACTION", required=True)
    s = qsub.add_parser("set", help="define a queue or change some of its settings",
                        description="Append QueueDefined. Options not given keep their current value (or the "
                                    "default for a new queue: weight 1, guarantee 0, no limit, no parent).")
    add_connection_args(s)
    s.add_argument("name", help="queue name")
    s.add_argument("--weight", type=float, help="fair-share weight (default 1)")
    s.add_argument("--guarantee", type=int, metavar="G", help="GPUs guaranteed to the queue (reclaimed by "
                   "preemption when lent out)")
    s.add_argument("--limit", type=_optional_int, default=..., metavar="L", help="most GPUs the queue may hold, "
                   "or 'none'")
    s.add_argument("--parent", metavar="P", help="parent queue (its limit covers this one), or 'none'")
    s.add_argument("--json", action="store_true")
    s.set_defaults(handler=queue_set)
    queuefile.register(qsub)

    p = sub.add_parser("node", help="cordon or uncordon a node", description="Node administration.")
    nsub = p.add_subparsers(dest="node_command", metavar="ACTION", required=True)
    for action, text in (("cordon", "place no new gangs on NODE (running ones continue)"),
                         ("uncordon", "make NODE schedulable again")):
        s = nsub.add_parser(action, help=text, description=text[0].upper() + text[1:] + ".")
        add_connection_args(s)
        s.add_argument("node", help="node id")
        if action == "cordon":
            s.add_argument("--reason", default="", help="recorded in the log")
        s.add_argument("--json", action="store_true")
        s.set_defaults(handler=node_cordon)

    p = sub.add_parser("gpu", help="drain or undrain one GPU (NODE:IDX)", description="GPU administration.")
    gsub = p.add_subparsers(dest="gpu_command", metavar="ACTION", required=True)
    for action, text in (("drain", "take GPU NODE:IDX out of service (a gang on it is requeued from its checkpoint)"),
                         ("undrain", "put GPU NODE:IDX back in service (GpuHealthy)")):
        s = gsub.add_parser(action, help=text, description=text[0].upper() + text[1:] + ".")
        add_connection_args(s)
        s.add_argument("gpu", type=gpu_address, metavar="NODE:IDX", help="node id and GPU index, e.g. dgx-07:3")
        s.add_argument("--reason", default="", help="recorded in the log")
        s.add_argument("--json", action="store_true")
        s.set_defaults(handler=gpu_drain)
