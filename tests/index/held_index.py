"""An index service held part way through its catch-up: the real IndexService reading the real stream, whose
reads stop after position UPTO until `opened` is set (a rebuild on a slow disk, made to last).

In a test's own process (`Held`), or as a process of its own:

    python -m tests.index.held_index NATS_URL DATA_DIR UPTO

which prints one JSON line `{"event": "held", "seq": N}` once the index has folded through UPTO and waits
there, still catching up, until it is killed.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncGenerator

from events.bus import Bus, Envelope
from orchestrator.index.service import IndexService


class Held:
    """The stream as the index reads it at start-up (`replay`), with nothing after `upto` until `opened`."""

    def __init__(self, bus: Bus, upto: int) -> None:
        self.bus = bus
        self.upto = upto
        #: Set once everything up to `upto` was handed out and the reader asked for more.
        self.reached = asyncio.Event()
        self.opened = asyncio.Event()

    async def last_seq(self) -> int:
        return await self.bus.last_seq()

    async def missing(self, seq: int) -> str | None:
        return await self.bus.missing(seq)

    async def replay(self, from_seq: int = 1) -> AsyncGenerator[list[Envelope], None]:
        async for batch in self.bus.replay(from_seq=from_seq):
            head = [e for e in batch if e.seq <= self.upto]
            if head:
                yield head
            if len(head) < len(batch):
                self.reached.set()
                await self.opened.wait()
                yield batch[len(head):]


async def _main(url: str, data_dir: str, upto: int) -> None:
    bus = await Bus.connect(url)
    held = Held(bus, upto)
    service = IndexService(bus, data_dir, history=held)
    task = asyncio.create_task(service.run())
    await held.reached.wait()
    print(json.dumps({"event": "held", "seq": service.seq, "serving": service.serving.is_set()}), flush=True)
    await task


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
