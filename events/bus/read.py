"""Reading the log: replays, tails, and single questions (its end, why a position is missing, a subject's newest).

Every replay and tail is one `Reader` (events/bus/reader.py) over an
ephemeral AckNone pull consumer made here. Every read recovers by itself from
a lost consumer, a reconnect, a nats-server restart or its own process being
paused past its watchdog: it creates a new consumer at the sequence after the
last one it handed to its caller (never after one it only buffered), so
nothing is lost or repeated. Readers of the whole stream check that positions
are contiguous as well (events/follow.py) and stop with LogGap rather than
skip.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import secrets
from collections.abc import AsyncGenerator
from contextlib import aclosing

import nats.errors
import nats.js.errors
from nats.js.api import AckPolicy, ConsumerConfig, ConsumerInfo, DeliverPolicy

from events.bus.errors import missing_range
from events.bus.link import Link
from events.bus.reader import Reader, Readers
from events.envelope import Envelope
from events.subjects import ALL, normalize_filters

#: How long a consumer's create may take: a busy server answers late, and a retry costs it another create.
CREATE_TIMEOUT_S = 15.0


class EphemeralConsumers:
    """Makes the ephemeral AckNone consumer of a replay or tail, and re-makes it after a loss."""

    def __init__(
        self, link: Link, subjects: list[str] | None, *, from_seq: int | None, since: float | None,
        new_only: bool = False,
    ) -> None:
        self.link = link
        self.filters = normalize_filters(subjects)
        self.from_seq = from_seq
        self.since = since
        self.new_only = new_only
        #: Names this read's consumers `<token>-<n>`: a create retried after its reply timed out asks for the
        #: same name and config, which the server answers with the consumer it made, not a second one (under
        #: an overloaded JetStream API, thousands of agents' retries otherwise pile orphans onto its queue).
        #: A pull consumer delivers nothing before its first pull, so the one made for a lost reply is new.
        self._token = secrets.token_hex(5)
        self._made = 0

    async def create(self, resume_at: int | None) -> ConsumerInfo:
        """A fresh consumer at `resume_at` (after a loss) or at the read's own start."""
        cfg = ConsumerConfig(
            name=f"{self._token}-{self._made}",
            ack_policy=AckPolicy.NONE,
            mem_storage=True,
            num_replicas=1,
            # The server removes it if we vanish without deleting it.
            inactive_threshold=60.0,
        )
        if self.filters != [ALL]:  # no filter at all is the server's fast path
            cfg.filter_subjects = self.filters
        if resume_at is not None:
            cfg.deliver_policy, cfg.opt_start_seq = DeliverPolicy.BY_START_SEQUENCE, resume_at
        elif self.since is not None:
            cfg.deliver_policy = DeliverPolicy.BY_START_TIME
            cfg.opt_start_time = _start_time(self.since)
        elif self.new_only:
            cfg.deliver_policy = DeliverPolicy.NEW
        else:
            cfg.deliver_policy, cfg.opt_start_seq = DeliverPolicy.BY_START_SEQUENCE, max(self.from_seq or 1, 1)
        info = await self.link.js.add_consumer(self.link.stream, cfg, timeout=CREATE_TIMEOUT_S)
        self._made += 1
        return info

    async def delete(self, name: str) -> None:
        """Best effort and quick (it runs while a read is being cancelled): inactive_threshold is the backstop."""
        if not self.link.nc.is_connected:
            return
        try:
            await self.link.nc.request(f"$JS.API.CONSUMER.DELETE.{self.link.stream}.{name}", b"", timeout=1.0)
        except (TimeoutError, nats.errors.Error):
            pass  # gone already, or the server is away


def _start_time(since: float) -> dt.datetime:
    """`since` as the server's start time, at microsecond resolution (the API's), rounded down.

    An Envelope's stream_time passed back as `since` must include that event,
    but a float of epoch seconds is only good to ~0.25 us: start one
    microsecond early, so events stored within that microsecond before may be
    included, and none at or after `since` is skipped.
    """
    us = math.floor(since * 1_000_000) - 1
    return dt.datetime.fromtimestamp(us // 1_000_000, dt.UTC).replace(microsecond=us % 1_000_000)


async def last_seq(link: Link) -> int:
    info = await link.js.stream_info(link.stream)
    return int(info.state.last_seq)


async def server_time(link: Link) -> float | None:
    """The server's clock now, as its stream info says (`ts`, NATS 2.10+); None if it does not say or answer."""
    try:
        msg = await link.nc.request(f"$JS.API.STREAM.INFO.{link.stream}", b"", timeout=2.0)
        ts = json.loads(msg.data).get("ts")
        return dt.datetime.fromisoformat(ts).timestamp() if isinstance(ts, str) else None
    except (nats.errors.Error, TimeoutError, ValueError, AttributeError):
        return None


async def missing(link: Link, seq: int) -> str | None:
    """Why the stream holds no message at `seq`; None if it holds one (or the server cannot say now)."""
    try:
        info = await link.js.stream_info(link.stream)
        first = int(info.state.first_seq)
        if seq < first:
            return f"{missing_range(seq, first - 1)} not in the stream: it now starts at seq {first} (removed " \
                   "by stream limits, retention or a purge)"
        if seq > int(info.state.last_seq):
            return None
        await link.message_at(seq)
    except nats.js.errors.NotFoundError:
        return f"seq {seq} was deleted from the stream"
    except (nats.errors.Error, TimeoutError):
        return None  # the reader reads again, and asks again if that misses it too
    return None


async def deleted_in(link: Link, lo: int, hi: int) -> int | None:
    """The first position in lo..hi deleted from the middle of the stream; None if none (or the server cannot
    say now). A reader of a slice (filtered subjects) never sees such a hole in its positions: it asks."""
    try:
        if not (await link.js.stream_info(link.stream)).state.num_deleted:
            return None
        msg = await link.nc.request(f"$JS.API.STREAM.INFO.{link.stream}", b'{"deleted_details": true}', timeout=5.0)
        deleted = json.loads(msg.data).get("state", {}).get("deleted") or []
    except (nats.errors.Error, TimeoutError, ValueError, AttributeError):
        return None
    hits = [s for s in deleted if isinstance(s, int) and lo <= s <= hi]
    return min(hits) if hits else None


async def last_on(readers: Readers, subject: str) -> Envelope | None:
    """The newest message on `subject`, decoded (stream time to the microsecond); None if there is none.

    Asked of the stream leader, not by a direct get that a lagging replica may
    answer: what a compare-and-set on the subject (`append_after`) starts from.
    nats-py's errors (a timeout, an API error) are raised as they are.
    """
    link = readers.link
    try:
        msg = await link.js.get_last_msg(link.stream, subject)
    except nats.js.errors.NotFoundError:
        return None
    if msg.seq is None:
        return None
    stored = msg.time.timestamp() if msg.time is not None else 0.0
    return readers.envelope(msg.data or b"", msg.subject or subject, int(msg.seq), stored)


async def replay(
    readers: Readers, from_seq: int, *, since: float | None, to_seq: int | None, subjects: list[str] | None,
    batch: int, stall_timeout: float,
) -> AsyncGenerator[list[Envelope], None]:
    """`Bus.replay`."""
    if since is not None and from_seq != 1:
        raise ValueError("give from_seq or since, not both")
    end = await last_seq(readers.link)
    if to_seq is not None:
        end = min(end, to_seq)
    if end < max(from_seq, 1):
        return
    reader = Reader(
        readers, EphemeralConsumers(readers.link, subjects, from_seq=from_seq, since=since), batch=batch,
        end=end, stall_timeout=stall_timeout,
    )
    async with aclosing(reader.batches()) as batches:
        async for items in batches:
            yield items


#: The idle heartbeat of a filtered tail (seconds).
SPARSE_HEARTBEAT_S = 10.0


async def tail(
    readers: Readers, *, subjects: list[str] | None, from_seq: int | None, since: float | None, batch: int,
) -> AsyncGenerator[Envelope, None]:
    """`Bus.tail`."""
    if since is not None and from_seq is not None:
        raise ValueError("give from_seq or since, not both")
    consumers = EphemeralConsumers(readers.link, subjects, from_seq=from_seq, since=since,
                                   new_only=from_seq is None and since is None)
    # A filtered tail (a node's slice, `tail --job`) hears little and there may be thousands of them: each
    # idle heartbeat is a message the server sends and the reader handles, so theirs come every 10 s (a lost
    # consumer is noticed after 30 s; a reconnect resets at once). The whole log's, one per service, every 2 s.
    reader = Reader(readers, consumers, batch=batch, end=None, stall_timeout=None,
                    heartbeat=SPARSE_HEARTBEAT_S if subjects else None)
    async with aclosing(reader.batches()) as batches:
        async for items in batches:
            for env in items:
                yield env
