"""Runtimes that remember what they were asked to do, so a test can see real (not logged) starts.

The log cannot show a worker started twice: both copies of its WorkerStarted
carry the same event id and JetStream stores one. Counting at the runtime can.
"""

from __future__ import annotations

from collections import Counter

from nodeagent.runtime.base import WorkerHandle, WorkerLabels, WorkerSpec
from nodeagent.runtime.simulated import SimulatedRuntime


class CountingRuntime(SimulatedRuntime):
    """The simulated runtime, counting every start by worker identity (shared across agents)."""

    def __init__(self, starts: Counter[WorkerLabels]) -> None:
        super().__init__()
        self.starts = starts

    async def start(self, spec: WorkerSpec) -> WorkerHandle:
        self.starts[spec.labels] += 1
        return await super().start(spec)


def started_twice(starts: Counter[WorkerLabels]) -> dict[WorkerLabels, int]:
    return {k: n for k, n in starts.items() if n > 1}
