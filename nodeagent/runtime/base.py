"""The runtime interface the agent programs against.

A worker is identified by its labels (node, job, attempt, rank, restarts),
which every runtime persists with the worker itself (container labels, a state
file). That is what lets `adopt()` find, after an agent restart, every worker
it had started, running or exited meanwhile, so reconciliation neither starts
a duplicate nor leaves an orphan holding GPUs (DESIGN.md invariant 7).
"""

from __future__ import annotations

import asyncio
import re
import signal as signals
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

from schemas.jobspec import Mount

#: Why a worker ended, as far as a runtime can tell. The agent refines "killed"
#: into preempted/cancelled, since only it knows why it sent the signal.
ExitReason = Literal["completed", "crashed", "killed", "lost"]


@dataclass(frozen=True, slots=True)
class WorkerLabels:
    node_id: str
    job_id: str
    attempt: int
    rank: int
    #: How many times the agent restarted this rank within the attempt (policy `rank`).
    restarts: int = 0

    @property
    def name(self) -> str:
        """A stable, filesystem- and Docker-safe name: one worker per labels tuple."""
        raw = f"corral-{self.node_id}-{self.job_id}-a{self.attempt}-r{self.rank}-x{self.restarts}"
        return re.sub(r"[^a-zA-Z0-9_.-]", "_", raw)


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    job_id: str
    attempt: int
    rank: int
    node_id: str
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    #: Container image (Docker runtime); the process runtime ignores it.
    image: str | None = None
    mounts: tuple[Mount, ...] = ()
    #: NVML indices of this worker's GPUs.
    gpus: tuple[int, ...] = ()
    workdir: str | None = None
    #: Process runtime: where the worker's stdout/stderr file goes (default: its state dir).
    log_dir: str | None = None
    #: Mounted read-write (Docker) and created if missing.
    checkpoint_dir: str | None = None
    restarts: int = 0
    #: Ranks in the gang: the Docker runtime picks the network by it (see runtime/docker_options.py).
    world_size: int = 1
    #: The job's /dev/shm size for a container with private IPC; None: the agent's default.
    shm_size_mb: int | None = None
    #: Rank 0 of an interactive job (JobSpec.interactive): "pipe" or "pty" stdin its agent writes
    #: (runtime `send_input`); "": /dev/null.
    stdin: str = ""

    @property
    def labels(self) -> WorkerLabels:
        return WorkerLabels(self.node_id, self.job_id, self.attempt, self.rank, self.restarts)


@dataclass(frozen=True, slots=True)
class WorkerHandle:
    """What the agent keeps: the runtime's id (container id, state dir name) and the labels."""

    worker_id: str
    labels: WorkerLabels


@dataclass(frozen=True, slots=True)
class ExitInfo:
    exit_code: int | None
    signal: int | None
    reason: ExitReason
    log_tail: str = ""

    @classmethod
    def of(cls, exit_code: int | None, signal: int | None, log_tail: str = "") -> ExitInfo:
        """Classify an exit: a signal is "killed", 0 "completed", other codes "crashed", nothing "lost"."""
        if signal is not None:
            return cls(exit_code, signal, "killed", log_tail)
        if exit_code is None:
            return cls(None, None, "lost", log_tail)
        return cls(exit_code, None, "completed" if exit_code == 0 else "crashed", log_tail)


@dataclass(frozen=True, slots=True)
class FoundWorker:
    """A worker `adopt()` found: still running, or exited with what is known of its end."""

    handle: WorkerHandle
    running: bool
    exit: ExitInfo | None = None


class WorkerExists(RuntimeError):
    """A live worker with the same labels exists: starting another would duplicate a rank."""


class WorkerStartError(RuntimeError):
    """The worker could not be started at all (no such command or image, bad mount)."""


class Runtime(Protocol):
    async def start(self, spec: WorkerSpec) -> WorkerHandle:
        """Start a worker; WorkerExists if one with the same labels runs.

        WorkerStartError if it cannot start at all; where the runtime only learns
        that later (Docker's init cannot exec the command) wait() says exit 127.
        """
        ...

    async def wait(self, handle: WorkerHandle) -> ExitInfo:
        """Until the worker ends (also for adopted workers the agent did not spawn)."""
        ...

    async def signal(self, handle: WorkerHandle, sig: int) -> None:
        """Send `sig` to the worker (its whole process group); no-op once it has ended."""
        ...

    async def stop(self, handle: WorkerHandle, grace_s: float) -> ExitInfo:
        """SIGTERM, up to `grace_s` to exit, then SIGKILL."""
        ...

    async def adopt(self) -> list[FoundWorker]:
        """Every worker of this runtime's node that was started and not removed."""
        ...

    async def log_tail(self, handle: WorkerHandle, lines: int = 50) -> str: ...

    async def read_log(self, handle: WorkerHandle, offset: int, limit: int) -> tuple[bytes, int]:
        """At most `limit` bytes of the worker's output from `offset`, and the output's size now
        (`corral logs`, in chunks); (b"", 0) when the runtime keeps none for it."""
        ...

    async def remove(self, handle: WorkerHandle) -> None:
        """Forget an ended worker (container, state files); refuses a running one."""
        ...


async def stop_with_grace(runtime: Runtime, handle: WorkerHandle, grace_s: float) -> ExitInfo:
    """The shared stop sequence: TERM, wait up to `grace_s`, KILL, wait."""
    await runtime.signal(handle, signals.SIGTERM)
    try:
        async with asyncio.timeout(max(grace_s, 0.0)):  # not wait_for: events/swallowed_cancel.py
            return await runtime.wait(handle)
    except TimeoutError:
        await runtime.signal(handle, signals.SIGKILL)
        return await runtime.wait(handle)
