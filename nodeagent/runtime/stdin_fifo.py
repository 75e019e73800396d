"""Writing a worker's input: frames into the FIFO its shim relays to the worker's stdin (runtime/shim.py).

Each frame is a 1-byte kind (data, end of input, window size), a 4-byte
big-endian length and the payload, at most PIPE_BUF bytes in all: a write of
that size to a FIFO is atomic, so with O_NONBLOCK it goes in whole or not at
all (EAGAIN), and the relay never reads half a frame, even from an agent that
died mid-request. The FIFO holds 64 KiB; a worker that does not read fills it,
and the writer says `busy` after a while instead of buffering more.
"""

from __future__ import annotations

import asyncio
import errno
import os
import select
import struct
from pathlib import Path

#: The shim's frame kinds (shim.py: DATA, EOF, WINSIZE; it imports nothing from corral, so they are repeated).
DATA, EOF, WINSIZE = b"D", b"E", b"W"
HEADER = 5
#: A frame no larger than this is written to a FIFO in one piece (POSIX: PIPE_BUF, 4096 on Linux).
FRAME_MAX = select.PIPE_BUF
#: How long a write waits for a worker that does not read before it gives up (`busy`).
BUSY_AFTER_S = 2.0


class InputClosed(RuntimeError):
    """The worker's input is gone: no FIFO (not interactive, or removed), or nobody relays it any more."""


def frames(data: bytes, *, eof: bool = False, rows: int = 0, cols: int = 0) -> list[bytes]:
    """The frames for one request: a window size first (a prompt drawn after it fits), the data, then EOF."""
    out = []
    if rows > 0 and cols > 0:
        out.append(WINSIZE + (4).to_bytes(4, "big") + struct.pack(">HH", min(rows, 0xFFFF), min(cols, 0xFFFF)))
    step = FRAME_MAX - HEADER
    for i in range(0, len(data), step):
        part = data[i:i + step]
        out.append(DATA + len(part).to_bytes(4, "big") + part)
    if eof:
        out.append(EOF + (0).to_bytes(4, "big"))
    return out


def taken(out: list[bytes], written: int) -> int:
    """Bytes of data in the first `written` frames of `out`."""
    return sum(len(f) - HEADER for f in out[:written] if f[:1] == DATA)


async def write_frames(fifo: Path, out: list[bytes], *, busy_after_s: float = BUSY_AFTER_S) -> int:
    """Write `out` into `fifo` in order; how many were written (fewer: the worker stopped reading for
    `busy_after_s`). InputClosed when there is no FIFO or no reader."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise InputClosed(f"no input FIFO at {fifo}") from None
    except OSError as e:
        if e.errno == errno.ENXIO:  # no reader: its shim is gone
            raise InputClosed("nobody reads the worker's input any more") from None
        raise
    try:
        loop = asyncio.get_running_loop()
        for n, frame in enumerate(out):
            deadline = loop.time() + busy_after_s
            while True:
                try:
                    os.write(fd, frame)
                    break
                except BlockingIOError:
                    if loop.time() > deadline:
                        return n
                    await asyncio.sleep(0.01)
                except BrokenPipeError:
                    raise InputClosed("nobody reads the worker's input any more") from None
        return len(out)
    finally:
        os.close(fd)
