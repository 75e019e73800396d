"""Where workers run: one `Runtime` protocol, a local-process and a Docker implementation."""

from nodeagent.runtime.base import (
    ExitInfo,
    FoundWorker,
    Runtime,
    WorkerExists,
    WorkerHandle,
    WorkerLabels,
    WorkerSpec,
    WorkerStartError,
)

__all__ = [
    "ExitInfo",
    "FoundWorker",
    "Runtime",
    "WorkerExists",
    "WorkerHandle",
    "WorkerLabels",
    "WorkerSpec",
    "WorkerStartError",
]
