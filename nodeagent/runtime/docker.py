"""Workers as Docker containers (docker SDK), one per rank.

Every blocking SDK call runs in a thread (asyncio.to_thread) so a slow engine
never stalls the agent's event loop. Containers carry the labels
corral.managed/node/job/attempt/rank/restarts, which is all `adopt()` needs
after an agent restart. Images are never pulled: `create` fails fast on a
missing image instead of reaching for a registry from a GPU node.

Network, IPC, RDMA devices and GPUs follow `DockerOptions` (docker_options.py).
Bind mounts keep host paths: a checkpoint directory is mounted at the same
path inside the container, so the manifest a worker writes names a path the
agent (and the next attempt) can read. That path must be one the Docker
daemon sees: an agent that itself runs in a container needs its checkpoint
root bind-mounted at the same path (deploy/README.md).

Exit codes: with `init=True` (docker-init as PID 1, so the worker gets normal
signal semantics and zombies are reaped) a worker killed by signal N exits
128+N. Docker cannot tell that from a worker that chose to exit 128+N, so
codes 129..192 are reported as `signal=N` with the raw `exit_code` kept.
"""

from __future__ import annotations

import asyncio
import signal as signals
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests.exceptions
from docker.models.containers import Container
from docker.types import Mount

from nodeagent.runtime.base import (
    ExitInfo,
    FoundWorker,
    WorkerExists,
    WorkerHandle,
    WorkerLabels,
    WorkerSpec,
    WorkerStartError,
    stop_with_grace,
)
from nodeagent.runtime.docker_options import DockerOptions, host_options
from schemas.jobspec import Mount as SpecMount

LABEL_PREFIX = "corral."
MANAGED = f"{LABEL_PREFIX}managed"
_LIVE_STATES = {"running", "restarting", "paused"}


def container_labels(labels: WorkerLabels) -> dict[str, str]:
    return {
        MANAGED: "true",
        f"{LABEL_PREFIX}node": labels.node_id,
        f"{LABEL_PREFIX}job": labels.job_id,
        f"{LABEL_PREFIX}attempt": str(labels.attempt),
        f"{LABEL_PREFIX}rank": str(labels.rank),
        f"{LABEL_PREFIX}restarts": str(labels.restarts),
    }


def labels_of(container_labels: dict[str, str]) -> WorkerLabels:
    get = container_labels.get
    return WorkerLabels(
        node_id=get(f"{LABEL_PREFIX}node", ""),
        job_id=get(f"{LABEL_PREFIX}job", ""),
        attempt=int(get(f"{LABEL_PREFIX}attempt", "0")),
        rank=int(get(f"{LABEL_PREFIX}rank", "0")),
        restarts=int(get(f"{LABEL_PREFIX}restarts", "0")),
    )


def create_kwargs(spec: WorkerSpec, *, init: bool = True, options: DockerOptions | None = None) -> dict[str, Any]:
    """The `containers.create` arguments for a worker: pure, so every option is testable anywhere."""
    if not spec.image:
        raise WorkerStartError(f"rank {spec.rank} of {spec.job_id}: the Docker runtime needs an image")
    kwargs: dict[str, Any] = {
        "image": spec.image,
        "command": list(spec.command) or None,
        "name": spec.labels.name,
        "labels": container_labels(spec.labels),
        "mounts": worker_mounts(spec),
        "working_dir": spec.workdir,
        "init": init,
        "detach": True,
    }
    kwargs.update(host_options(spec, options or DockerOptions()))
    return kwargs


def worker_mounts(spec: WorkerSpec) -> list[Mount]:
    """The job's mounts, its checkpoint dir (read-write) and the one it resumes from (read-only).

    Both at their host paths. The checkpoint to resume from (CORRAL_RESUME_FROM) was written
    by an earlier attempt, possibly by another rank, in a directory this rank's own
    checkpoint mount does not cover.
    """
    mounts = [Mount(target=m.target, source=m.source, type="bind", read_only=m.read_only) for m in spec.mounts]
    if spec.checkpoint_dir and not _covered(spec.checkpoint_dir, spec.mounts, exact=True):
        mounts.append(Mount(target=spec.checkpoint_dir, source=spec.checkpoint_dir, type="bind", read_only=False))
    resume = spec.env.get("CORRAL_RESUME_FROM")
    if resume and resume.startswith("/"):
        resume_dir = str(Path(resume).parent)
        shown = [*spec.mounts, *([SpecMount(source=spec.checkpoint_dir, target=spec.checkpoint_dir)]
                                 if spec.checkpoint_dir else [])]
        if not _covered(resume_dir, shown, exact=False):
            mounts.append(Mount(target=resume_dir, source=resume_dir, type="bind", read_only=True))
    return mounts


def _covered(path: str, mounts: Iterable[SpecMount], *, exact: bool) -> bool:
    """Whether `path` is a mount's target (`exact`), or lies under one that shows the same host path."""
    p = Path(path)
    for m in mounts:
        if m.target == path:
            return True
        if not exact and m.source == m.target and p.is_relative_to(m.target):
            return True
    return False


def exit_info_of(state: dict[str, Any], log_tail: str = "") -> ExitInfo:
    """ExitInfo from a container's State (see the module note on 128+N)."""
    if state.get("Status") == "created":  # never started (an agent died between create and start)
        return ExitInfo.of(None, None, log_tail)
    code = state.get("ExitCode")
    if state.get("OOMKilled"):
        return ExitInfo(code, signals.SIGKILL, "killed", log_tail)
    if isinstance(code, int) and 128 < code <= 128 + 64:
        return ExitInfo(code, code - 128, "killed", log_tail)
    return ExitInfo.of(code if isinstance(code, int) else None, None, log_tail)


class DockerRuntime:
    """Runs each worker as a labelled container; `node_id` scopes adopt() to this node's workers."""

    def __init__(
        self,
        client: docker.DockerClient | None = None,
        *,
        node_id: str | None = None,
        init: bool = True,
        wait_poll_s: float = 1.0,
        options: DockerOptions | None = None,
    ) -> None:
        self._client = client
        self.node_id = node_id
        self.init = init
        self.options = options or DockerOptions()
        self.wait_poll_s = wait_poll_s

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            self._client = docker.from_env()
        return self._client

    async def _container(self, handle: WorkerHandle) -> Container:
        c: Container = await asyncio.to_thread(self.client.containers.get, handle.worker_id)
        return c

    async def start(self, spec: WorkerSpec) -> WorkerHandle:
        kwargs = create_kwargs(spec, init=self.init, options=self.options)
        if spec.checkpoint_dir:
            Path(spec.checkpoint_dir).mkdir(parents=True, exist_ok=True)
        container = await self._create(kwargs)
        try:
            await asyncio.to_thread(container.start)
        except docker.errors.APIError as e:
            await asyncio.to_thread(container.remove, force=True)
            raise WorkerStartError(f"{kwargs['name']}: {e.explanation or e}") from e
        return WorkerHandle(container.id or "", spec.labels)

    async def _create(self, kwargs: dict[str, Any]) -> Container:
        """Create the container; an ended one of the same name is replaced, a live one refused."""
        for _ in range(2):
            try:
                c: Container = await asyncio.to_thread(self.client.containers.create, **kwargs)
                return c
            except docker.errors.ImageNotFound as e:
                raise WorkerStartError(f"image {kwargs['image']!r} not found on this node (never pulled)") from e
            except docker.errors.APIError as e:
                if e.status_code != 409:
                    raise WorkerStartError(f"{kwargs['name']}: {e.explanation or e}") from e
                old: Container = await asyncio.to_thread(self.client.containers.get, kwargs["name"])
                if old.status in _LIVE_STATES:
                    raise WorkerExists(f"container {kwargs['name']} is {old.status}") from e
                await asyncio.to_thread(old.remove, force=True)
        raise WorkerExists(f"container {kwargs['name']} keeps coming back")

    async def wait(self, handle: WorkerHandle) -> ExitInfo:
        # Short server-side waits in a loop: a cancelled wait then frees its thread within wait_poll_s.
        while True:
            try:
                container = await self._container(handle)
                await asyncio.to_thread(container.wait, timeout=self.wait_poll_s)
                break
            except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
                continue
            except docker.errors.NotFound:
                return ExitInfo.of(None, None)  # removed behind our back: lost
        await asyncio.to_thread(container.reload)
        return exit_info_of(container.attrs.get("State", {}), await self.log_tail(handle))

    async def signal(self, handle: WorkerHandle, sig: int) -> None:
        try:
            container = await self._container(handle)
            await asyncio.to_thread(container.kill, signal=int(sig))
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as e:
            if e.status_code != 409:  # 409: not running, nothing to signal
                raise

    async def stop(self, handle: WorkerHandle, grace_s: float) -> ExitInfo:
        return await stop_with_grace(self, handle, grace_s)

    async def adopt(self) -> list[FoundWorker]:
        filters = [f"{MANAGED}=true"]
        if self.node_id is not None:
            filters.append(f"{LABEL_PREFIX}node={self.node_id}")
        containers: list[Container] = await asyncio.to_thread(
            self.client.containers.list, all=True, filters={"label": filters}
        )
        found = []
        for c in sorted(containers, key=lambda c: c.name or ""):
            handle = WorkerHandle(c.id or "", labels_of(c.labels))
            if c.status in _LIVE_STATES:
                found.append(FoundWorker(handle, True))
            else:
                found.append(
                    FoundWorker(handle, False, exit_info_of(c.attrs.get("State", {}), await self.log_tail(handle)))
                )
        return found

    async def log_tail(self, handle: WorkerHandle, lines: int = 50) -> str:
        if lines <= 0:
            return ""
        try:
            container = await self._container(handle)
            raw: bytes = await asyncio.to_thread(container.logs, stdout=True, stderr=True, tail=lines)
        except docker.errors.NotFound:
            return ""
        except docker.errors.APIError as e:
            if e.status_code != 409:  # 409: being removed ("dead or marked for removal"), its logs with it
                raise
            return ""
        return raw.decode(errors="replace").rstrip("\n")

    async def read_log(self, handle: WorkerHandle, offset: int, limit: int) -> tuple[bytes, int]:
        """The container's output (the engine keeps it until the container is removed), read whole and cut."""
        try:
            container = await self._container(handle)
            raw: bytes = await asyncio.to_thread(container.logs, stdout=True, stderr=True)
        except docker.errors.NotFound:
            return b"", 0
        except docker.errors.APIError as e:
            if e.status_code != 409:
                raise
            return b"", 0
        start = min(max(offset, 0), len(raw))
        return raw[start:start + max(limit, 0)], len(raw)

    async def remove(self, handle: WorkerHandle) -> None:
        try:
            container = await self._container(handle)
        except docker.errors.NotFound:
            return
        if container.status in _LIVE_STATES:
            raise WorkerExists(f"container {container.name} is still {container.status}")
        await asyncio.to_thread(container.remove, force=True)
