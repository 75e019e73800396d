"""The long-running commands (the services): `corral scheduler`, `corral agent`, `corral admission` (the team gateway), `corral index` and `corral up`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import structlog

from events.bus import Bus, LogGap
from events.server import NatsServer, NatsServerError
from events.swallowed_cancel import stop_if_cancelled
from nodeagent.agent import Agent, AgentConfig
from nodeagent.datasets.limits import Limits
from nodeagent.discovery import NoGpuError, node_inventory
from nodeagent.gpu_health import DEFAULT_FATAL_XIDS, DEFAULT_IGNORED_XIDS, GpuHealthWatch, HealthPolicy, parse_xids
from nodeagent.host import connect_agents, connection
from nodeagent.runtime.base import Runtime
from nodeagent.runtime.process import ProcessRuntime
from nodeagent.runtime.shim import LOG_FILES, LOG_MAX_BYTES
from nodeagent.runtime.simulated import SimulatedRuntime
from nodeagent.shutdown import REPORT_S, SHUTDOWN_GRACE_S
from orchestrator.cli.connect import connected
from orchestrator.cli.errors import FAILURE, OK, USAGE, CliError
from orchestrator.cli.notify import add_notifier_args
from orchestrator.cli.stop_signals import StopSignals
from orchestrator.cli.timespec import seconds_arg
from orchestrator.logging import configure_logging
from orchestrator.policies.named import POLICY_NAMES
from orchestrator.scheduler.service import Scheduler, SchedulerConfig, default_scheduler_id
from schemas import ClusterConfigured, Inventory
from schemas.events import DEFAULT_DRAIN_UNHEALTHY_GPUS

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from events.history import History
    from events.telemetry import MetricsServer
    from nodeagent.runtime.docker_options import DockerOptions
    from orchestrator.archiver import Archiver
    from orchestrator.cli.webui.access import Access
    from orchestrator.index.service import IndexService
    from orchestrator.notifier import Notifier

log = structlog.get_logger("corral.cli")


def cancel_on_signals(loop: asyncio.AbstractEventLoop, task: asyncio.Future[Any]) -> None:
    """SIGTERM/SIGINT cancel `task`; a stop that hangs still ends, saying where it hung (cli/hard_stop.py)."""
    armed: list[object] = []

    def stop() -> None:
        task.cancel()
        if not armed:
            from orchestrator.cli import hard_stop

            armed.append(hard_stop.arm(loop))

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)


async def until_signalled(coro: Coroutine[Any, Any, None],
                          graceful: Callable[[asyncio.Event], Awaitable[object]] | None = None,
                          grace_s: float = 0.0) -> int:
    """Run a service until it ends or SIGTERM/SIGINT arrives; a signal is a clean stop (exit 0).

    `graceful(now)`: what the first signal runs before the service is cancelled (an agent's workers checkpoint,
    nodeagent/shutdown.py), bounded by `grace_s`; a second signal sets `now` and ends it (cli/stop_signals.py).
    """
    task = asyncio.ensure_future(coro)
    loop = asyncio.get_running_loop()
    stop: StopSignals | None = None
    if graceful is None:
        cancel_on_signals(loop, task)
    else:
        stop = StopSignals(loop, cast("asyncio.Future[object]", task), grace_s, _log_stop).install()
    try:
        if stop is not None:
            asked = asyncio.ensure_future(stop.requested.wait())
            try:
                await asyncio.wait({task, asked}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                asked.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await asked
            if not task.done():
                await graceful(stop.now)
                task.cancel()
        await task
    except asyncio.CancelledError:
        # A signal cancels the service's task; this one's own cancellation (a permission refused,
        # see cli/connect.py) is no clean stop and goes on to the caller.
        current = asyncio.current_task()
        if not task.cancelled() or (current is not None and current.cancelling()):
            raise
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    return OK


def _log_stop(first: bool) -> None:
    if first:
        log.info("stopping", how="gracefully: workers checkpoint first; signal again to stop now")
    else:
        log.warning("stopping_now", how="second signal: workers still running are killed")


def parse_labels(text: str | None) -> dict[str, str]:
    """`leaf=l1,block=b0` -> {"leaf": "l1", "block": "b0"}."""
    out: dict[str, str] = {}
    for part in filter(None, (text or "").split(",")):
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise CliError(f"bad label {part!r}: expected KEY=VALUE[,KEY=VALUE...]", USAGE)
        out[key.strip()] = value.strip()
    return out


def cluster_config(args: argparse.Namespace) -> ClusterConfigured:
    levels = tuple(x for x in (args.topology_levels or "").split(",") if x)
    drain = args.drain_unhealthy_gpus
    if drain < 0:
        raise CliError(f"--drain-unhealthy-gpus must be >= 0, got {drain}", USAGE)
    suffix = f":drain{drain}" if drain != DEFAULT_DRAIN_UNHEALTHY_GPUS else ""  # (default runs keep their id)
    return ClusterConfigured(event_id=f"config:{','.join(levels)}:{args.min_runtime}{suffix}", occurred_at=0.0,
                             topology_levels=levels, min_runtime_s=args.min_runtime,
                             fairshare_half_life_s=args.half_life, drain_unhealthy_gpus=drain)


async def run_scheduler(args: argparse.Namespace) -> int:
    configure_logging(args.log_level)
    config = SchedulerConfig(scheduler_id=args.id or default_scheduler_id(), tick_s=args.tick,
                             heartbeat_timeout_s=args.heartbeat_timeout, lease_ttl_s=args.lease_ttl,
                             snapshot_every=args.snapshot_every, snapshot_interval_s=args.snapshot_interval,
                             cluster=cluster_config(args), policy=args.policy)
    async with connected(args, name=f"corral-scheduler-{config.scheduler_id}", forever=True) as bus:
        sched = Scheduler(bus, config, history=archived(args, bus))
        metrics_server = await start_metrics(args, scheduler=sched)
        try:
            return await until_signalled(sched.run())
        finally:
            if metrics_server is not None:
                await metrics_server.close()


def archived(args: argparse.Namespace, bus: Bus) -> History | None:
    """With the global `--archive PATH` (CORRAL_ARCHIVE), the archive and the stream as one log: a service that
    finds no usable snapshot or node view reads what retention moved out of the stream there."""
    from orchestrator.cli.archive import with_archive

    source = with_archive(args, bus)
    return None if source is bus else cast("History", source)


async def serve_metrics(args: argparse.Namespace, registry: CollectorRegistry) -> MetricsServer:
    """`registry` on --metrics-host:--metrics-port; a port that cannot be had is a clear error."""
    from events.telemetry import MetricsServer

    try:
        return await MetricsServer(registry, host=args.metrics_host, port=args.metrics_port).start()
    except OSError as e:
        raise CliError(f"cannot serve metrics on {args.metrics_host}:{args.metrics_port}: {e.strerror or e}",
                       FAILURE) from None


async def start_metrics(args: argparse.Namespace, *, scheduler: Scheduler | None = None,
                        agents: Sequence[Agent] = (), archiver: bool = False) -> MetricsServer | None:
    """Serve Prometheus metrics of the services of this process on --metrics-port (0: off)."""
    if not args.metrics_port:
        return None
    from events.telemetry import ServiceRegistry
    from nodeagent.metrics import watch_agents
    from orchestrator.scheduler.metrics import watch_scheduler

    # Before the services run, so their catch-up is counted too; each registers its own collectors.
    registry = ServiceRegistry([*([scheduler.bus] if scheduler is not None else []), *(a.bus for a in agents)])
    if scheduler is not None:
        watch_scheduler(registry, scheduler.follower, scheduler.heartbeat_ages,
                        lambda: (scheduler.config.scheduler_id, scheduler.leading))
        registry.require("scheduler", scheduler.cannot_lead)  # /readyz: 503 while it cannot lead (says why)
    watch_agents(registry, agents)
    if archiver:
        from orchestrator.archiver import watch_archiver

        watch_archiver(registry)
    return await serve_metrics(args, registry)


def make_runtime(kind: str, state_dir: Path, node_id: str, docker: DockerOptions | None = None,
                 log_limit: tuple[int, int] | None = None) -> Runtime:
    """`log_limit`: (bytes per file, files) of each worker's log (process runtime; None: its defaults)."""
    if kind == "process":
        if log_limit is None:
            return ProcessRuntime(state_dir / "workers", node_id=node_id, inherit_env=False)
        return ProcessRuntime(state_dir / "workers", node_id=node_id, inherit_env=False, log_max_bytes=log_limit[0],
                              log_files=log_limit[1])
    if kind == "simulated":
        return SimulatedRuntime()
    if kind == "docker":
        from nodeagent.runtime.docker import DockerRuntime

        return DockerRuntime(node_id=node_id, options=docker)
    raise CliError(f"unknown runtime {kind!r}: use process, docker or simulated", USAGE)


def docker_options(args: argparse.Namespace, inventory: Inventory) -> DockerOptions:
    """`corral agent --docker-*` as the Docker runtime's options (see nodeagent/runtime/docker_options.py).

    Real GPUs are requested by the UUIDs discovery found: this agent's NVML indices need not be
    the host's (an agent in a container given some of the host's GPUs).
    """
    from nodeagent.runtime.docker_options import DockerOptions, infiniband_devices

    try:
        devices = infiniband_devices(args.docker_infiniband)
    except (ValueError, OSError) as e:
        raise CliError(str(e), FAILURE) from None
    gpus = args.docker_gpus == "request" or (args.docker_gpus == "auto" and not args.fake_gpus)
    uuids = None if args.fake_gpus else {g.index: g.uuid for g in inventory.gpus}
    return DockerOptions(network=args.docker_network, ipc=args.docker_ipc, shm_size_mb=args.docker_shm_size,
                         infiniband_devices=devices, gpus=gpus, gpu_uuids=uuids)


def agent_inventory(args: argparse.Namespace, node_id: str) -> Inventory:
    try:
        found = node_inventory(node_id, fake_gpus=args.fake_gpus, labels=parse_labels(args.labels),
                               fake_model=args.gpu_model)
    except NoGpuError as e:
        raise CliError(str(e), FAILURE) from None
    for problem in found.problems:
        log.warning("discovery_problem", problem=str(problem))
    return found.inventory


def health_watch(args: argparse.Namespace, inventory: Inventory) -> GpuHealthWatch | None:
    """The agent's GPU health watch: the real NVML on a GPU node, the scenario-driven fake with --fake-nvml.

    Fake GPUs without --fake-nvml have none (nothing to watch); --no-health-watch turns it off.
    """
    if args.no_health_watch or (args.fake_gpus is not None and args.fake_nvml is None):
        return None
    try:
        policy = HealthPolicy(fatal_xids=parse_xids(args.xid_fatal), ignored_xids=parse_xids(args.xid_ignore))
    except ValueError as e:
        raise CliError(str(e), USAGE) from None
    nvml: Any
    if args.fake_gpus is not None:
        from nodeagent.fake_nvml import FakeNvml

        nvml = FakeNvml(args.fake_gpus, node_id=args.node_id, scenario=args.fake_nvml)
    else:
        import pynvml

        nvml = pynvml
    return GpuHealthWatch(nvml, [g.uuid for g in inventory.gpus], policy)


def add_shutdown_grace_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shutdown-grace", type=seconds_arg, default=SHUTDOWN_GRACE_S, metavar="S",
                   help="on the first SIGINT/SIGTERM, each worker gets its checkpoint signal (SIGTERM if its job is not "
                        "preemptible) and up to S seconds (or its job's grace_period_s, if less) to exit; its job is "
                        "requeued from its checkpoint, restarts unspent. A second signal kills at once "
                        "(default %(default)s)")


def add_worker_env_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--worker-env", action="append", default=[], metavar="VAR[,VAR=VALUE...]",
                   help="give every worker these variables of this environment (VAR=VALUE sets one), over what a "
                        "worker gets from its node (README: What a worker gets); repeatable")


def dataset_limits(args: argparse.Namespace) -> Limits:
    """The agent's `--dataset-*` limits as one staging's Limits (checked now: a bad value exits 2 at once)."""
    positive = {"--dataset-max-bytes": args.dataset_max_bytes, "--dataset-max-members": args.dataset_max_members,
                "--dataset-max-ratio": args.dataset_max_ratio, "--dataset-timeout": args.dataset_timeout,
                "--dataset-stall-timeout": args.dataset_stall_timeout}
    for flag, value in positive.items():
        if not value > 0:
            raise CliError(f"{flag} is more than 0, got {value}", USAGE)
    if args.dataset_memory_bytes < 0:
        raise CliError(f"--dataset-memory-bytes is 0 (no limit) or more, got {args.dataset_memory_bytes}", USAGE)
    return Limits(max_bytes=args.dataset_max_bytes, max_members=args.dataset_max_members,
                  max_ratio=args.dataset_max_ratio, timeout_s=args.dataset_timeout,
                  stall_s=args.dataset_stall_timeout, memory_bytes=args.dataset_memory_bytes)


def worker_env(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    """`--worker-env` as AgentConfig.worker_env (checked now: a bad name exits 2 before anything starts)."""
    from orchestrator.cli.submitter import named_variables

    return tuple(named_variables(args.worker_env, os.environ, "--worker-env").items())


def check_shutdown_grace(args: argparse.Namespace) -> None:
    if not args.shutdown_grace >= 0:
        raise CliError(f"--shutdown-grace is 0 or more seconds, got {args.shutdown_grace}", USAGE)


async def run_agent(args: argparse.Namespace) -> int:
    check_shutdown_grace(args)
    extra_env = worker_env(args)
    configure_logging(args.log_level)
    data_dir = Path(args.data_dir).resolve() / args.node_id
    inventory = agent_inventory(args, args.node_id)
    if args.fake_nvml is not None and args.fake_gpus is None:
        raise CliError("--fake-nvml drives the health watch of fake GPUs: give --fake-gpus N too", USAGE)
    config = AgentConfig(node_id=args.node_id, address=args.address or socket.gethostname(), data_dir=data_dir,
                         checkpoint_root=Path(args.checkpoint_root).resolve() if args.checkpoint_root else None,
                         heartbeat_s=args.heartbeat, isolated_gpus=args.runtime == "docker",
                         health_poll_s=args.health_poll, health_check=args.health_check or None,
                         health_check_interval_s=args.health_check_interval,
                         health_check_timeout_s=args.health_check_timeout,
                         worker_env=extra_env,
                         dataset_cache=Path(args.dataset_cache).resolve() if args.dataset_cache else None,
                         dataset_cache_bytes=args.dataset_cache_bytes, s3_endpoint_url=args.s3_endpoint_url,
                         dataset_limits=dataset_limits(args))
    if args.dataset_cache_bytes < 0:
        raise CliError(f"--dataset-cache-bytes is 0 (no limit) or more, got {args.dataset_cache_bytes}", USAGE)
    if args.s3_endpoint_url is not None and not args.s3_endpoint_url.startswith(("http://", "https://")):
        raise CliError(f"--s3-endpoint-url is an http:// or https:// URL, got {args.s3_endpoint_url!r}", USAGE)
    watch = health_watch(args, inventory)
    try:
        docker = docker_options(args, inventory) if args.runtime == "docker" else None
        if args.worker_log_max_mb <= 0 or args.worker_log_files < 2:
            raise CliError("--worker-log-max-mb is more than 0 and --worker-log-files 2 or more", USAGE)
        runtime = make_runtime(args.runtime, data_dir, args.node_id, docker,
                               (max(1, int(args.worker_log_max_mb * 2**20)), args.worker_log_files))
    except ModuleNotFoundError as e:  # the Docker SDK is an extra, imported only by the docker runtime
        if (e.name or "").partition(".")[0] != "docker":
            raise
        raise CliError("the docker runtime needs the Docker SDK: pip install 'corral[docker]'", USAGE) from None
    async with connected(args, name=f"corral-agent-{args.node_id}", forever=True, wait_for_creator=True) as bus:
        agent = Agent(bus, config, inventory, runtime, health=watch, history=archived(args, bus))
        metrics_server = await start_metrics(args, agents=[agent])
        try:
            return await until_signalled(agent.run(), lambda now: agent.shut_down(args.shutdown_grace, now),
                                         args.shutdown_grace + REPORT_S)
        finally:
            if metrics_server is not None:
                await metrics_server.close()


async def run_gateway(args: argparse.Namespace) -> int:
    from orchestrator.scheduler.gateway import Owners, TeamGateway

    configure_logging(args.log_level)
    try:
        owners = Owners.parse([*(args.team or []), *os.environ.get("CORRAL_ADMISSION_TEAMS", "").split()])
    except ValueError as e:
        raise CliError(str(e), USAGE) from None
    if not owners.queues:
        raise CliError("no team: give --team TEAM[=QUEUE,...] (or CORRAL_ADMISSION_TEAMS)", USAGE)
    async with connected(args, name="corral-admission", forever=True, wait_for_creator=True) as bus:
        return await until_signalled(TeamGateway(bus, owners).run())


async def run_index(args: argparse.Namespace) -> int:
    """`corral index`: the accounting and forensics index (orchestrator/index/service.py)."""
    from orchestrator.cli.archive import with_archive
    from orchestrator.index.projection import IndexFormatError
    from orchestrator.index.service import IndexService

    configure_logging(args.log_level)
    async with connected(args, name="corral-index", forever=True, wait_for_creator=True) as bus:
        # With --archive, catch-up (and --rebuild) read archive + stream as one log, and `explain`
        # fetches the positions the stream dropped from the archive.
        service = IndexService(bus, Path(args.data_dir).resolve(), history=with_archive(args, bus),
                               rebuild=args.rebuild)
        metrics_server = await start_index_metrics(args, service)
        try:
            return await until_signalled(service.run())
        except IndexFormatError as e:
            raise CliError(str(e), FAILURE) from None
        except LogGap as gap:
            if service.history is not bus:
                raise
            raise CliError(f"{gap}; give --archive PATH (the archive `corral archive` writes) to read what the "
                           "stream dropped", FAILURE) from None
        finally:
            if metrics_server is not None:
                await metrics_server.close()


async def start_index_metrics(args: argparse.Namespace, service: Any) -> MetricsServer | None:
    """Prometheus metrics of `corral index` on --metrics-port (0: off): the readers' counters and its position."""
    if not args.metrics_port:
        return None
    from events.telemetry import ServiceRegistry
    from orchestrator.index.service import watch_index

    registry = ServiceRegistry([service.bus])
    watch_index(registry, service)
    return await serve_metrics(args, registry)


async def run_demo_on_cluster(args: argparse.Namespace) -> int:
    """`corral demo`: the small demo workload on a running cluster, sized to its nodes' GPUs."""
    from events.follow import Follower
    from orchestrator.cli.demo import run_demo
    from orchestrator.core.evolve import evolve
    from orchestrator.core.model.state import ClusterState

    async with connected(args, name="corral-demo") as bus:
        follower = Follower(bus, evolve, ClusterState())
        deadline = asyncio.get_running_loop().time() + args.wait
        while True:
            await follower.catch_up()
            nodes = [n for n in follower.state.nodes.values() if n.schedulable]
            if len(nodes) >= 2 or asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(1.0)
        if len(nodes) < 2:
            raise CliError(f"the demo needs two registered nodes, found {len(nodes)} after {args.wait:g} s", FAILURE)
        gpus = min(n.inventory.gpu_count for n in nodes)
        return await run_demo(bus, getattr(args, "nats", ""), duration=args.duration, small=(gpus, args.image),
                              from_end=True)


# --- corral up ---------------------------------------------------------------------


def fake_node_labels(i: int) -> dict[str, str]:
    """Two nodes per leaf switch, eight per block: enough structure that placement matters."""
    return {"block": f"b{i // 8}", "leaf": f"l{i // 2}"}


async def run_up(args: argparse.Namespace) -> int:
    if args.demo and args.nodes < 2:
        raise CliError(f"the demo needs at least 2 nodes (--nodes {args.nodes})", USAGE)
    worker_env(args)  # a bad --worker-env exits 2 before anything starts
    check_shutdown_grace(args)
    up_ui_access(args)  # so do a UI off loopback without a token, an unreadable token file or certificate
    configure_logging(args.log_level)
    data = Path(args.data_dir).resolve()
    server = NatsServer(data / "nats", port=args.port or None, binary=args.nats_server, die_with_parent=True)
    check_port_free(server.host, args.port)
    try:
        # On this (the main) thread, not a worker thread: die_with_parent ties the server to the
        # thread that started it. Nothing else runs yet, so blocking the loop here costs nothing.
        server.start()
    except NatsServerError as e:
        if "address already in use" in str(e):  # taken between the check and the start
            raise CliError(port_taken(server.host, args.port), FAILURE) from None
        raise CliError(f"could not start nats-server: {e}", FAILURE) from None
    print(f"corral up: NATS at {server.url} (data in {data}); export CORRAL_NATS_URL={server.url}", flush=True)
    # SIGTERM (a plain `kill`, a supervisor) stops as cleanly as Ctrl-C: workers checkpoint and stop, then NATS;
    # a second signal stops at once (cli/stop_signals.py); a stop that hangs still ends, saying where it hung
    # (orchestrator/cli/hard_stop.py), as every service's does.
    task = asyncio.current_task()
    assert task is not None
    grace = 0.0 if args.keep_workers else args.shutdown_grace + REPORT_S
    stop = StopSignals(asyncio.get_running_loop(), task, grace, _say_stop(args)).install()
    try:
        bus = await Bus.connect(server.url, name="corral-up")
        try:
            return await _run_cluster(args, bus, data, server.url, stop)
        finally:
            await bus.close()
    except asyncio.CancelledError:
        if task.cancelling() == 0:
            raise
        return OK
    finally:
        await asyncio.to_thread(server.stop)
        print("corral up: stopped", flush=True)


def port_taken(host: str, port: int) -> str:
    return (f"port {port} on {host} is in use (another `corral up`? its jobs are at nats://{host}:{port}); "
            f"start this one with --port 0 (any free port) or another --port, and its own --data-dir")


def check_port_free(host: str, port: int) -> None:
    """One line with a hint, exit 1, when `corral up`'s NATS port is taken, not nats-server's banner.

    Bound as nats-server binds (SO_REUSEADDR, as Go listeners do, so a port in TIME_WAIT is free), then let go.
    """
    if not port:
        return
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise CliError(port_taken(host, port), FAILURE) from None
            raise CliError(f"cannot listen on {host}:{port}: {e.strerror or e}", FAILURE) from None
def _say_stop(args: argparse.Namespace) -> Callable[[bool], None]:
    def say(first: bool) -> None:
        if not first:
            print("corral up: stopping now (second Ctrl-C): workers still running are killed", flush=True)
        elif args.keep_workers:
            print("corral up: stopping; workers keep running (--keep-workers)", flush=True)
        else:
            print(f"corral up: stopping: jobs checkpoint and stop (up to {args.shutdown_grace:g}s); they resume on "
                  "the next `corral up`. Ctrl-C again to stop now", flush=True)
    return say


def up_liveness(nodes: int, heartbeat_timeout: float) -> tuple[float, float]:
    """`corral up`'s heartbeat interval and failure timeout: a second for a few nodes, as a laptop wants; a
    cluster-sized `--nodes` beats every 5 s (one machine hosts them all), and the timeout is at least four
    intervals whatever --heartbeat-timeout says."""
    heartbeat_s = 1.0 if nodes <= 128 else 5.0
    return heartbeat_s, max(heartbeat_timeout, 4 * heartbeat_s)


async def _run_cluster(args: argparse.Namespace, bus: Bus, data: Path, url: str, stop: StopSignals) -> int:
    async with contextlib.AsyncExitStack() as stack:
        return await _run_services(args, bus, data, url, stack, stop)


async def _run_services(args: argparse.Namespace, bus: Bus, data: Path, url: str,
                        stack: contextlib.AsyncExitStack, stop: StopSignals) -> int:
    from events.archive import Archive
    from events.history import History
    from orchestrator.cli.demo import needs_small_workload, run_demo
    from orchestrator.index.service import IndexService

    archiver = _up_archiver(args, bus, data)
    # With retention, every service reads what the stream dropped from the archive (a damaged snapshot or view).
    archive = None if archiver is None else Archive(archiver.config.path)
    heartbeat_s, heartbeat_timeout_s = up_liveness(args.nodes, args.heartbeat_timeout)
    sched = Scheduler(bus, SchedulerConfig(scheduler_id="up-scheduler", heartbeat_timeout_s=heartbeat_timeout_s,
                                           lease_ttl_s=2.0, tick_s=0.5, cluster=cluster_config(args),
                                           policy=args.policy),
                      history=None if archive is None else History(bus, archive))
    extra_env = worker_env(args)

    def make(agent_bus: Bus, i: int) -> Agent:
        node_id = f"node-{i}"
        node_dir = data / "agents" / node_id
        inventory = node_inventory(node_id, fake_gpus=args.gpus_per_node, labels=fake_node_labels(i),
                                   fake_model=args.gpu_model).inventory
        config = AgentConfig(node_id=node_id, address="127.0.0.1", data_dir=node_dir,
                             checkpoint_root=data / "checkpoints", heartbeat_s=heartbeat_s, worker_env=extra_env)
        runtime: Runtime = SimulatedRuntime() if args.runtime == "simulated" else \
            ProcessRuntime(node_dir / "workers", node_id=node_id, inherit_env=False)
        return Agent(agent_bus, config, inventory, runtime,
                     history=None if archive is None else History(agent_bus, archive))

    # The agents' own connections (PER_CONNECTION to one), closed after everything else stopped.
    agents = await connect_agents(stack, lambda k: connection(url, f"corral-up-agents-{k}"), args.nodes, make)
    index = IndexService(bus, data / "index", history=None if archive is None else History(bus, archive))
    notifier = up_notifier(args, bus, data)
    print(f"corral up: scheduler ({args.policy} policy) + {args.nodes} nodes x {args.gpus_per_node} {args.gpu_model} "
          f"({args.runtime} runtime) + the index; Ctrl-C stops", flush=True)
    result = OK
    metrics_server = await start_metrics(args, scheduler=sched, agents=agents, archiver=archiver is not None)
    ui_access = up_ui_access(args)
    if metrics_server is not None:
        print(f"corral up: Prometheus metrics at {metrics_server.url}", flush=True)
    try:
        stop_if_cancelled()  # a SIGTERM one of the start-up's nats waits swallowed
        async with asyncio.TaskGroup() as tg:
            scheduler = tg.create_task(sched.run())
            services = [scheduler, tg.create_task(index_beside(index))] + [tg.create_task(a.run()) for a in agents]
            if archiver is not None:
                services.append(tg.create_task(archiver.run()))
            services.append(tg.create_task(notifier.run()))  # end-of-job notes (orchestrator/notifier.py)
            if ui_access is not None:
                services.append(tg.create_task(ui_beside(bus, ui_access)))
            if args.demo:
                small = (args.gpus_per_node, None) if needs_small_workload(args.nodes, args.gpus_per_node) else None
                try:
                    result = await until_stop(stop, run_demo(bus, url, duration=args.duration, small=small), OK)
                except CliError as e:  # a data dir with queues or jobs of someone else's: the demo refused
                    print(f"corral: error: {e}", file=sys.stderr, flush=True)
                    result = e.code
            elif args.duration:
                await until_stop(stop, asyncio.sleep(args.duration), None)
            else:
                await stop.requested.wait()
            if not args.keep_workers:
                # The scheduler first: it places nothing on nodes about to go, and the next `corral up`'s
                # requeues the stopped gangs from their checkpoints (nodeagent/shutdown.py).
                await _cancelled(scheduler)
                n = sum(await asyncio.gather(*(a.shut_down(args.shutdown_grace, stop.now) for a in agents)))
                if n:
                    print(f"corral up: stopped {n} worker{'s' if n != 1 else ''} for the shutdown; their jobs resume "
                          "from their checkpoints on the next `corral up`", flush=True)
            for t in services:
                t.cancel()
    except* asyncio.CancelledError:
        pass
    finally:
        if not args.keep_workers:
            await asyncio.gather(*(a.stop_workers() for a in agents), return_exceptions=True)
        if metrics_server is not None:
            await metrics_server.close()
    return result


async def until_stop(stop: StopSignals, coro: Coroutine[Any, Any, Any], stopped: Any) -> Any:
    """`coro`'s result, or `stopped` once a stop signal came first (`coro` is then cancelled)."""
    work = asyncio.ensure_future(coro)
    asked = asyncio.ensure_future(stop.requested.wait())
    try:
        await asyncio.wait({work, asked}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (asked, work):
            if not t.done():
                t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t
    return stopped if work.cancelled() else work.result()


async def _cancelled(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
def up_notifier(args: argparse.Namespace, bus: Bus, data: Path) -> Notifier:
    """The notifier of `corral up`, its position kept in DATA_DIR/notifier.json."""
    from orchestrator.cli.notify import notifier_config
    from orchestrator.notifier import Notifier, NotifierConfig

    config = notifier_config(args, data / "notifier.json")
    assert isinstance(config, NotifierConfig)
    return Notifier(bus, config)


def _up_archiver(args: argparse.Namespace, bus: Bus, data: Path) -> Archiver | None:
    """With --retention/--max-bytes, an archiver under DATA_DIR/archive (or --archive), so the default is bounded."""
    if not (args.retention or args.max_bytes):
        return None
    from orchestrator.archiver import Archiver
    from orchestrator.cli.archive import archiver_config

    config = archiver_config(args, Path(args.archive) if args.archive else data / "archive")
    print(f"corral up: archiving the log to {config.path} (retention {args.retention or 'none'}, max bytes "
          f"{args.max_bytes or 'none'}); read old positions with --archive {config.path}", flush=True)
    return Archiver(bus, config)


def up_ui_access(args: argparse.Namespace) -> Access | None:
    """Where `corral up`'s web UI listens (None: --no-ui); checked before anything starts serving."""
    if args.no_ui:
        return None
    from orchestrator.cli.ui import access_of

    return access_of(args, listen=args.ui_listen, port=args.ui_port)


async def ui_beside(bus: Bus, access: Access) -> None:
    """The web UI inside `corral up`: its URL printed once it listens (any free port if its own is taken);
    a UI that stops logs why and leaves the cluster running."""
    from orchestrator.cli.webui.server import serve

    def ready(url: str) -> None:
        how = " (open it once as URL?token=TOKEN)" if access.token else ""
        print(f"corral up: web UI at {url}{how}", flush=True)

    try:
        await serve(bus, access, on_ready=ready, fallback_port=True)
    except (asyncio.CancelledError, KeyboardInterrupt):
        raise
    except Exception as e:  # never the cluster's end: the CLI reads the log without it
        log.error("ui_stopped", error=repr(e))


async def index_beside(index: IndexService) -> None:
    """The index inside `corral up`: an index it cannot keep (another format, a gap) is logged and rebuilt
    once, and if it still fails the cluster runs on without it (the commands then read the log)."""
    from orchestrator.index.projection import IndexFormatError

    try:
        await index.run()
    except IndexFormatError as e:
        log.warning("index_rebuilt", why=str(e))
        index.rebuild = True
        try:
            await index.run()
        except Exception as again:
            log.error("index_stopped", error=repr(again))
    except (asyncio.CancelledError, KeyboardInterrupt):
        raise
    except Exception as e:  # never the cluster's end: `usage` and the rest read the log without it
        log.error("index_stopped", error=repr(e))


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from orchestrator.cli.archive import add_retention_args
    from orchestrator.cli.connect import add_connection_args, add_log_level_arg

    def common(p: argparse.ArgumentParser, metrics_host: str = "0.0.0.0") -> None:
        add_log_level_arg(p)
        p.add_argument("--metrics-port", type=int, default=int(os.environ.get("CORRAL_METRICS_PORT", "0")),
                       metavar="PORT", help="serve Prometheus metrics at http://HOST:PORT/metrics "
                       "(env CORRAL_METRICS_PORT; default 0 = off)")
        p.add_argument("--metrics-host", default=metrics_host, metavar="HOST",
                       help="address the metrics endpoint binds (default %(default)s)")

    def sched_opts(p: argparse.ArgumentParser) -> None:
        p.add_argument("--topology-levels", default="block,leaf", metavar="L1,L2",
                       help="topology levels above node, coarse to fine, read from node labels (default %(default)s)")
        p.add_argument("--min-runtime", type=seconds_arg, default=60.0, metavar="S",
                       help="a job younger than this is not preempted (default %(default)s)")
        p.add_argument("--half-life", type=seconds_arg, default=0.0, metavar="S",
                       help="fair-share usage half-life; 0 = no decay (default)")
        p.add_argument("--heartbeat-timeout", type=seconds_arg, default=40.0, metavar="S",
                       help="declare a node failed after this long without a heartbeat (default %(default)s: four of "
                            "the agents' default 10 s beats, as Kubernetes' node grace; README, Liveness)")
        p.add_argument("--policy", default="corral", choices=POLICY_NAMES, metavar="NAME",
                       help=f"the scheduling policy: one of the simulator's ({', '.join(POLICY_NAMES)}), the same "
                            "records `corral sim --policy` runs; each election in the log names it "
                            "(default %(default)s)")
        p.add_argument("--drain-unhealthy-gpus", type=int, default=2, metavar="K",
                       help="a node with K GPUs out of service (GpuUnhealthy) takes no new work; 0: never by count "
                            "(default %(default)s)")

    p = sub.add_parser("scheduler", help="run the scheduler service (one leader, others stand by)",
                       description="Follow the log, decide, append decisions. Several may run: a lease elects one.")
    add_connection_args(p, service=True)
    common(p)
    sched_opts(p)
    p.add_argument("--id", help="scheduler id (default host-pid)")
    p.add_argument("--tick", type=seconds_arg, default=1.0, metavar="S", help="decide at least this often")
    p.add_argument("--lease-ttl", type=seconds_arg, default=5.0, metavar="S", help="leader lease TTL")
    p.add_argument("--snapshot-every", type=int, default=10_000, metavar="N", help="snapshot after N events")
    p.add_argument("--snapshot-interval", type=seconds_arg, default=60.0, metavar="S",
                   help="and at most S seconds after the last snapshot when anything changed")
    p.set_defaults(handler=run_scheduler)

    p = sub.add_parser("agent", help="run a node agent", description="Register this node, heartbeat, run the "
                       "ranks the log places here.")
    add_connection_args(p, service=True)
    common(p)
    p.add_argument("--node-id", required=True, help="this node's id (unique in the cluster)")
    p.add_argument("--runtime", choices=("process", "docker", "simulated"), default="process",
                   help="process: local processes; docker: containers; simulated: timers, no processes (scale tests)")
    p.add_argument("--address", help="address other nodes reach this one at (MASTER_ADDR); default hostname")
    p.add_argument("--fake-gpus", type=int, metavar="N", help="simulate N GPUs instead of asking NVML")
    p.add_argument("--gpu-model", default="H100", help="model of the fake GPUs (default %(default)s)")
    p.add_argument("--labels", help="topology labels, e.g. block=b0,leaf=l1")
    p.add_argument("--data-dir", default=".corral/agent", help="worker state and logs (default %(default)s)")
    p.add_argument("--checkpoint-root", help="shared checkpoint storage (default DATA_DIR/checkpoints)")
    p.add_argument("--heartbeat", type=seconds_arg, default=10.0, metavar="S",
                   help="heartbeat interval (default %(default)s, as a Kubernetes node lease; keep it a quarter of the "
                        "scheduler's --heartbeat-timeout or less)")
    p.add_argument("--worker-log-max-mb", type=float, default=LOG_MAX_BYTES / 2**20, metavar="MB",
                   help="process runtime: rotate a worker's output log at this size (default %(default)g MiB)")
    p.add_argument("--worker-log-files", type=int, default=LOG_FILES, metavar="N",
                   help="process runtime: log files kept per worker, the current one included (default "
                        "%(default)s); a worker's output on disk never exceeds MB x N")
    h = p.add_argument_group("GPU health", "the NVML health watch and the operator's health check "
                             "(nodeagent/gpu_health.py)")
    h.add_argument("--no-health-watch", action="store_true", help="do not watch GPU health through NVML")
    h.add_argument("--fake-nvml", metavar="FILE", help="with --fake-gpus: watch them through a fake NVML driven by "
                   "this scenario file (nodeagent/fake_nvml.py), read again whenever it changes")
    h.add_argument("--health-poll", type=seconds_arg, default=1.0, metavar="S",
                   help="longest wait for Xid events per poll; counters are read every poll (default %(default)s)")
    h.add_argument("--xid-fatal", default=",".join(map(str, sorted(DEFAULT_FATAL_XIDS))), metavar="LIST",
                   help="Xids that take a GPU out of service (default %(default)s); Xids in neither list are "
                        "warnings")
    h.add_argument("--xid-ignore", default=",".join(map(str, sorted(DEFAULT_IGNORED_XIDS))), metavar="LIST",
                   help="application Xids never reported (default %(default)s)")
    h.add_argument("--health-check", metavar="CMD", help="a shell command run every --health-check-interval; a "
                   "non-zero exit drains the node with its output, a pass after that brings it back")
    h.add_argument("--health-check-interval", type=seconds_arg, default=60.0, metavar="S", help="(default %(default)s)")
    h.add_argument("--health-check-timeout", type=seconds_arg, default=60.0, metavar="S",
                   help="a check running longer fails (default %(default)s)")
    add_worker_env_arg(p)
    add_shutdown_grace_arg(p)
    ds = p.add_argument_group("datasets", "the node-local cache jobs' datasets are staged into before their ranks "
                              "start (nodeagent/datasets/)")
    ds.add_argument("--dataset-cache", metavar="DIR", help="the cache directory (default DATA_DIR/datasets)")
    ds.add_argument("--dataset-cache-bytes", type=int, default=0, metavar="N",
                    help="size limit: least recently used datasets no job here uses are evicted to stay under it "
                         "(default 0: no limit)")
    lim = Limits()
    ds.add_argument("--dataset-max-bytes", type=int, default=lim.max_bytes, metavar="N",
                    help="most bytes one dataset may unpack to, checked as it streams (never more than "
                         "--dataset-cache-bytes; default %(default)s)")
    ds.add_argument("--dataset-max-members", type=int, default=lim.max_members, metavar="N",
                    help="most files, directories and links one archive may hold (default %(default)s)")
    ds.add_argument("--dataset-max-ratio", type=float, default=lim.max_ratio, metavar="R",
                    help=f"most unpacked bytes per downloaded byte once past the first {lim.ratio_floor >> 30} GiB "
                         "unpacked: a decompression bomb (default %(default)s)")
    ds.add_argument("--dataset-timeout", type=seconds_arg, default=lim.timeout_s, metavar="S",
                    help="most seconds one staging may take, fetch and unpack (default %(default)s)")
    ds.add_argument("--dataset-stall-timeout", type=seconds_arg, default=lim.stall_s, metavar="S",
                    help=f"a fetch receiving fewer than {lim.stall_bytes} bytes in S seconds has stalled (a dead or "
                         "trickling server) and fails (default %(default)s)")
    ds.add_argument("--dataset-memory-bytes", type=int, default=lim.memory_bytes, metavar="N",
                    help="address-space limit of the process each staging runs in, so no data can exhaust the "
                         "agent's memory (default %(default)s; 0: none)")
    ds.add_argument("--s3-endpoint-url", metavar="URL", help="where s3:// sources are, for an on-prem S3 (MinIO, "
                    "Ceph), e.g. http://minio:9000 (default: the AWS chain's, AWS_ENDPOINT_URL or AWS itself); "
                    "credentials come from the AWS chain (needs corral[s3])")
    d = p.add_argument_group("Docker runtime", "what worker containers get (nodeagent/runtime/docker_options.py)")
    d.add_argument("--docker-network", choices=("auto", "host", "bridge"), default="auto",
                   help="host: the node's network (rank 0 listens on MASTER_ADDR = --address); bridge: a private "
                        "one, for one-rank jobs only; auto: host for gangs of 2+ ranks (default %(default)s)")
    d.add_argument("--docker-ipc", choices=("host", "private"), default="host",
                   help="host: the node's IPC and /dev/shm (NCCL between ranks of one node); private: a /dev/shm "
                        "of --docker-shm-size per container (default %(default)s)")
    d.add_argument("--docker-shm-size", type=int, default=8192, metavar="MB",
                   help="/dev/shm per container with private IPC, unless the job sets shm_size_mb "
                        "(default %(default)s)")
    d.add_argument("--docker-infiniband", choices=("auto", "on", "off"), default="auto",
                   help="pass /dev/infiniband devices, IPC_LOCK and an unlimited memlock ulimit; auto: when "
                        "/dev/infiniband exists (default %(default)s)")
    d.add_argument("--docker-gpus", choices=("auto", "request", "none"), default="auto",
                   help="request the placement's GPUs by index from the NVIDIA runtime; auto: unless "
                        "--fake-gpus (default %(default)s)")
    p.set_defaults(handler=run_agent)

    from orchestrator.cli.agent_host import add_agent_host_args

    p = sub.add_parser("agent-host", help="run many simulated node agents in one process, for scale tests",
                       description="N simulated nodes (fake GPUs, simulated runtime), each a real agent with its "
                                   "own filtered subscription of its node's slice of the log.")
    add_connection_args(p, service=True)
    common(p)
    add_agent_host_args(p)

    p = sub.add_parser(
        "admission", help="run the admission service: team accounts submit and cancel through it",
        description="Answer corral-submit.<job> and corral-cancel.<job> requests from team accounts "
                    "(deploy/nats renders TEAM_<TEAM> accounts that import them). The server stamps each request "
                    "with the caller's account; a team may submit to and cancel in the queues --team gives it "
                    "(and their sub-queues by QueueDefined parent). Stateless: run two or more, they share the "
                    "requests (queue group corral-admission). Connect as the `admission` user.")
    add_connection_args(p, service=True)
    common(p)
    p.add_argument("--team", action="append", metavar="TEAM[=QUEUE,...]",
                   help="team TEAM (account TEAM_<TEAM>) owns these queues; just TEAM: the queue of that name. "
                        "Repeat per team; env CORRAL_ADMISSION_TEAMS adds space-separated entries")
    p.set_defaults(handler=run_gateway)

    p = sub.add_parser(
        "index", help="run the accounting and forensics index: `usage`, `jobs --all`, `job`, `explain` answer from it",
        description="Follow the log into an SQLite index under --data-dir (one row per job, its reservations and "
                    "the positions of its events) and answer `corral usage`, `jobs --all`, `job OLD` and `explain "
                    "OLD` over NATS (corral-index.usage, .jobs, .job, .events), so they need not read the whole "
                    "log. Resumes from its stored position; --rebuild folds the log from position 1 again (with "
                    "retention on, give --archive PATH: the positions the stream dropped are read there). Without "
                    "an index the commands read the log themselves. Connect as the `index` user.")
    add_connection_args(p, service=True)
    common(p)
    p.add_argument("--data-dir", default=".corral/index", help="where the index file lives (default %(default)s)")
    p.add_argument("--rebuild", action="store_true", help="delete the index and fold the whole log again")
    p.add_argument("--archive", metavar="PATH", default=argparse.SUPPRESS,
                   help="the archive `corral archive` writes: catch-up, --rebuild and `explain` read the positions "
                        "the stream dropped there (as the global --archive; env CORRAL_ARCHIVE)")
    p.set_defaults(handler=run_index)

    p = sub.add_parser("demo", help="submit the small demo workload to a running cluster and narrate it",
                       description="A two-node gang that an urgent production job preempts and that resumes from "
                                   "its checkpoint, sized to the registered nodes' GPUs (docker compose runs it). "
                                   "Defines the queues prod and research: connect as a user that may (admin). "
                                   "Refuses (exit 2, changing nothing) a cluster whose log holds other queues, "
                                   "other definitions of those two, or jobs of anyone but the demo.")
    add_connection_args(p)
    p.add_argument("--image", help="run the workers as containers of IMAGE (it must hold the toy worker, "
                                   "orchestrator/demo_worker.py, at /opt/corral/worker.py: deploy/Dockerfile --target "
                                   "worker)")
    p.add_argument("--wait", type=seconds_arg, default=120.0, metavar="S", help="wait this long for two nodes")
    p.add_argument("--duration", type=seconds_arg, default=600.0, metavar="S", help="give up after S seconds")
    p.set_defaults(handler=run_demo_on_cluster)

    p = sub.add_parser("up", help="embedded cluster: NATS + scheduler + simulated nodes in one command",
                       description="Start nats-server (bundled), the scheduler and N simulated node agents "
                                   "(process runtime, fake GPUs). Restarting on the same --data-dir recovers "
                                   "the state from the log.")
    common(p, metrics_host="127.0.0.1")
    sched_opts(p)
    p.set_defaults(min_runtime=5.0, heartbeat_timeout=5.0)
    p.add_argument("--nodes", type=int, default=4, help="simulated nodes (default %(default)s)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="fake GPUs per node (default %(default)s)")
    p.add_argument("--gpu-model", default="H100")
    p.add_argument("--runtime", choices=("process", "simulated"), default="process",
                   help="process: each rank a real process; simulated: a rank that runs `sleep N` sleeps in its agent "
                        "(thousands of ranks at once on one machine; default %(default)s)")
    p.add_argument("--data-dir", default=".corral", help="NATS store, worker state, checkpoints (default %(default)s)")
    p.add_argument("--port", type=int, default=4222, help="NATS port (default %(default)s; 0 = any free port)")
    p.add_argument("--nats-server", metavar="PATH", help="nats-server binary (default: the bundled one)")
    p.add_argument("--demo", action="store_true",
                   help="submit a sample workload and narrate it; exits 1 naming the jobs that did not complete "
                        "(under 4 nodes x 8 GPUs: the small workload)")
    p.add_argument("--duration", type=seconds_arg, default=0.0, metavar="S",
                   help="stop after S seconds (with --demo: at most S, ends earlier when the demo is done)")
    p.add_argument("--keep-workers", action="store_true",
                   help="leave workers running on exit; the next `corral up` on this data dir adopts them")
    add_shutdown_grace_arg(p)
    add_worker_env_arg(p)
    add_notifier_args(p.add_argument_group("notifier", "end-of-job notes: jobs' --notify-url, and --notify-cmd"))  # type: ignore[arg-type]
    from orchestrator.cli.ui import DEFAULT_PORT, add_ui_access_args

    w = p.add_argument_group("web UI", "the read-only web UI (`corral ui`; README, Web UI)")
    w.add_argument("--no-ui", action="store_true", help="do not serve the web UI")
    w.add_argument("--ui-listen", default="127.0.0.1", metavar="ADDR",
                   help="address the UI listens on (default %(default)s; anything but loopback needs a token)")
    w.add_argument("--ui-port", type=int, default=DEFAULT_PORT, metavar="PORT",
                   help="the UI's port (default %(default)s; taken: any free one, printed)")
    add_ui_access_args(w)  # type: ignore[arg-type]
    r = p.add_argument_group("retention", "with --retention or --max-bytes, an archiver runs too, archiving to "
                             "DATA_DIR/archive (or the global --archive)")
    add_retention_args(r)  # type: ignore[arg-type]
    p.set_defaults(handler=run_up)
