"""An agent takes a job's input for its rank 0: requests on `corral-stdin.<node_id>.<job_id>` (schemas/stdin.py).

`corral run` (not `--detach`) submits its job interactive (JobSpec.interactive)
and sends what it reads from its stdin to the agent of rank 0's node, one chunk
per request. The agent writes a chunk only when all of these hold, else it
answers why not:
- the request's key hashes to the job's `key_sha256` (only the `corral run`
  that submitted the job holds the key; the log holds its hash);
- it names the job's current attempt, whose rank 0 runs here and still runs;
- the runtime takes input (the process runtime: a FIFO its shim relays to the
  worker's stdin, runtime/stdin_fifo.py).
It writes what the worker's pipe takes now and answers how much (`taken`),
never buffering more than the pipe holds. The server answers only on its own
node's subjects (deploy/nats: an agent may subscribe to nothing else).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import msgspec
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from events.subjects import STDIN, check_id
from nodeagent.runtime.base import WorkerHandle, WorkerSpec
from nodeagent.runtime.stdin_fifo import InputClosed
from orchestrator.core.model.slices import NodeJob
from schemas.jobspec import Interactive
from schemas.stdin import (
    ENDED,
    NOT_RUNNING,
    WRONG_ATTEMPT,
    StdinAck,
    StdinChunk,
    decode_stdin_chunk,
    encode_stdin,
    key_hash,
)

log = structlog.get_logger("corral.agent")

WorkerKey = tuple[str, int, int]


class _Tracked(Protocol):
    handle: WorkerHandle
    spec: WorkerSpec
    exited: bool
    ending: str | None


def stdin_mode(job: NodeJob, rank: int, on_host: bool) -> str:
    """How a worker of `job`'s `rank` gets its stdin (WorkerSpec.stdin): "pipe" or "pty" for rank 0 of an
    interactive job on a runtime that runs it on this host, else "" (/dev/null)."""
    it = job.spec.interactive
    if rank != 0 or not on_host or not isinstance(it, Interactive):
        return ""
    return "pty" if it.pty else "pipe"


class StdinServer:
    """Answers input requests from what `workers()` tracks and the jobs `work()` places here."""

    def __init__(self, node_id: str, runtime: Any, workers: Callable[[], Mapping[WorkerKey, _Tracked]],
                 work: Callable[[], Mapping[str, NodeJob]]) -> None:
        self.node_id = check_id(node_id, "node id")
        self.runtime = runtime
        self.workers = workers
        self.work = work
        #: (job, attempt) -> the last answer: a request sent again (its answer was lost) gets it again.
        self._last: dict[tuple[str, int], StdinAck] = {}
        self._locks: dict[tuple[str, int], asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def serve(self, nc: NATS) -> Any:
        """Subscribe on this node's stdin subjects; the subscription (unsubscribe it to stop)."""
        return await nc.subscribe(f"{STDIN}.{self.node_id}.*", cb=self._on_request)

    async def _on_request(self, msg: Msg) -> None:
        # Each request in its own task: a worker that does not read holds up its own job's input only.
        task = asyncio.ensure_future(self._respond(msg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _respond(self, msg: Msg) -> None:
        if not msg.reply:
            return
        try:
            chunk = decode_stdin_chunk(msg.data)
            if msg.subject.rsplit(".", 1)[-1] != chunk.job_id:
                answer = StdinAck(error=f"input for job {chunk.job_id!r} sent on {msg.subject}", closed=True)
            else:
                answer = await self.answer(chunk)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            answer = StdinAck(error=f"bad input request: {e}", closed=True)
        except Exception as e:  # a runtime that fails to write: say so, keep serving
            log.warning("stdin_request_failed", error=repr(e))
            answer = StdinAck(error=f"the agent on {self.node_id} could not write the input: {e}", closed=True)
        try:
            await msg.respond(encode_stdin(answer))
        except Exception as e:  # the sender gave up, the connection is going
            log.debug("stdin_reply_failed", error=repr(e))

    async def answer(self, chunk: StdinChunk) -> StdinAck:
        job = self.work().get(chunk.job_id)
        if job is None:
            return StdinAck(seq=chunk.seq, error=NOT_RUNNING)  # not placed here (yet, or any more)
        it = job.spec.interactive
        if not isinstance(it, Interactive):
            return StdinAck(seq=chunk.seq, closed=True, error=f"job {chunk.job_id} takes no input")
        if key_hash(chunk.key) != it.key_sha256:
            log.warning("stdin_refused", job_id=chunk.job_id, why="wrong key")
            return StdinAck(seq=chunk.seq, closed=True, error=f"wrong key for job {chunk.job_id}'s input")
        if chunk.attempt != job.attempt:
            return StdinAck(seq=chunk.seq, closed=chunk.attempt < job.attempt, error=WRONG_ATTEMPT)
        tr = self.workers().get((job.job_id, job.attempt, 0))
        if tr is None:
            return StdinAck(seq=chunk.seq, error=NOT_RUNNING)
        if tr.exited or tr.ending is not None:
            return StdinAck(seq=chunk.seq, closed=True, error=ENDED)
        if not tr.spec.stdin or not hasattr(self.runtime, "send_input"):
            return StdinAck(seq=chunk.seq, closed=True,
                            error=f"the {type(self.runtime).__name__} on {self.node_id} gives its workers no input")
        key = (job.job_id, job.attempt)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            last = self._last.get(key)
            if last is not None and last.seq == chunk.seq:
                return last
            try:
                taken = await self.runtime.send_input(tr.handle, chunk.data, eof=chunk.eof, rows=chunk.rows,
                                                      cols=chunk.cols)
            except InputClosed:
                return StdinAck(seq=chunk.seq, closed=True, error=ENDED)
            ack = self._last[key] = StdinAck(seq=chunk.seq, taken=taken)
        work = self.work()  # forget the jobs and attempts no longer here (a handful: interactive ones)
        for old in [k for k in self._last if (w := work.get(k[0])) is None or w.attempt != k[1]]:
            self._last.pop(old, None)
            self._locks.pop(old, None)
        return ack

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
