"""The bus: corral's one log (a JetStream stream) and the ways to read it.

`Bus` is the face every service uses; its jobs live in rooms of their own,
each given the narrow connection it needs (`Link`), not the Bus:

- events/bus/provision.py: the stream and the KV buckets, set up with retries
  while a cluster forms (NotReady, PermissionDenied);
- events/bus/publish.py: appends, deduplicated by event id, pipelined for many,
  a compare-and-set on a subject (`append_after`);
- events/bus/read.py and reader.py: replays and tails over pull requests, with
  the watchdog that recovers from losses; frames.py hands their data messages
  straight from nats-py's parser to them (the hot path of every replay);
- events/bus/errors.py: what the bus raises.

Durability. The embedded server keeps nats-server's default file-store sync:
a message is written to the OS before its PubAck (so a crash or SIGKILL of
nats-server loses nothing; tests/test_bus.py kills it to check) and fsynced
every 2 minutes (so a kernel crash or power loss may lose the last ones).
fsync before every ack ("sync_interval: always") cut append throughput 5x
on a quiet disk and 13x on a busy one on the reference machine
(bench/RESULTS.md), and it is not what protects a production log: there,
replicas=3 make an ack mean "on a quorum of machines". A single-node
deployment that must survive power loss can start its server with
`NatsServer(sync_interval="always")`.

Decoding uses `schemas.decode`, which never raises: an unknown or corrupt event
arrives as an Envelope carrying `Unknown`, logged once per reason.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterable
from typing import Any

import nats
import nats.errors
import structlog
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import RawStreamMsg
from nats.js.kv import KeyValue

from events.bus import read
from events.bus.errors import (
    AppendRefused,
    BusError,
    IdSquatted,
    LogFull,
    LogGap,
    NotLast,
    NotReady,
    PermissionDenied,
    ReadStalled,
    missing_range,
)
from events.bus.link import Link
from events.bus.provision import Setup
from events.bus.publish import Publisher, append_reclaiming
from events.bus.reader import Readers
from events.envelope import Envelope
from schemas import Event

__all__ = [
    "AppendRefused", "Bus", "BusError", "Envelope", "IdSquatted", "LogFull", "LogGap", "NotLast", "NotReady",
    "PermissionDenied", "ReadStalled", "append_reclaiming", "missing_range",
]

log = structlog.get_logger("corral.bus")


class Bus:
    """A connection to the CORRAL stream. Create with `await Bus.connect(url)`."""

    def __init__(self, nc: NATS, js: JetStreamContext, stream: str, replicas: int, *, user: str | None = None,
                 wait_for_creator: bool = False, ready_timeout: float = 60.0) -> None:
        self.nc = nc
        self.js = js
        self.stream = stream
        self.replicas = replicas
        self.link = Link(nc, js, stream)
        self.setup = Setup(self.link, replicas, user=user, wait_for_creator=wait_for_creator,
                           ready_timeout=ready_timeout)
        self.publisher = Publisher(self.link)
        self.readers = Readers(self.link)
        self._closed = False

    # -- lifecycle -------------------------------------------------------------

    @classmethod
    async def connect(
        cls,
        url: str | list[str],
        *,
        stream: str = "CORRAL",
        replicas: int = 1,
        name: str = "corral",
        duplicate_window: float = 300.0,
        connect_attempts: int = 20,
        wait_for_creator: bool = False,
        ready_timeout: float = 60.0,
        **nats_opts: Any,
    ) -> Bus:
        """Connect and create-or-update the stream (idempotent: every service may call it).

        The first connection gets `connect_attempts` tries per server (0.25 s
        apart by default), so a wrong URL fails in seconds instead of hanging;
        once connected, the bus reconnects forever unless `max_reconnect_attempts`
        says otherwise.

        A cluster that is still forming (no JetStream meta leader yet, or one
        that has not met every peer) answers nothing or "no suitable peers" for
        its first seconds: setup asks again for up to `ready_timeout` seconds,
        then raises NotReady saying what it waited for. A user the server does
        not let create the stream (or a bucket, in `kv`) gets PermissionDenied
        at once, or with `wait_for_creator` (agents: only the scheduler's user
        may create them) waits, as long as it takes, until it exists.
        """
        user_reconnected = nats_opts.pop("reconnected_cb", None)
        user_error = nats_opts.pop("error_cb", None)
        reconnects = nats_opts.pop("max_reconnect_attempts", -1)
        holder: list[Bus] = []

        async def reconnected() -> None:
            if holder:
                holder[0].readers.notify_reconnect()
            if user_reconnected is not None:
                await user_reconnected()

        async def error(e: Exception) -> None:
            if holder:
                holder[0].setup.note_refusal(e)
            if user_error is not None:
                await user_error(e)
            else:  # nats-py's own callback would print a traceback per failed connect attempt
                log.warning("nats_error", error=str(e) or type(e).__name__)

        nats_opts.setdefault("reconnect_time_wait", 0.25)
        # nats-py applies max_reconnect_attempts to the first connection too (-1 would retry forever).
        nc = await nats.connect(url, name=name, reconnected_cb=reconnected, error_cb=error,
                                max_reconnect_attempts=connect_attempts, **nats_opts)
        nc.options["max_reconnect_attempts"] = reconnects
        try:
            js = nc.jetstream(publish_async_max_pending=8192)
            bus = cls(nc, js, stream, replicas, user=nats_opts.get("user"), wait_for_creator=wait_for_creator,
                      ready_timeout=ready_timeout)
            holder.append(bus)
            await bus.setup.ensure_stream(duplicate_window)
        except BaseException:
            await nc.close()
            raise
        return bus

    async def close(self) -> None:
        """Drain (deliver what was received, flush what was published), then close. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.nc.is_closed:
            return
        if not self.nc.is_connected:  # reconnecting: nothing to drain, and drain would wait for it
            await self.nc.close()
            return
        try:
            await self.nc.drain()
        except (nats.errors.ConnectionClosedError, nats.errors.ConnectionDrainingError):
            pass
        finally:
            if not self.nc.is_closed:
                await self.nc.close()

    async def __aenter__(self) -> Bus:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def kv(self, bucket: str, *, ttl: float | None = None, history: int = 1) -> KeyValue:
        """A KV bucket (heartbeats, leader lease), created on first use with these settings.

        Like the stream (`connect`): retried while a cluster forms; a user who may not
        create it waits for one who may, or gets PermissionDenied.
        """
        return await self.setup.kv(bucket, ttl=ttl, history=history)

    # -- writing ---------------------------------------------------------------

    async def append(self, event: Event) -> int:
        """Store one event; its stream sequence. A duplicate event_id returns the original's sequence.

        Raises LogFull when the stream is at a limit, IdSquatted when the event id is taken by a
        message on another subject, another BusError when the server stays out of reach.
        """
        return await self.publisher.append(event)

    async def append_after(self, event: Event, last_seq: int) -> int:
        """`append`, only if the newest message on the event's subject is at stream sequence `last_seq` (0: none).

        The server checks it as it stores (Nats-Expected-Last-Subject-Sequence), so of two writers
        that read the same `last_seq` (`last_on`), one stores and the other gets NotLast: a
        compare-and-set on the subject (two candidates cannot both store epoch N+1). A retry after
        a lost ack returns the sequence it was stored at, as in `append`.
        """
        return await self.publisher.append_after(event, last_seq)

    async def append_many(self, events: Iterable[Event], *, timeout: float = 10.0) -> list[int]:
        """Store events in order, pipelined; their sequences.

        Order is kept unless a publish has to be retried (then that event lands
        after the ones that made it the first time); retries are deduplicated.
        `timeout` bounds the wait for the acks of each window of publishes; a
        publish without one is retried on its own. Errors as `append`, for the
        first event that fails (later ones may be stored: appending them again
        with the same ids stores nothing twice).
        """
        return await self.publisher.append_many(events, timeout=timeout)

    # -- reading ---------------------------------------------------------------

    async def last_seq(self) -> int:
        return await read.last_seq(self.link)

    async def server_time(self) -> float | None:
        """The server's clock now, as its stream info says (`ts`, NATS 2.10+); None if it does not say or answer.

        The "now" of a reader with no fold to prove one (a CLI view, a usage report) against the
        stream's times (#30): this machine's wall clock may be minutes off the server's.
        """
        return await read.server_time(self.link)

    async def missing(self, seq: int) -> str | None:
        """Why the stream holds no message at `seq`; None if it holds one (or the server cannot say now).

        What a reader that must not skip reports when its fold needs `seq`: the
        stream's head moved past it (limits, a purge), or it was deleted. Read
        permissions suffice (stream info, direct get).
        """
        return await read.missing(self.link, seq)

    async def deleted_in(self, lo: int, hi: int) -> int | None:
        """The first position in lo..hi deleted from the middle of the stream (None: none, or no answer now)."""
        return await read.deleted_in(self.link, lo, hi)

    async def message_at(self, seq: int) -> RawStreamMsg:
        """The stream's message at `seq` as stored (a direct get); nats-py's NotFoundError if there is none."""
        return await self.link.message_at(seq)

    async def last_on(self, subject: str) -> Envelope | None:
        """The newest event on `subject` (a subject names one entity and event type); None if there is none.

        From the stream leader, so `append_after` can take its seq as the expected last one.
        """
        return await read.last_on(self.readers, subject)

    def replay(self, from_seq: int = 1, *, since: float | None = None, to_seq: int | None = None,
               subjects: list[str] | None = None, batch: int = 2000,
               stall_timeout: float = 30.0) -> AsyncGenerator[list[Envelope], None]:
        """The log from `from_seq` (or from stream time `since`, epoch seconds) in batches, in order.

        Ends after `to_seq`, or after the last sequence present when called,
        whichever is lower. `subjects` filter server-side (see events.subjects).
        Break out early inside `contextlib.aclosing(...)` so the consumer is
        removed at once.
        """
        return read.replay(self.readers, from_seq, since=since, to_seq=to_seq, subjects=subjects, batch=batch,
                           stall_timeout=stall_timeout)

    def tail(self, *, subjects: list[str] | None = None, from_seq: int | None = None, since: float | None = None,
             batch: int = 500) -> AsyncGenerator[Envelope, None]:
        """Events as they are appended, from now (default), from `from_seq` or from time `since`. Never ends."""
        return read.tail(self.readers, subjects=subjects, from_seq=from_seq, since=since, batch=batch)
