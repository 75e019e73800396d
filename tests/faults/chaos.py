"""A chaos run: a workload on real `corral` processes while schedulers, agents and nats-server are paused and killed.

The driver starts one nats-server, two (or more) `corral scheduler`s and N
`corral agent`s with simulated workers, submits the jobs, then for the chaos
phase picks a fault every so often at random (seeded):

- SIGSTOP a scheduler, an agent or the nats-server for up to 3x the lease
  (agents then miss heartbeats: past the heartbeat timeout their node is
  failed, legitimately), then SIGCONT;
- kill -9 a scheduler or an agent and start it again a moment later (an
  agent comes back as a new incarnation of the same node);
- kill -9 the nats-server and start it again on the same store and port.

Then every process is resumed, the workload drains, and the log is read raw
(nats-py, no corral code) and handed to `chaos_check`, which imports nothing
of corral. Last, each surviving service's own fold (its metrics:
`corral_log_position` and `corral_state_digest`) is compared with a fresh fold
of the whole log.

The driver records what it did and when (`Outage`s), which is what the
checker needs to tell a legitimate NodeFailed from a lie.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import nats
import nats.errors
import nats.js.errors
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from events.server import NatsServer
from tests.faults.chaos_check import Outage, Report, Stored, check
from tests.integration.harness import log_tail, start_corral

Proc = "subprocess.Popen[bytes]"


@dataclass(frozen=True)
class ChaosConfig:
    jobs: int = 300
    nodes: int = 8
    gpus: int = 8
    schedulers: int = 2
    #: Seconds of faults; the workload is submitted over the first half of it.
    chaos_s: float = 60.0
    #: Seconds the undisturbed cluster gets to finish the workload afterwards.
    drain_s: float = 300.0
    lease_ttl: float = 2.0
    heartbeat_timeout: float = 4.0
    heartbeat: float = 0.5
    #: Mean seconds between two faults.
    fault_every: float = 1.5
    #: Job durations, seconds (uniform).
    job_s: tuple[float, float] = (0.5, 4.0)
    #: Let nats-server itself be paused and killed.
    nats_faults: bool = True
    seed: int = 1


@dataclass
class Service:
    kind: str  # scheduler | agent
    name: str
    args: list[str]
    log: Path
    metrics_port: int
    proc: object = None
    paused: bool = False

    def start(self) -> None:
        self.proc = start_corral(*self.args, "--metrics-port", str(self.metrics_port), "--metrics-host", "127.0.0.1",
                                 log=self.log)

    @property
    def pid(self) -> int:
        return self.proc.pid  # type: ignore[attr-defined,no-any-return]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None  # type: ignore[attr-defined]


@dataclass
class ChaosResult:
    report: Report
    faults: dict[str, int] = field(default_factory=dict)
    restarts: int = 0
    services_checked: int = 0
    state_mismatches: list[str] = field(default_factory=list)
    submit_retries: int = 0
    wall_s: float = 0.0

    def summary(self) -> dict[str, object]:
        return {**self.report.summary(), "faults": self.faults, "restarts": self.restarts,
                "services_checked": self.services_checked, "state_mismatches": len(self.state_mismatches),
                "submit_retries": self.submit_retries, "wall_s": round(self.wall_s, 1)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


class RawLog:
    """The stream read with plain nats-py (no corral code): (seq, server time, bytes) in order."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.messages: list[Stored] = []

    async def read_new(self) -> int:
        """Append what the stream holds past what was read; how many came. Raises if the server is away."""
        nc = await nats.connect(self.url, max_reconnect_attempts=0, connect_timeout=2)
        try:
            js = nc.jetstream(timeout=5)
            last = (await js.stream_info("CORRAL")).state.last_seq
            start = self.messages[-1].seq + 1 if self.messages else 1
            if last < start:
                return 0
            cfg = ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                                 opt_start_seq=start, mem_storage=True, inactive_threshold=30.0)
            psub = await js.pull_subscribe("corral.>", durable=None, stream="CORRAL", config=cfg)
            n = 0
            try:
                while not self.messages or self.messages[-1].seq < last:
                    for m in await psub.fetch(1000, timeout=5):
                        md = m.metadata
                        # The stream time to the nanosecond, as a reader's Envelope has it (the reply subject's
                        # second-to-last token): the services fold on it (#30); metadata's datetime keeps microseconds.
                        self.messages.append(Stored(md.sequence.stream, int(m.reply.split(".")[-2]) / 1e9, m.data,
                                                    m.subject))
                        n += 1
            finally:
                with contextlib.suppress(Exception):
                    await psub.unsubscribe()
            return n
        finally:
            with contextlib.suppress(Exception):
                await nc.close()

    def terminal_jobs(self) -> tuple[set[str], set[str]]:
        """(submitted, terminal) job ids, by the JSON alone."""
        submitted: set[str] = set()
        done: set[str] = set()
        for m in self.messages:
            with contextlib.suppress(ValueError, UnicodeDecodeError, KeyError, TypeError):
                e = json.loads(m.data)
                if e["type"] == "JobSubmitted":
                    submitted.add(e["job_id"])
                elif e["type"] in ("JobCompleted", "JobFailed", "JobCancelled", "JobRejected"):
                    done.add(e["job_id"])
        return submitted, done


def _job(i: int, rng: random.Random, job_s: tuple[float, float], gpus: int) -> dict[str, object]:
    shape = rng.random()
    ranks, per = (1, rng.choice([1, 1, 2, 4])) if shape < 0.8 else (1, gpus) if shape < 0.93 else (2, gpus)
    return {
        "name": f"chaos{i:05d}", "ranks": ranks, "gpus_per_rank": per,
        "priority": 5 if rng.random() < 0.1 else 0, "restart_policy": "gang", "max_restarts": 50,
        "command": ["sleep", f"{rng.uniform(*job_s):.2f}"], "grace_period_s": 2.0,
    }


async def _submit(url: str, jobs: list[tuple[str, dict[str, object]]], spread_s: float) -> int:
    """Publish JobSubmitted events (plain nats-py, as any client could), retrying through outages; retries made."""
    retries = 0
    gap = spread_s / max(1, len(jobs))
    nc = await nats.connect(url, max_reconnect_attempts=-1, reconnect_time_wait=0.25)
    try:
        js = nc.jetstream(timeout=3)
        for job_id, spec in jobs:
            event = {"type": "JobSubmitted", "event_id": f"submit:{job_id}", "occurred_at": time.time(),
                     "job_id": job_id, "spec": spec, "submitted_by": "chaos"}
            payload = json.dumps(event).encode()
            for _ in range(400):
                try:
                    await js.publish(f"corral.job.{job_id}.JobSubmitted", payload,
                                     headers={"Nats-Msg-Id": event["event_id"]})  # type: ignore[dict-item]
                    break
                except (nats.errors.Error, TimeoutError, nats.js.errors.Error):
                    retries += 1
                    await asyncio.sleep(0.25)
            else:
                raise AssertionError(f"{job_id} could not be submitted")
            await asyncio.sleep(gap)
    finally:
        await nc.close()
    return retries


async def _scrape(port: int) -> dict[str, float]:
    def get() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return r.read().decode()  # type: ignore[no-any-return]

    out: dict[str, float] = {}
    for line in (await asyncio.to_thread(get)).splitlines():
        if line.startswith(("corral_log_position", "corral_state_digest")):
            name, _, value = line.rpartition(" ")
            out[name.partition("{")[0]] = float(value)  # an agent's carry its node as a label
    return out


async def run_chaos(cfg: ChaosConfig, workdir: Path, *, progress: Callable[[str], None] = lambda s: None,
                    fresh_digest: Callable[[list[Stored], str | None], tuple[int, int]]) -> ChaosResult:
    """Run it; `fresh_digest(log, node)` is the (position, digest) of a fresh fold (the code under test's, for
    comparing): of the whole log (node None, a scheduler's), or of `node`'s slice (its agent's, #40)."""
    t_start = time.monotonic()
    rng = random.Random(cfg.seed)
    server = NatsServer(workdir / "nats", port=_free_port())
    await asyncio.to_thread(server.start)
    url = server.url
    services: list[Service] = []
    for i in range(cfg.schedulers):
        sid = f"s{i}"
        services.append(Service("scheduler", sid, [
            "--nats", url, "scheduler", "--id", sid, "--lease-ttl", str(cfg.lease_ttl), "--tick", "0.2",
            "--heartbeat-timeout", str(cfg.heartbeat_timeout), "--min-runtime", "1", "--snapshot-every", "500",
            "--log-level", "info"], workdir / f"{sid}.log", _free_port()))
    for i in range(cfg.nodes):
        nid = f"n{i:02d}"
        d = workdir / nid
        d.mkdir(parents=True, exist_ok=True)
        services.append(Service("agent", nid, [
            "--nats", url, "agent", "--node-id", nid, "--runtime", "simulated", "--fake-gpus", str(cfg.gpus),
            "--data-dir", str(d), "--checkpoint-root", str(workdir / "checkpoints"), "--address", "127.0.0.1",
            "--heartbeat", str(cfg.heartbeat), "--log-level", "info"], workdir / f"agent-{nid}.log", _free_port()))
    for s in services:
        s.start()
    outages: list[Outage] = []
    faults: dict[str, int] = {}
    restarts = 0
    raw = RawLog(url)
    nats_down = asyncio.Event()
    nats_down.set()  # set: the server is up
    pending: set[asyncio.Task[None]] = set()

    def count(what: str) -> None:
        faults[what] = faults.get(what, 0) + 1

    async def pause(s: Service, seconds: float) -> None:
        s.paused = True
        t0 = time.time()
        _signal(s.pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(seconds)
        finally:
            _signal(s.pid, signal.SIGCONT)
            s.paused = False
            if s.kind == "agent":
                outages.append(Outage(s.name, t0, time.time(), "paused"))

    async def kill_and_restart(s: Service, after: float) -> None:
        nonlocal restarts
        s.paused = True
        t0 = time.time()
        _signal(s.pid, signal.SIGKILL)
        await asyncio.to_thread(s.proc.wait)  # type: ignore[attr-defined]
        if s.kind == "agent":
            outages.append(Outage(s.name, t0, None, "killed"))
        await asyncio.sleep(after)
        s.start()
        restarts += 1
        s.paused = False

    async def nats_fault(kill: bool, seconds: float) -> None:
        nats_down.clear()
        t0 = time.time()
        try:
            if kill:
                await asyncio.to_thread(server.kill)
                await asyncio.sleep(seconds)
                await asyncio.to_thread(server.start)
            else:
                assert server.pid is not None
                _signal(server.pid, signal.SIGSTOP)
                await asyncio.sleep(seconds)
                _signal(server.pid, signal.SIGCONT)
        finally:
            outages.append(Outage(None, t0, time.time(), "nats " + ("killed" if kill else "paused")))
            nats_down.set()

    def spawn(coro: object) -> None:
        task = asyncio.ensure_future(coro)  # type: ignore[var-annotated]
        pending.add(task)
        task.add_done_callback(pending.discard)

    jobs = [(f"c{i:05d}", _job(i, rng, cfg.job_s, cfg.gpus)) for i in range(cfg.jobs)]
    result = ChaosResult(report=Report())
    try:
        await asyncio.sleep(3.0)  # let them register and elect before the first fault
        submitting = asyncio.create_task(_submit(url, jobs, cfg.chaos_s / 2))
        chaos_end = time.monotonic() + cfg.chaos_s
        while time.monotonic() < chaos_end:
            await asyncio.sleep(rng.expovariate(1.0 / cfg.fault_every))
            for s in services:
                if not s.paused and not s.alive():
                    raise AssertionError(f"{s.name} died on its own (rc={s.proc.returncode}):\n"  # type: ignore[attr-defined]
                                         f"{log_tail(s.proc)}")  # type: ignore[arg-type]
            roll = rng.random()
            if cfg.nats_faults and roll < 0.08:
                if nats_down.is_set():
                    kill = rng.random() < 0.5
                    count("nats_kill" if kill else "nats_stop")
                    spawn(nats_fault(kill, rng.uniform(0.3, 3.0 * cfg.lease_ttl if not kill else 2.0)))
                continue
            pool = [s for s in services if not s.paused and (s.kind == "scheduler") == (roll < 0.45)]
            if not pool:
                continue
            s = rng.choice(pool)
            if rng.random() < 0.6:
                count(f"{s.kind}_stop")
                spawn(pause(s, rng.uniform(0.2, 3.0) * cfg.lease_ttl))
            else:
                count(f"{s.kind}_kill")
                spawn(kill_and_restart(s, rng.uniform(0.2, 3.0)))
            progress(f"faults so far: {faults}")
        result.submit_retries = await submitting
        await asyncio.gather(*pending)
        progress("chaos over; draining")
        deadline = time.monotonic() + cfg.drain_s
        while True:
            for s in services:
                if not s.alive():
                    raise AssertionError(f"{s.name} died (rc={s.proc.returncode}):\n{log_tail(s.proc)}")  # type: ignore[attr-defined,arg-type]
            with contextlib.suppress(nats.errors.Error, TimeoutError, OSError):
                await raw.read_new()
            submitted, done = raw.terminal_jobs()
            if len(submitted) == cfg.jobs and submitted <= done:
                break
            if time.monotonic() > deadline:
                progress(f"drain timed out: {len(submitted - done)} of {len(submitted)} jobs not terminal")
                break
            await asyncio.sleep(2.0)
        # Quiet: every service's fold should reach the log's end and equal a fresh fold of it.
        await asyncio.sleep(3.0)
        await raw.read_new()
        for s in services:
            position, digest = fresh_digest(raw.messages, s.name if s.kind == "agent" else None)
            seen: dict[str, float] = {}
            for _ in range(30):
                with contextlib.suppress(OSError, ValueError):
                    seen = await _scrape(s.metrics_port)
                if seen.get("corral_log_position") == position:
                    break
                await asyncio.sleep(1.0)
            result.services_checked += 1
            if seen.get("corral_log_position") != position or seen.get("corral_state_digest") != digest:
                result.state_mismatches.append(f"{s.name}: {seen} vs fresh fold ({position}, {digest})")
        result.report = check(raw.messages, outages, heartbeat_timeout=cfg.heartbeat_timeout,
                              heartbeat_interval=cfg.heartbeat)
    finally:
        for task in list(pending):
            task.cancel()
        for s in services:
            if s.alive():
                _signal(s.pid, signal.SIGCONT)
                _signal(s.pid, signal.SIGKILL)
                s.proc.wait()  # type: ignore[attr-defined]
        if server.pid is not None:
            _signal(server.pid, signal.SIGCONT)
        await asyncio.to_thread(server.stop)
    result.faults = faults
    result.restarts = restarts
    result.wall_s = time.monotonic() - t_start
    return result

