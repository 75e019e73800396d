"""An agent answers `corral logs`: requests on `corral-logs.<node_id>` for its workers' output.

Where the output is: the process runtime writes each worker's stdout and
stderr to `<data_dir>/logs/<worker name>.log` (WorkerSpec.log_dir), which
outlives the worker, so a finished rank's log is still there; a worker the
agent tracks is also asked of its runtime (a container's log, a simulated
worker's lines). A request for the newest generation (`restarts` -1) takes
the highest restart number found either way.

The server answers only on its own node's subject (NATS permissions let an
agent subscribe to nothing else), one chunk per request, at most
LOG_CHUNK_MAX bytes: a large log is read in several requests.

A worker's log is capped and rotated by the process runtime's shim (64 MiB x 4
files by default): offsets stay those of everything the worker wrote, and a
request before the oldest byte still kept is answered from there (the chunk's
`offset` is past the one asked for: the CLI says how much was dropped).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import msgspec
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from events.subjects import log_subject, valid_id
from nodeagent.runtime.base import WorkerHandle, WorkerLabels
from nodeagent.runtime.process import read_log_range
from schemas.logs import LOG_CHUNK_MAX, LogChunk, LogRequest, decode_log_request, encode_log

log = structlog.get_logger("corral.agent")

WorkerKey = tuple[str, int, int]


class _Tracked(Protocol):
    handle: WorkerHandle
    exited: bool


def log_path(log_dir: Path, labels: WorkerLabels) -> Path:
    """Where the process runtime writes a worker's output (ProcessRuntime.start with WorkerSpec.log_dir)."""
    return log_dir / f"{labels.name}.log"


class LogServer:
    """Answers log requests from what `workers()` tracks now and the log files in `log_dir`."""

    def __init__(self, node_id: str, log_dir: Path, runtime: Any,
                 workers: Callable[[], Mapping[WorkerKey, _Tracked]]) -> None:
        self.node_id = node_id
        self.log_dir = log_dir
        self.runtime = runtime
        self.workers = workers

    async def serve(self, nc: NATS) -> Any:
        """Subscribe on this node's log subject; the subscription (unsubscribe it to stop)."""
        return await nc.subscribe(log_subject(self.node_id), cb=self._on_request)

    async def _on_request(self, msg: Msg) -> None:
        if not msg.reply:
            return
        try:
            req = decode_log_request(msg.data)
            answer = await self.answer(req)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            answer = LogChunk(error=f"bad log request: {e}")
        except Exception as e:  # a runtime that fails to read: say so, keep serving
            log.warning("log_request_failed", error=repr(e))
            answer = LogChunk(error=f"the agent on {self.node_id} could not read the log: {e}")
        try:
            await msg.respond(encode_log(answer))
        except Exception as e:  # the requester gave up, the connection is going
            log.debug("log_reply_failed", error=repr(e))

    async def answer(self, req: LogRequest) -> LogChunk:
        if not valid_id(req.job_id) or req.attempt < 1 or req.rank < 0:
            return LogChunk(error=f"bad log request for {req.job_id!r} attempt {req.attempt} rank {req.rank}")
        limit = min(max(req.limit, 0), LOG_CHUNK_MAX)
        tracked = self.workers().get((req.job_id, req.attempt, req.rank))
        files = self._generations(req)
        newest = max([*files, *([tracked.handle.labels.restarts] if tracked is not None else [])], default=None)
        restarts = newest if req.restarts < 0 else req.restarts
        if restarts is None:
            return LogChunk(error=f"no worker of {req.job_id} attempt {req.attempt} rank {req.rank} has run on "
                                  f"{self.node_id} (not started yet, or another node's)")
        running = tracked is not None and tracked.handle.labels.restarts == restarts and not tracked.exited
        path = files.get(restarts)
        if path is not None:
            data, size, at = read_log_range(path, req.offset, limit)
            where = str(path)
        elif tracked is not None and tracked.handle.labels.restarts == restarts and hasattr(self.runtime, "read_log"):
            data, size = await self.runtime.read_log(tracked.handle, req.offset, limit)
            at = min(max(req.offset, 0), size)
            where = f"{type(self.runtime).__name__}:{tracked.handle.worker_id}"
        else:
            return LogChunk(error=f"no log of {req.job_id} attempt {req.attempt} rank {req.rank} restart {restarts} "
                                  f"on {self.node_id} (its runtime keeps none once the worker is removed)")
        return LogChunk(path=where, restarts=restarts, offset=at, next=at + len(data), size=size,
                        running=running, data=data)

    def _generations(self, req: LogRequest) -> dict[int, Path]:
        """restarts -> log file of this (job, attempt, rank) in `log_dir`."""
        stem = WorkerLabels(self.node_id, req.job_id, req.attempt, req.rank, 0).name.removesuffix("-x0")
        pattern = re.compile(re.escape(stem) + r"-x(\d+)\.log")
        out: dict[int, Path] = {}
        try:
            for p in self.log_dir.glob(f"{stem}-x*.log"):
                m = pattern.fullmatch(p.name)
                if m is not None:
                    out[int(m.group(1))] = p
        except OSError:
            pass
        return out
