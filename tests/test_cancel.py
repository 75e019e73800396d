"""Service loops stop when cancelled even where a wait inside swallowed the cancellation (Python 3.11).

nats-py waits with asyncio.wait_for, which on 3.11 returns its result instead
of raising CancelledError when the cancel lands in the same loop iteration as
the result (events/swallowed_cancel.py). The heartbeat monitor's KV watch did: with beats
streaming in, a cancelled scheduler ran on and its teardown hung (CI, fault
suite). These fail (hang past the check) without the fix.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

from events.bus import Bus
from events.swallowed_cancel import stop_if_cancelled
from nodeagent.agent import Agent, AgentConfig
from nodeagent.heartbeat import publish_heartbeats
from nodeagent.runtime.simulated import SimulatedRuntime
from orchestrator.scheduler.health import HeartbeatMonitor
from orchestrator.scheduler.service import Scheduler, SchedulerConfig
from schemas.heartbeat import HEARTBEAT_BUCKET
from tests.core.harness import inventory


async def _stops_when_cancelled(task: asyncio.Task[None], seconds: float = 3.0) -> bool:
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=seconds)
    return bool(done) and task.cancelled()


async def test_heartbeat_monitor_and_publisher_stop_when_cancelled_while_beats_stream_in(bus: Bus) -> None:
    kv = await bus.kv(HEARTBEAT_BUCKET)
    stream = asyncio.create_task(publish_heartbeats(kv, "n0", "1", 0.0005))  # a beat every loop turn or so
    try:
        for trial in range(30):  # the swallow needs the cancel and a beat in one turn: try many times
            monitor = asyncio.create_task(HeartbeatMonitor(kv, 3.0).run())
            publisher = asyncio.create_task(publish_heartbeats(kv, "n1", "1", 0.0))
            await asyncio.sleep(0.05 + 0.003 * trial)
            stopped = [await _stops_when_cancelled(monitor), await _stops_when_cancelled(publisher)]
            assert stopped == [True, True], f"trial {trial}: a cancelled loop ran on (monitor, publisher): {stopped}"
    finally:
        stream.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(asyncio.gather(stream, return_exceptions=True), 5)


async def test_stop_if_cancelled_ends_a_loop_whose_wait_swallowed_the_cancel() -> None:
    ready = asyncio.Event()

    async def busy() -> None:
        while True:
            ready.set()
            await asyncio.sleep(0)

    async def loop() -> None:
        while True:
            stop_if_cancelled()
            ready.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ready.wait(), 0.5)  # the 3.11 wait that swallows

    setter = asyncio.create_task(busy())
    try:
        for _ in range(10):
            task = asyncio.create_task(loop())
            await asyncio.sleep(0.01)
            assert await _stops_when_cancelled(task)
    finally:
        setter.cancel()
        await asyncio.gather(setter, return_exceptions=True)


def _swallow_the_cancel_in(monkeypatch: pytest.MonkeyPatch, bus: Bus, bucket: str) -> asyncio.Event:
    """`bus.kv(bucket)` answers as nats-py's waits do on 3.11 when a cancel lands with the reply: the
    result, no CancelledError. Its caller was asked to stop, and nothing it awaits afterwards says so."""
    real, swallowed = bus.kv, asyncio.Event()

    async def kv(name: str, **kwargs: Any) -> Any:
        result = await real(name, **kwargs)
        if name != bucket:
            return result
        loop, me = asyncio.get_running_loop(), asyncio.current_task()
        reply: asyncio.Future[Any] = loop.create_future()
        assert me is not None

        def both_at_once() -> None:
            reply.set_result(result)
            me.cancel()
            swallowed.set()

        loop.call_soon(both_at_once)
        return await asyncio.wait_for(reply, 5)  # the 3.11 wait that swallows

    monkeypatch.setattr(bus, "kv", kv)
    return swallowed


@pytest.mark.parametrize("service", ["agent", "scheduler"])
async def test_a_service_asked_to_stop_during_its_start_up_stops(
    service: str, bus: Bus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGTERM that lands while the start-up awaits its last request (CI: an agent stopped just after it
    registered ran on past 60 s): the service loops must not start."""
    swallowed = _swallow_the_cancel_in(monkeypatch, bus, HEARTBEAT_BUCKET)
    if service == "agent":
        run = Agent(bus, AgentConfig(node_id="n0", data_dir=tmp_path), inventory(2), SimulatedRuntime()).run()
    else:
        run = Scheduler(bus, SchedulerConfig(tick_s=0.2)).run()
    task = asyncio.ensure_future(run)
    await asyncio.wait_for(swallowed.wait(), 30)
    done, _ = await asyncio.wait([task], timeout=5)
    if not done:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert done and task.cancelled(), f"the {service} ran on after its start-up swallowed the stop"
