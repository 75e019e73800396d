"""`corral agent-host`: many simulated nodes in one process, for scale tests (issue #40).

Each node is a real agent (its own filtered subscription, registration, heartbeats, reports) with fake
GPUs and the simulated runtime, whose workers sleep instead of running. Run several hosts with
disjoint `--first` ranges to spread thousands of nodes over processes or machines.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

from events.bus import Bus
from nodeagent.agent import Agent, AgentConfig
from nodeagent.discovery import node_inventory
from nodeagent.host import PER_CONNECTION, connect_agents, run_agents
from nodeagent.runtime.simulated import SimulatedRuntime
from orchestrator.cli.connect import connected
from orchestrator.cli.errors import USAGE, CliError
from orchestrator.cli.timespec import seconds_arg
from orchestrator.logging import configure_logging


def host_labels(i: int, per_leaf: int, per_block: int) -> dict[str, str]:
    """Node i's place: `per_leaf` nodes to a leaf switch, `per_block` leaves to a block."""
    leaf = i // per_leaf
    return {"block": f"b{leaf // per_block}", "leaf": f"l{leaf}"}


async def run_agent_host(args: argparse.Namespace) -> int:
    from orchestrator.cli.services import archived, start_metrics, until_signalled

    for flag, value in (("--nodes", args.nodes), ("--per-connection", args.per_connection),
                        ("--gpus-per-node", args.gpus_per_node), ("--nodes-per-leaf", args.nodes_per_leaf),
                        ("--leaves-per-block", args.leaves_per_block)):
        if value < 1:
            raise CliError(f"{flag} is 1 or more, got {value}", USAGE)
    if args.first < 0 or not args.heartbeat > 0:
        raise CliError("--first is 0 or more and --heartbeat more than 0", USAGE)
    configure_logging(args.log_level)
    data = Path(args.data_dir).resolve()

    def make(bus: Bus, i: int) -> Agent:
        n = args.first + i
        node_id = f"{args.prefix}{n}"
        inventory = node_inventory(node_id, fake_gpus=args.gpus_per_node, fake_model=args.gpu_model,
                                   labels=host_labels(n, args.nodes_per_leaf, args.leaves_per_block)).inventory
        config = AgentConfig(node_id=node_id, address=args.address, data_dir=data / node_id,
                             heartbeat_s=args.heartbeat)
        # The global --archive: a node whose view is damaged reads its slice from the archive (README: Recovery).
        return Agent(bus, config, inventory, SimulatedRuntime(), history=archived(args, bus))

    def connect(k: int) -> contextlib.AbstractAsyncContextManager[Bus]:
        return connected(args, name=f"corral-agent-host-{args.prefix}{args.first}-{k}", forever=True,
                         wait_for_creator=True)

    async with contextlib.AsyncExitStack() as stack:
        agents = await connect_agents(stack, connect, args.nodes, make, per_connection=args.per_connection)
        metrics_server = await start_metrics(args, agents=agents)
        try:
            return await until_signalled(run_agents(agents))
        finally:
            if metrics_server is not None:
                await metrics_server.close()


def add_agent_host_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=64, help="simulated nodes in this process (default %(default)s)")
    p.add_argument("--first", type=int, default=0, metavar="I",
                   help="number of the first node: ids PREFIX<I>..PREFIX<I+N-1> (default %(default)s)")
    p.add_argument("--prefix", default="sim-", help="node id prefix (default %(default)s)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="fake GPUs per node (default %(default)s)")
    p.add_argument("--gpu-model", default="H100")
    p.add_argument("--nodes-per-leaf", type=int, default=16, metavar="K",
                   help="nodes to a leaf switch, label leaf=l<i> (default %(default)s)")
    p.add_argument("--leaves-per-block", type=int, default=8, metavar="K",
                   help="leaves to a block, label block=b<i> (default %(default)s)")
    p.add_argument("--heartbeat", type=seconds_arg, default=10.0, metavar="S",
                   help="each node's heartbeat interval (default %(default)s, as `corral agent`)")
    p.add_argument("--per-connection", type=int, default=PER_CONNECTION, metavar="K",
                   help="agents sharing one NATS connection (default %(default)s)")
    p.add_argument("--address", default="127.0.0.1", help="the address the nodes advertise (default %(default)s)")
    p.add_argument("--data-dir", default=".corral/agent-host", help="the nodes' state (default %(default)s)")
    p.set_defaults(handler=run_agent_host)
