"""Following the log into a ClusterState: the one fold loop every service shares.

The scheduler, the node agents and the live CLI views all hold the same
projection (`evolve` over the log); this is the IO around it: catch up by the
fast replay path, then tail live, skipping anything already folded (so a
redelivery is never applied twice, DESIGN.md invariant 6).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from events.bus import Bus, Envelope
from orchestrator.core.evolve import evolve
from orchestrator.core.state import ClusterState


def fold_batch(state: ClusterState, batch: list[Envelope]) -> ClusterState:
    """Fold a replay batch into `state`, skipping positions it already holds (every reader's fold loop)."""
    for env in batch:
        if env.seq > state.seq:
            state = evolve(state, env.event, env.seq)
    return state


class Follower:
    def __init__(self, bus: Bus, state: ClusterState | None = None) -> None:
        self.bus = bus
        self.state = state if state is not None else ClusterState()
        #: Set whenever an event was folded; consumers clear it when they have looked.
        self.changed = asyncio.Event()
        self._listeners: list[Callable[[Envelope], None]] = []
        self._seq_waiters: list[tuple[int, asyncio.Future[None]]] = []

    def on_event(self, listener: Callable[[Envelope], None]) -> None:
        """Called after each folded event (for counters, live views)."""
        self._listeners.append(listener)

    def apply(self, env: Envelope) -> bool:
        if env.seq <= self.state.seq:
            return False
        self.state = evolve(self.state, env.event, env.seq)
        for listener in self._listeners:
            listener(env)
        self.changed.set()
        if self._seq_waiters:
            self._wake()
        return True

    def _wake(self) -> None:
        keep = []
        for seq, fut in self._seq_waiters:
            if self.state.seq >= seq:
                if not fut.done():
                    fut.set_result(None)
            else:
                keep.append((seq, fut))
        self._seq_waiters = keep

    async def wait_changed(self, timeout: float) -> None:
        """Until an event is folded (`changed` is set) or `timeout` seconds pass; the caller clears `changed`.

        asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a
        cancellation that arrives just as the event fires, so a loop around it
        that is cancelled while events keep coming (SIGTERM, Ctrl-C, a test's
        deadline) runs on and never stops.
        """
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self.changed.wait()

    async def wait_for_seq(self, seq: int) -> None:
        """Until the fold has reached `seq` (e.g. our own append came back)."""
        if self.state.seq >= seq:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._seq_waiters.append((seq, fut))
        await fut

    async def catch_up(self, to_seq: int | None = None) -> None:
        async for batch in self.bus.replay(from_seq=self.state.seq + 1, to_seq=to_seq):
            self.apply_batch(batch)

    def apply_batch(self, batch: list[Envelope]) -> None:
        """`apply` for a replay batch: the same fold, with one wake-up per batch instead of per event.

        This loop is most of a rebuild's own cost (bench/rebuild.py), so with
        nobody listening per event it calls `evolve` and nothing else.
        """
        if self._listeners:
            for env in batch:
                self.apply(env)
            return
        self.state = fold_batch(self.state, batch)
        self.changed.set()
        if self._seq_waiters:
            self._wake()

    async def follow(self) -> None:
        """Tail the log forever (after `catch_up`)."""
        async for env in self.bus.tail(from_seq=self.state.seq + 1):
            self.apply(env)
