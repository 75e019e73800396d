"""The restart supervisor, run over both runtimes with the same scenarios."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nodeagent.backoff import Backoff
from nodeagent.runtime import ExitInfo, Runtime, WorkerHandle, WorkerSpec
from nodeagent.runtime.docker import DockerRuntime
from nodeagent.runtime.process import ProcessRuntime
from nodeagent.supervisor import Supervisor
from tests.agent.runtime_helpers import spec, wait_for_log


@pytest.fixture(params=["process", pytest.param("docker", marks=pytest.mark.docker)])
def runtime_and_spec(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Runtime, dict[str, Any]]]:
    """(runtime, extra WorkerSpec fields): busybox `sh` in Docker, the host's `sh` locally."""
    if request.param == "process":
        yield ProcessRuntime(tmp_path / "state", node_id="n1"), {"node": "n1"}
    else:
        client = request.getfixturevalue("docker_client")
        image = request.getfixturevalue("busybox_image")
        node = request.getfixturevalue("docker_node")
        yield DockerRuntime(client, node_id=node), {"node": node, "image": image}


class Recorder:
    """Stands in for the agent: what would be appended as WorkerStarted / WorkerExited."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.delays: list[float] = []

    async def started(self, handle: WorkerHandle, restarts: int) -> None:
        self.events.append(("started", restarts))

    async def exited(self, handle: WorkerHandle | None, info: ExitInfo, restarts: int, will_restart: bool) -> None:
        self.events.append(("exited", restarts, info.exit_code, will_restart))

    async def sleep(self, delay: float) -> None:
        self.delays.append(delay)


def _supervisor(rt: Runtime, s: WorkerSpec, rec: Recorder, max_restarts: int) -> Supervisor:
    backoff = Backoff(base_s=0.01, factor=2, cap_s=1, jitter=0.5, rand=lambda: 0.5)  # 0.5: no jitter
    return Supervisor(rt, s, max_restarts=max_restarts, backoff=backoff, on_started=rec.started,
                      on_exited=rec.exited, sleep=rec.sleep)  # fmt: skip


async def test_crash_loop_backs_off_and_gives_up(runtime_and_spec: tuple[Runtime, dict[str, Any]]) -> None:
    rt, extra = runtime_and_spec
    rec = Recorder()
    result = await asyncio.wait_for(_supervisor(rt, spec(["sh", "-c", "echo boom; exit 3"], **extra), rec, 3).run(), 60)
    assert result.gave_up and not result.stopped and result.restarts == 3
    assert [e.exit_code for e in result.exits] == [3, 3, 3, 3]
    assert rec.delays == [0.01, 0.02, 0.04]
    assert rec.events == [
        ("started", 0), ("exited", 0, 3, True), ("started", 1), ("exited", 1, 3, True),
        ("started", 2), ("exited", 2, 3, True), ("started", 3), ("exited", 3, 3, False),
    ]  # fmt: skip
    assert "boom" in result.exits[-1].log_tail
    assert await rt.adopt() == []  # every generation was removed once reported


async def test_success_after_a_crash_stops_restarting(
    runtime_and_spec: tuple[Runtime, dict[str, Any]], tmp_path: Path
) -> None:
    rt, extra = runtime_and_spec
    marker = tmp_path / "ck"
    # first run crashes and leaves a marker in the (read-write) checkpoint dir; the second succeeds
    script = f"if [ -e {marker}/seen ]; then echo ok; else touch {marker}/seen; exit 1; fi"
    rec = Recorder()
    s = spec(["sh", "-c", script], checkpoint_dir=str(marker), **extra)
    result = await asyncio.wait_for(_supervisor(rt, s, rec, 5).run(), 60)
    assert not result.gave_up and result.restarts == 1 and result.final is not None
    assert result.final.reason == "completed" and [e.exit_code for e in result.exits] == [1, 0]


async def test_never_policy_runs_once(runtime_and_spec: tuple[Runtime, dict[str, Any]]) -> None:
    rt, extra = runtime_and_spec
    result = await asyncio.wait_for(_supervisor(rt, spec(["sh", "-c", "exit 2"], **extra), Recorder(), 0).run(), 60)
    assert result.gave_up and result.restarts == 0 and len(result.exits) == 1


async def test_stop_ends_without_restart(runtime_and_spec: tuple[Runtime, dict[str, Any]]) -> None:
    rt, extra = runtime_and_spec
    rec = Recorder()
    sup = _supervisor(rt, spec(["sh", "-c", "echo ready; sleep 30"], **extra), rec, 5)
    task = asyncio.create_task(sup.run())
    for _ in range(1000):
        if sup.handle is not None:
            break
        await asyncio.sleep(0.01)
    assert sup.handle is not None
    await wait_for_log(rt, sup.handle, "ready", 30)
    info = await sup.stop(grace_s=5)
    assert info is not None and info.reason == "killed"
    result = await asyncio.wait_for(task, 30)
    assert result.stopped and not result.gave_up and result.restarts == 0
    assert rec.events[-1][-1] is False  # the exit we caused is not a crash to restart
    assert await sup.stop(1) is None  # idempotent


async def test_stop_during_backoff_cancels_the_restart(tmp_path: Path) -> None:
    rt = ProcessRuntime(tmp_path / "state")
    gate = asyncio.Event()
    rec = Recorder()

    async def slow_sleep(delay: float) -> None:
        gate.set()
        await asyncio.sleep(30)

    sup = Supervisor(rt, spec(["sh", "-c", "exit 1"]), max_restarts=5, sleep=slow_sleep,
                     on_started=rec.started, on_exited=rec.exited)  # fmt: skip
    task = asyncio.create_task(sup.run())
    await asyncio.wait_for(gate.wait(), 10)
    assert await sup.stop(1) is None
    result = await asyncio.wait_for(task, 5)
    assert result.stopped and len(result.exits) == 1 and [e[0] for e in rec.events] == ["started", "exited"]


async def test_adopted_worker_is_watched_not_restarted_twice(tmp_path: Path) -> None:
    rt = ProcessRuntime(tmp_path / "state")
    h = await rt.start(spec(["sh", "-c", "sleep 0.2; exit 9"], restarts=2))
    (found,) = await ProcessRuntime(tmp_path / "state").adopt()
    rec = Recorder()
    sup = Supervisor(rt, spec(["sh", "-c", "exit 0"]), max_restarts=3, adopted=found.handle,
                     backoff=Backoff(base_s=0, jitter=0), on_started=rec.started, on_exited=rec.exited, sleep=rec.sleep)  # fmt: skip
    result = await asyncio.wait_for(sup.run(), 30)
    assert found.handle.worker_id == h.worker_id
    assert [e.exit_code for e in result.exits] == [9, 0]
    assert rec.events == [("exited", 2, 9, True), ("started", 3), ("exited", 3, 0, False)]
