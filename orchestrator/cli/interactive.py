"""`corral run`'s input: its stdin goes to rank 0, and `--pty` gives rank 0 a terminal (like `srun --pty`).

The job is submitted interactive (JobSpec.interactive) with the SHA-256 of a
random key this process alone holds. `Forwarder` reads this process's stdin
and sends it, one chunk per request (schemas/stdin.py), to the agent of the
node running rank 0 of the job's current attempt (`corral-stdin.<node>.<job>`,
nodeagent/stdin.py); what the worker's pipe does not take now is sent again
later, so nothing is buffered past one chunk here and the pipe there. The end
of this stdin closes rank 0's (EOF). A newer attempt's rank 0 (the job was
requeued) gets what is read from then on.

With `--pty`, rank 0 runs on a pseudo-terminal: this terminal goes raw (every
key, Ctrl-C and Ctrl-D included, goes to the job, as over ssh) and is restored
on exit; its size is sent first and again on every SIGWINCH. Rank 0's output
is printed as it comes (not line by line), unlabelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import secrets
import signal
import struct
import sys
import termios
import threading
import tty
from collections.abc import Callable, Iterator
from typing import BinaryIO

import nats.errors

from events.bus import Bus
from events.subjects import stdin_subject
from orchestrator.cli.attach import JobStream
from schemas.jobspec import Interactive
from schemas.stdin import (
    ENDED,
    STDIN_CHUNK,
    WRONG_ATTEMPT,
    StdinAck,
    StdinChunk,
    decode_stdin_ack,
    encode_stdin,
    key_hash,
)

#: Between tries while rank 0 is not running yet, or its agent does not answer.
RETRY_S = 0.1
#: How long one request waits for its answer.
ANSWER_S = 5.0
#: Chunks read ahead of what was sent (a reader blocks past them: the bound on what waits here).
QUEUED = 16


def interactive_key(pty: bool) -> tuple[str, Interactive]:
    """A new key (kept by this process) and what the job spec records of it."""
    key = secrets.token_urlsafe(32)
    return key, Interactive(pty=pty, key_sha256=key_hash(key))


def rank0(stream: JobStream) -> tuple[int, str] | None:
    """(attempt, node) of rank 0 of the newest attempt placed so far; None before the first placement."""
    placed = [(attempt, ro.node) for (attempt, rank), ro in stream.ranks.items() if rank == 0]
    return max(placed) if placed else None


def terminal_size(fd: int) -> tuple[int, int]:
    """(rows, columns) of the terminal on `fd`; (0, 0) when it is none."""
    try:
        rows, cols, _, _ = struct.unpack("HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
    except OSError:
        return 0, 0
    return rows, cols


class Forwarder:
    """Sends what `feed` puts in `queue` (b"": end of input) to rank 0 of `job_id`; `resized` set: send the size."""

    def __init__(self, bus: Bus, job_id: str, key: str, stream: JobStream, *,
                 size: Callable[[], tuple[int, int]] | None = None) -> None:
        self.bus, self.job_id, self.key, self.stream, self.size = bus, job_id, key, stream, size
        self.queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=QUEUED)
        self._getting: asyncio.Task[bytes] | None = None
        self.resized = asyncio.Event()
        if size is not None:
            self.resized.set()  # the first request says the size
        #: Why input stopped early (a refusal), said once by the caller.
        self.problem = ""
        self.sent = 0

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            if self._getting is not None:
                self._getting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._getting

    async def _run(self) -> None:
        data, eof, seq, again = b"", False, 0, False
        while True:
            if not data and not eof and not self.resized.is_set():
                part = await self._more()
                if part is not None:
                    data, eof = part, part == b""
            while len(data) < STDIN_CHUNK and not eof and self._getting is None and not self.queue.empty():
                part = self.queue.get_nowait()
                data, eof = data + part, part == b""
            where = rank0(self.stream)
            if where is None:
                await asyncio.sleep(RETRY_S)
                continue
            attempt, node = where
            if not again:  # (a request whose answer was lost goes again under its number: written once)
                seq += 1
            part = data[:STDIN_CHUNK]
            rows, cols = self.size() if self.size is not None and self.resized.is_set() else (0, 0)
            chunk = StdinChunk(job_id=self.job_id, attempt=attempt, key=self.key, seq=seq, data=part,
                               eof=eof and len(part) == len(data), rows=rows, cols=cols)
            ack = await self._ask(node, chunk)
            again = ack is None
            if ack is None or (ack.error and not ack.closed):  # not there yet, or it did not answer: again
                await asyncio.sleep(RETRY_S)
                continue
            if ack.closed:
                if ack.error not in (ENDED, WRONG_ATTEMPT):
                    self.problem = ack.error  # refused: no use sending more
                    return
                while rank0(self.stream) == where:  # over: a newer attempt's rank 0 gets what is left, if one comes
                    await asyncio.sleep(RETRY_S)
                continue
            if rows:
                self.resized.clear()
            data = data[ack.taken:]
            self.sent += ack.taken
            if chunk.eof and not data:
                return  # all of it, and its end
            if ack.taken < len(part):
                await asyncio.sleep(RETRY_S)  # the worker does not read now

    async def _more(self) -> bytes | None:
        """The next input (b"": its end), or None when the terminal was resized first (the read goes on)."""
        if self._getting is None:
            self._getting = asyncio.ensure_future(self.queue.get())
        resizing = asyncio.ensure_future(self.resized.wait())
        try:
            await asyncio.wait({self._getting, resizing}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            resizing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await resizing
        if not self._getting.done():
            return None
        part, self._getting = self._getting.result(), None
        return part

    async def _ask(self, node: str, chunk: StdinChunk) -> StdinAck | None:
        try:
            msg = await self.bus.nc.request(stdin_subject(node, self.job_id), encode_stdin(chunk), timeout=ANSWER_S)
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
            return None
        return decode_stdin_ack(msg.data)


def read_in_thread(stream: BinaryIO, forwarder: Forwarder, loop: asyncio.AbstractEventLoop) -> None:
    """Feed `stream` (stdin, a pipe or a file) to `forwarder` from a daemon thread: a read blocked on a
    terminal nobody types into never holds up the exit."""

    def put(part: bytes) -> None:
        asyncio.run_coroutine_threadsafe(forwarder.queue.put(part), loop).result()

    # From the file descriptor, not the buffered object: a read blocked there holds the object's lock, and the
    # interpreter's exit, which flushes and closes sys.stdin, waited for it (`sleep 60 | corral run -- true`
    # ended after the sleep, with "Fatal Python error: _enter_buffered_busy").
    try:
        fd: int | None = stream.fileno()
    except (AttributeError, OSError, ValueError):
        fd = None
    read = (lambda n: os.read(fd, n)) if fd is not None else (getattr(stream, "read1", None) or stream.read)

    def pump() -> None:
        try:
            while True:
                part = read(STDIN_CHUNK)
                if not part:
                    break
                put(part)
        except (OSError, ValueError, RuntimeError):
            pass  # closed under us, or the loop is gone
        with contextlib.suppress(RuntimeError):
            put(b"")

    threading.Thread(target=pump, name="corral-run-stdin", daemon=True).start()


@contextlib.contextmanager
def raw_terminal(fd: int, forwarder: Forwarder, loop: asyncio.AbstractEventLoop) -> Iterator[None]:
    """The terminal on `fd` raw, its keys fed to `forwarder` and its resizes noted, restored on exit."""
    saved = termios.tcgetattr(fd)
    tty.setraw(fd)

    waiting: set[asyncio.Task[None]] = set()

    async def resume(part: bytes) -> None:
        await forwarder.queue.put(part)
        if part:
            loop.add_reader(fd, readable)

    def readable() -> None:
        try:
            part = os.read(fd, 4096)
        except OSError:
            part = b""
        if not part:
            loop.remove_reader(fd)
        try:
            forwarder.queue.put_nowait(part)
        except asyncio.QueueFull:  # the job does not read: stop reading the terminal until it does
            loop.remove_reader(fd)
            task = asyncio.ensure_future(resume(part))
            waiting.add(task)
            task.add_done_callback(waiting.discard)

    loop.add_reader(fd, readable)
    loop.add_signal_handler(signal.SIGWINCH, forwarder.resized.set)
    try:
        yield
    finally:
        for task in waiting:
            task.cancel()
        loop.remove_signal_handler(signal.SIGWINCH)
        loop.remove_reader(fd)
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def stdin_binary() -> BinaryIO | None:
    """This process's stdin as bytes, None when it has none."""
    stream = sys.stdin
    return getattr(stream, "buffer", None) if stream is not None else None
