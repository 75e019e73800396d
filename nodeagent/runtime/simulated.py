"""Simulated workers: no process, just a timer. For scale tests and large simulated clusters.

A worker "runs" for the seconds given by a `sleep N` command (0 for anything
else) and exits 0; a signal ends it at once (SIGTERM/SIGKILL as killed, the
checkpoint signal as a clean exit, like the example worker). It keeps nothing
on disk, so `adopt()` after an agent restart finds nothing: use the process or
Docker runtime where agent restarts matter.
"""

from __future__ import annotations

import asyncio
import signal as signals
from dataclasses import dataclass, field

from nodeagent.runtime.base import ExitInfo, FoundWorker, WorkerExists, WorkerHandle, WorkerSpec, WorkerStartError


def _duration(command: tuple[str, ...]) -> float:
    if len(command) == 2 and command[0] == "sleep":
        try:
            return max(0.0, float(command[1]))
        except ValueError:
            raise WorkerStartError(f"sleep: bad duration {command[1]!r}") from None
    return 0.0


@dataclass
class _SimWorker:
    spec: WorkerSpec
    done: asyncio.Future[ExitInfo]
    timer: asyncio.TimerHandle | None = None
    log: list[str] = field(default_factory=list)


class SimulatedRuntime:
    def __init__(self) -> None:
        self._workers: dict[str, _SimWorker] = {}

    async def start(self, spec: WorkerSpec) -> WorkerHandle:
        if not spec.command:
            raise WorkerStartError("empty command")
        wid = spec.labels.name
        old = self._workers.get(wid)
        if old is not None and not old.done.done():
            raise WorkerExists(f"worker {wid} is running")
        loop = asyncio.get_running_loop()
        w = _SimWorker(spec, loop.create_future())
        w.timer = loop.call_later(_duration(spec.command), self._finish, w, ExitInfo.of(0, None))
        self._workers[wid] = w
        return WorkerHandle(wid, spec.labels)

    @staticmethod
    def _finish(w: _SimWorker, info: ExitInfo) -> None:
        if not w.done.done():
            w.done.set_result(info)
        if w.timer is not None:
            w.timer.cancel()

    async def wait(self, handle: WorkerHandle) -> ExitInfo:
        w = self._workers.get(handle.worker_id)
        if w is None:
            return ExitInfo.of(None, None)
        return await asyncio.shield(w.done)

    async def signal(self, handle: WorkerHandle, sig: int) -> None:
        w = self._workers.get(handle.worker_id)
        if w is None or w.done.done():
            return
        if sig in (signals.SIGTERM, signals.SIGKILL, signals.SIGINT):
            self._finish(w, ExitInfo.of(None, int(sig)))
        else:  # a checkpoint signal: the toy worker saves and exits cleanly
            self._finish(w, ExitInfo.of(0, None))

    async def stop(self, handle: WorkerHandle, grace_s: float) -> ExitInfo:
        await self.signal(handle, signals.SIGTERM)
        return await self.wait(handle)

    async def adopt(self) -> list[FoundWorker]:
        return []

    async def log_tail(self, handle: WorkerHandle, lines: int = 50) -> str:
        return ""

    async def read_log(self, handle: WorkerHandle, offset: int, limit: int) -> tuple[bytes, int]:
        w = self._workers.get(handle.worker_id)
        data = "".join(f"{line}\n" for line in w.log).encode() if w is not None else b""
        return data[max(offset, 0):max(offset, 0) + max(limit, 0)], len(data)

    async def remove(self, handle: WorkerHandle) -> None:
        w = self._workers.get(handle.worker_id)
        if w is not None and w.done.done():
            del self._workers[handle.worker_id]
