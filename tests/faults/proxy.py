"""A TCP relay between one service and nats-server that can partition it from the log.

Two ways to cut the line, as networks do:
- "drop": bytes are silently discarded both ways and the sockets stay open
  (a dead switch, a black-holing firewall); the client learns nothing until
  its own timeouts fire;
- "refuse": every connection is reset at once and new ones are reset on
  accept (a REJECT rule, a host that went away).
Healing lets new connections through; connections that were black-holed are
reset then, because bytes were lost mid-stream and NATS cannot resume them
(as TCP itself would eventually time them out).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Literal

Mode = Literal["drop", "refuse"]


class Proxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.mode: Mode | None = None
        self._server: asyncio.Server | None = None
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def start(self) -> Proxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self._reset_all()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def partition(self, mode: Mode = "drop") -> None:
        self.mode = mode
        if mode == "refuse":
            self._reset_all()

    def heal(self) -> None:
        if self.mode == "drop":
            self._reset_all()
        self.mode = None

    def _reset_all(self) -> None:
        for client, upstream in list(self._pairs):
            client.transport.abort()
            upstream.transport.abort()
        self._pairs.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "refuse":
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        pair = (writer, up_writer)
        self._pairs.add(pair)
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pump(src, dst, pair))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                    pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter]) -> None:
        try:
            while data := await src.read(65536):
                if self.mode is None and pair in self._pairs:
                    dst.write(data)
                    await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            # One side ended: end the other, so neither waits on a half-open relay.
            if pair in self._pairs:
                self._pairs.discard(pair)
                for w in pair:
                    with contextlib.suppress(Exception):
                        w.transport.abort()
