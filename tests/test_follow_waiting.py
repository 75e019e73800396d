"""Waiting on the fold while events keep coming: a deadline or a cancellation must still end the wait.

Python 3.11's asyncio.wait_for swallows a cancellation that arrives just as the
awaited event fires. A loop of such waits, cancelled while events stream in,
ran on: the scheduler and agents would not stop on SIGTERM, and a stuck
integration test hung until pytest's 300 s timeout instead of failing at its
own deadline (seen in CI). These fail (hang past the check) with wait_for.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from events.follow import Follower
from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import ClusterState
from tests.integration.harness import wait_until


@pytest.fixture
async def busy_follower() -> AsyncIterator[Follower[ClusterState]]:
    """A follower whose `changed` fires at every turn of the event loop, as under a stream of events."""
    f = Follower(None, evolve, ClusterState())  # type: ignore[arg-type]  # never reads the log here

    async def fold_forever() -> None:
        while True:
            f.changed.set()
            await asyncio.sleep(0)

    task = asyncio.create_task(fold_forever())
    yield f
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _ends_within(task: asyncio.Task[None], seconds: float) -> bool:
    done, _ = await asyncio.wait([task], timeout=seconds)
    return bool(done)


async def test_wait_until_fails_at_its_deadline_while_events_keep_coming(busy_follower: Follower[ClusterState]) -> None:
    give_up = False  # a hung wait is ended by its predicate, not by cancelling it (which it would swallow)
    waiter = asyncio.create_task(wait_until(busy_follower, lambda s: give_up, 0.2, "something that never holds"))
    ended = await _ends_within(waiter, 5.0)
    if not ended:
        give_up = True
        await asyncio.gather(waiter, return_exceptions=True)
    assert ended, "wait_until ran past its 0.2 s deadline: the deadline's cancellation was swallowed"
    with pytest.raises(AssertionError, match=r"timed out after 0.2s waiting for something that never holds"):
        waiter.result()


async def test_a_loop_of_wait_changed_stops_when_cancelled_while_events_keep_coming(
        busy_follower: Follower[ClusterState]) -> None:
    turns = 0
    stop = False  # a hung loop is ended by this flag, not by cancelling it (which it would swallow)

    async def service_loop() -> None:  # the shape of the scheduler's and the agents' loops
        nonlocal turns
        while not stop:
            await busy_follower.wait_changed(0.5)
            busy_follower.changed.clear()
            turns += 1

    for _ in range(20):  # the swallow needs the cancel and the event in one turn: try it many times
        task = asyncio.create_task(service_loop())
        await asyncio.sleep(0.01)
        task.cancel()
        ended = await _ends_within(task, 2.0)
        if not ended:
            stop = True
            await asyncio.gather(task, return_exceptions=True)
        assert ended, "a cancelled loop of waits ran on: the cancellation was swallowed"
        assert task.cancelled()
    assert turns > 0
