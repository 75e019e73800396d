"""Keeps one rank running under restart policy `rank`: crash -> backoff -> restart, up to a limit.

Generic over runtimes (anything implementing `nodeagent.runtime.Runtime`).
Policies `never` and `gang` use it with `max_restarts=0`: the agent reports
the exit and the scheduler decides (GangRestarted restarts every rank
together as a new attempt). Each restart is a new worker with `restarts`
bumped in its labels, so adopt() after an agent restart can tell the
generations apart; an ended generation is removed once `on_exited` returned,
i.e. once the agent has recorded it.

`stop()` is the only way to end a supervised rank early (preemption,
cancellation): it forbids further restarts first, then stops the worker, so
the exit it causes is never mistaken for a crash to restart.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from nodeagent.backoff import Backoff
from nodeagent.runtime.base import ExitInfo, Runtime, WorkerHandle, WorkerSpec, WorkerStartError

OnStarted = Callable[[WorkerHandle, int], Awaitable[None]]
OnExited = Callable[[WorkerHandle | None, ExitInfo, int, bool], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class SupervisorResult:
    exits: tuple[ExitInfo, ...]
    #: Restarts performed (not counting the first start).
    restarts: int
    #: It crashed with no restarts left.
    gave_up: bool
    #: Ended by stop(), not by itself.
    stopped: bool

    @property
    def final(self) -> ExitInfo | None:
        return self.exits[-1] if self.exits else None


class Supervisor:
    def __init__(
        self,
        runtime: Runtime,
        spec: WorkerSpec,
        *,
        max_restarts: int,
        backoff: Backoff | None = None,
        adopted: WorkerHandle | None = None,
        on_started: OnStarted | None = None,
        on_exited: OnExited | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`adopted`: a running worker of this rank found by adopt(); watched first instead of started.

        `on_started(handle, restarts)` and `on_exited(handle, exit, restarts, will_restart)` are
        awaited, so the agent can append WorkerStarted / WorkerExited before anything else happens.
        """
        if max_restarts < 0:
            raise ValueError("max_restarts must be >= 0")
        self.runtime = runtime
        self.spec = spec
        self.max_restarts = max_restarts
        self.backoff = backoff or Backoff()
        self._adopted = adopted
        self._on_started = on_started
        self._on_exited = on_exited
        self._sleep = sleep
        self._clock = clock
        self._stopping = asyncio.Event()
        self._grace_s = 0.0
        self._stop_task: asyncio.Future[ExitInfo] | None = None
        self.handle: WorkerHandle | None = None

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def run(self) -> SupervisorResult:
        exits: list[ExitInfo] = []
        generation = self._adopted.labels.restarts if self._adopted else self.spec.restarts
        first = generation
        while not self.stopping:
            handle, exit_info = await self._run_once(generation)
            exits.append(exit_info)
            done = generation - first
            will_restart = not self.stopping and exit_info.reason != "completed" and done < self.max_restarts
            if self._on_exited is not None:
                await self._on_exited(handle, exit_info, generation, will_restart)
            if self._stop_task is not None:  # let stop() see the exit before the worker is removed
                await asyncio.gather(asyncio.shield(self._stop_task), return_exceptions=True)
            if handle is not None:
                await self.runtime.remove(handle)
            if not will_restart:
                gave_up = not self.stopping and exit_info.reason != "completed"
                return SupervisorResult(tuple(exits), done, gave_up, self.stopping)
            await self._pause(self.backoff.failed(self._clock()))
            generation += 1
        return SupervisorResult(tuple(exits), generation - first, False, True)

    async def _run_once(self, generation: int) -> tuple[WorkerHandle | None, ExitInfo]:
        adopted, self._adopted = self._adopted, None
        if adopted is not None:
            handle = adopted
        else:
            try:
                handle = await self.runtime.start(replace(self.spec, restarts=generation))
            except WorkerStartError as e:
                return None, ExitInfo(127, None, "crashed", str(e))
        self.handle = handle  # before any await, so a concurrent stop() finds it
        try:
            if adopted is None and self._on_started is not None:
                await self._on_started(handle, generation)
            self.backoff.started(self._clock())
            if self.stopping:  # stop() came while the worker was being started
                return handle, await self.runtime.stop(handle, self._grace_s)
            return handle, await self.runtime.wait(handle)
        finally:
            self.handle = None

    async def _pause(self, delay: float) -> None:
        """Sleep `delay` unless stop() comes first."""
        sleeper = asyncio.ensure_future(self._sleep(delay))
        stopper = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({sleeper, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (sleeper, stopper):
                t.cancel()
            await asyncio.gather(sleeper, stopper, return_exceptions=True)

    async def stop(self, grace_s: float) -> ExitInfo | None:
        """No more restarts; stop the current worker (TERM, grace, KILL). Idempotent."""
        self._grace_s = grace_s
        self._stopping.set()
        handle = self.handle
        if handle is None:
            return None
        task = asyncio.ensure_future(self.runtime.stop(handle, grace_s))
        self._stop_task = task
        return await task
