"""/readyz means caught up (#28 point 4): 503 with the gap until a service folded the log as of its start.

Real nats-server, real services' wiring (`watch_scheduler`, `watch_agents`, the registry and its HTTP
endpoint). The catch-up is made observable by folding in two steps (`catch_up(to_seq=...)` stops
half way, as a slow fold would be seen by a probe), not by timing; a real `corral scheduler`
process on a long log is then polled until ready, and every answer it gave must tell the truth.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import time
import urllib.error
import urllib.request
from collections.abc import AsyncGenerator
from contextlib import aclosing
from pathlib import Path

from events.bus import Bus, Envelope
from events.server import NatsServer
from events.telemetry import MetricsServer, ServiceRegistry
from nodeagent.agent import Agent, AgentConfig
from nodeagent.fake_gpus import fake_inventory
from nodeagent.metrics import watch_agents
from nodeagent.runtime.simulated import SimulatedRuntime
from orchestrator.index.service import IndexService, watch_index
from orchestrator.scheduler.metrics import watch_scheduler
from orchestrator.scheduler.service import Scheduler
from schemas import QueueDefined
from tests.integration.harness import log_tail, start_corral, stop

GAP = re.compile(r"^(?P<who>[\w/.-]+): catching up: folded seq (?P<a>\d+) of (?P<b>\d+) \((?P<c>\d+) behind\)$")


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def gauge(port: int, service: str) -> float | None:
    _, body = get(f"http://127.0.0.1:{port}/metrics")
    m = re.search(rf'^corral_catch_up_behind\{{service="{re.escape(service)}"\}} (\S+)$', body, re.M)
    return float(m.group(1)) if m else None


def queues(n: int, start: int = 0) -> list[QueueDefined]:
    return [QueueDefined(event_id=f"q:{i}", occurred_at=1.0, queue=f"q{i}", weight=1.0) for i in range(start, start + n)]


async def test_ready_only_once_every_reader_folded_the_log_as_of_its_start(bus: Bus, tmp_path: Path) -> None:
    await bus.append_many(queues(300))
    sched = Scheduler(bus)
    agent = Agent(bus, AgentConfig(node_id="n0", data_dir=tmp_path / "n0"), fake_inventory(2, node_id="n0"),
                  SimulatedRuntime())
    registry = ServiceRegistry([bus])
    watch_scheduler(registry, sched.follower, sched.heartbeat_ages)
    watch_agents(registry, [agent])
    server = await MetricsServer(registry, host="127.0.0.1", port=0).start()
    url = f"http://127.0.0.1:{server.port}/readyz"
    try:
        # Nothing read yet: not ready, and the reason says so.
        status, body = await _get(url)
        assert status == 503 and "scheduler: starting" in body and "agent/n0: starting" in body, body
        assert await _gauge(server.port, "scheduler") == -1

        # Half way: the gap, for each reader that is behind.
        await sched.follower.catch_up(to_seq=100)
        await agent.follower.catch_up(to_seq=250)
        status, body = await _get(url)
        assert status == 503
        assert body.strip().splitlines() == ["scheduler: catching up: folded seq 100 of 300 (200 behind)",
                                             "agent/n0: catching up: folded seq 250 of 300 (50 behind)"], body
        assert await _gauge(server.port, "scheduler") == 200
        assert await _gauge(server.port, "agent/n0") == 50

        # The log grows meanwhile: the target stays what it was at the start.
        await bus.append_many(queues(40, start=300))
        await sched.follower.catch_up(to_seq=300)
        status, body = await _get(url)
        assert status == 503 and body.strip() == "agent/n0: catching up: folded seq 250 of 300 (50 behind)", body
        await agent.follower.catch_up(to_seq=300)
        status, body = await _get(url)
        assert (status, body) == (200, "ready\n")
        assert await _gauge(server.port, "scheduler") == 0 and await _gauge(server.port, "agent/n0") == 0

        # Ready while connected, though 40 newer events are not folded yet (a live log never holds still).
        assert sched.follower.state.seq == 300 < await bus.last_seq()
        assert (await _get(url))[0] == 200
    finally:
        await server.close()


async def _get(url: str) -> tuple[int, str]:
    return await asyncio.to_thread(get, url)


async def _gauge(port: int, service: str) -> float | None:
    return await asyncio.to_thread(gauge, port, service)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_scheduler_process_on_a_long_log_says_its_gap_until_it_caught_up(
        nats_server: NatsServer, bus: Bus, tmp_path: Path) -> None:
    n = 20_000
    for i in range(0, n, 5_000):
        await bus.append_many(queues(5_000, start=i))
    assert await bus.last_seq() == n
    port = free_port()
    proc = start_corral("scheduler", "--nats", nats_server.url, "--metrics-port", str(port), "--metrics-host",
                        "127.0.0.1", "--id", "ready-test", log=tmp_path / "scheduler.log")
    seen: list[tuple[int, str]] = []
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"the scheduler exited {proc.returncode}:\n{log_tail(proc)}"
            assert time.monotonic() < deadline, f"never ready; last answers {seen[-3:]}\n{log_tail(proc)}"
            try:
                answer = await _get(f"http://127.0.0.1:{port}/readyz")
            except OSError:
                continue  # not serving yet
            seen.append(answer)
            if answer[0] == 200:
                break
        # Every answer before that told the truth: starting, or a gap to the log's end at the start.
        folded = [0]
        for status, body in seen[:-1]:
            assert status == 503, (status, body)
            if "starting" in body:
                assert body.strip() == "scheduler: starting: the log's last position is not read yet", body
                continue
            m = GAP.match(body.strip())
            assert m is not None, body
            a, b, c = int(m["a"]), int(m["b"]), int(m["c"])
            assert m["who"] == "scheduler" and b == n and a + c == b and a >= folded[-1], body
            folded.append(a)
        assert seen[-1] == (200, "ready\n")
        # Ready means folded: the position it reports is at least the log's end at its start.
        _, metrics = await _get(f"http://127.0.0.1:{port}/metrics")
        pos = re.search(r"^corral_log_position (\S+)$", metrics, re.M)
        assert pos is not None and float(pos.group(1)) >= n
        assert await _gauge(port, "scheduler") == 0
    finally:
        assert stop(proc, timeout=60) == 0, log_tail(proc)  # generous: a loaded 2-core machine


class GatedLog:
    """The real stream, whose replay stops after its first 100 events until `go` is set: a fold caught half way."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.go = asyncio.Event()
        self.held = asyncio.Event()

    async def last_seq(self) -> int:
        return await self.bus.last_seq()

    async def replay(self, from_seq: int = 1) -> AsyncGenerator[list[Envelope], None]:
        passed = 0  # replay's batches have any size (a loaded machine gives short ones): count across them
        async with aclosing(self.bus.replay(from_seq=from_seq)) as batches:
            async for items in batches:
                if not self.go.is_set():
                    take = max(0, 100 - passed)
                    if take:
                        passed += len(items[:take])
                        yield items[:take]
                    items = items[take:]
                    if passed >= 100:
                        self.held.set()
                        await self.go.wait()
                if items:
                    yield items


async def test_the_index_is_ready_once_it_folded_the_log_as_of_its_start(bus: Bus, tmp_path: Path) -> None:
    await bus.append_many(queues(300))
    gated = GatedLog(bus)
    service = IndexService(bus, tmp_path / "index", history=gated)
    registry = ServiceRegistry([bus])
    watch_index(registry, service)
    server = await MetricsServer(registry, host="127.0.0.1", port=0).start()
    url = f"http://127.0.0.1:{server.port}/readyz"
    task = asyncio.create_task(service.run())
    try:
        assert await _get(url) == (503, "index: starting: the log's last position is not read yet\n")
        await gated.held.wait()  # 100 events folded, the rest held back
        await bus.append_many(queues(10, start=300))  # after the start: not part of the target
        assert await _get(url) == (503, "index: catching up: folded seq 100 of 300 (200 behind)\n")
        assert await _gauge(server.port, "index") == 200
        gated.go.set()
        await service.caught_up.wait()
        assert await _get(url) == (200, "ready\n")
        assert await _gauge(server.port, "index") == 0
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await server.close()
