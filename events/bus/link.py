"""The narrow connection the bus's parts share (setup, publish, read): no part needs the whole `Bus`."""

from __future__ import annotations

from dataclasses import dataclass

import nats.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import RawStreamMsg


@dataclass(frozen=True, eq=False)
class Link:
    """One NATS connection, its JetStream context and the name of corral's stream on it."""

    nc: NATS
    js: JetStreamContext
    stream: str

    async def message_at(self, seq: int) -> RawStreamMsg:
        """The stream's message at `seq`; nats-py's NotFoundError when it holds none.

        A direct get (any replica answers, no stream leader round trip), or the
        stream API's get on a stream an operator made without allow_direct.
        """
        try:
            return await self.js.get_msg(self.stream, seq, direct=True)
        except nats.errors.NoRespondersError:  # a stream made without allow_direct
            return await self.js.get_msg(self.stream, seq)
