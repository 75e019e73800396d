"""Shared bits of the runtime tests (process and Docker run the same scenarios)."""

from __future__ import annotations

import asyncio
import time

from nodeagent.runtime import Runtime, WorkerHandle, WorkerSpec


async def wait_for_log(runtime: Runtime, handle: WorkerHandle, text: str, timeout: float = 10.0) -> str:
    """Poll the worker's log until `text` shows up: the worker reached a known point."""
    deadline = time.monotonic() + timeout
    while True:
        tail = await runtime.log_tail(handle, 200)
        if text in tail:
            return tail
        if time.monotonic() > deadline:
            raise AssertionError(f"{text!r} not in log after {timeout}s:\n{tail}")
        await asyncio.sleep(0.02)


def spec(command: list[str], *, rank: int = 0, node: str = "n1", job: str = "j1", **kw: object) -> WorkerSpec:
    return WorkerSpec(job_id=job, attempt=1, rank=rank, node_id=node, command=tuple(command), **kw)  # type: ignore[arg-type]
