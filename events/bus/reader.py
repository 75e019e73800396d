"""One read of the log (`Reader`): pull requests on one inbox, with a watchdog that recovers from losses.

Why raw `$JS.API.CONSUMER.MSG.NEXT` batch requests answered on one inbox
subscription, measured on the reference machine with nats-py 2.16
(bench/RESULTS.md):
- `PullSubscription.fetch()` (a task per message, like `next_msg()` and
  `async for`) reads 4-5x slower; batched direct gets 2-3x slower;
- a push consumer without flow control overruns the client's pending limits
  and silently drops messages; an ordered push consumer with flow control is
  about as fast as raw pulls, but its flow control paces the callback, not
  the reader behind it; pull requests let a slow reader hold the server back
  and let a replay stop exactly at its last sequence;
- AckPolicy NONE for replays and tails, so max_ack_pending (1,000 by default)
  cannot stall them.
Data messages skip even nats-py's per-message work (events/bus/frames.py).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any, Protocol

import nats.errors
import nats.js.errors
import structlog
from nats.aio.msg import Msg
from nats.js.api import ConsumerInfo

from events.authorship import read_event
from events.bus.errors import BusError, ReadStalled
from events.bus.frames import FrameReader, install_direct_dispatch
from events.bus.link import Link
from events.envelope import Envelope
from events.swallowed_cancel import stop_if_cancelled
from schemas import Unknown

log = structlog.get_logger("corral.bus")


class Readers:
    """What the reads of one connection share: its link, reconnect wake-ups, direct dispatch, unknown-type logging."""

    def __init__(self, link: Link) -> None:
        self.link = link
        #: Readers to wake when the connection comes back: their consumers may be gone.
        self.reconnect_listeners: set[Callable[[], None]] = set()
        #: Subscription id -> reader whose data messages skip nats-py's per-message work.
        self.direct: dict[int, FrameReader] = {}
        self.direct_ok = install_direct_dispatch(link.nc, self.direct)
        self._unknown_logged: set[str] = set()

    def notify_reconnect(self) -> None:
        for listener in list(self.reconnect_listeners):
            listener()

    def envelope(self, data: bytes, subject: str, seq: int, stream_time: float) -> Envelope:
        """One message read on its own (not by a `Reader`), decoded as a reader decodes it."""
        event = read_event(subject, data)
        if event.__class__ is Unknown:
            self.log_unknown(event, seq, subject)
        return Envelope(seq, subject, stream_time, event)

    def log_unknown(self, event: Unknown, seq: int, subject: str) -> None:
        # Once per reason, a closed set: keyed by the type a message claims, a hostile publisher
        # could make every reader log (and remember) a line per made-up type.
        if event.reason in self._unknown_logged:
            return
        self._unknown_logged.add(event.reason)
        log.warning("undecodable event (logged once per reason)", reason=event.reason, type=event.type, seq=seq,
                    subject=subject, error=event.error[:200])


class Consumers(Protocol):
    """Makes the consumer a read pulls from (events/bus/read.py), and re-makes it after a loss."""

    async def create(self, resume_at: int | None) -> ConsumerInfo: ...

    async def delete(self, name: str) -> None: ...


class Reset(Exception):
    """The consumer or its pull requests were lost; make a new one and go on."""


class Reader:
    """Pull requests on one inbox, decoded in the subscription callback; recovers from losses.

    The callback only decodes and appends to a buffer; the reader's own loop
    takes whole buffers, so a replay costs one await per batch, not per message.
    Flow: two requests of `batch` messages are kept outstanding (so the server
    never waits for a round trip), and none is sent while four batches wait to
    be taken (backpressure: a slow reader holds at most ~6 batches in memory).
    Requests expire after _EXPIRES and ask for idle heartbeats. Silence for
    three heartbeats: ask the same consumer again (a server that lost it
    answers 503/409, a reset); silence for three more means the consumer or
    the connection is gone: start over with a new one.

    Exactly once, in order, across resets (#19): `resume_at` moves only when a
    batch is handed to the caller, so a reset re-reads whatever was buffered
    and not yet taken (at most a few batches) instead of trusting a buffer it
    is about to drop. A reset first cuts the old subscription off the reader,
    before any await: the callback ignores messages of any subscription but
    the current one (`_sid`), so a late batch from a consumer being replaced
    (a process resumed after SIGSTOP gets its watchdog expiry and the batch
    the server sent meanwhile in the same loop turn) can neither land in the
    new consumer's buffer nor end a replay early.
    """

    _EXPIRES = 20.0
    _HEARTBEAT = 2.0

    def __init__(
        self,
        readers: Readers,
        consumers: Consumers,
        *,
        batch: int,
        end: int | None,
        stall_timeout: float | None,
        heartbeat: float | None = None,
    ) -> None:
        self.readers = readers
        #: The server's idle heartbeat to this reader; its silence for three of them resets the consumer.
        self.heartbeat = heartbeat if heartbeat is not None else self._HEARTBEAT
        self.nc = readers.link.nc
        self.consumers = consumers
        self.batch = max(1, batch)
        #: Buffered messages beyond which no more are requested until the reader catches up.
        self._high = 4 * self.batch
        self.end = end
        self.stall_timeout = stall_timeout
        #: Next stream sequence to ask for after a reset (None: the read's own start): the one
        #: after the last handed to the caller, never after one only buffered.
        self.resume_at: int | None = None
        self._buf: list[Any] = []
        self._wake = asyncio.Event()
        #: The read is over (a replay's end handed out): no new consumer.
        self._done = False
        #: A replay's last message (or the server's "no more") is in the buffer: request nothing more.
        self._end_seen = False
        self._reset_reason: str | None = None
        #: The watchdog fired once and the consumer was asked again; cleared by any message from it.
        self._asked_again = False
        self._error: BaseException | None = None
        self._want = 0  # messages requested and not yet delivered or expired
        self._waiting = False  # the reader waits for _wake: only then must a message set it
        #: The current subscription's id; messages of any other (a replaced consumer's) are ignored.
        self._sid: int | None = None
        self._next_req = b""
        self._inbox = ""
        self._api = ""

    async def batches(self) -> AsyncGenerator[list[Any], None]:
        """Lists of Envelopes (or of what a subclass's `_on_frame` buffers), in order."""
        self.readers.reconnect_listeners.add(self._on_reconnect)
        backoff = 0.05
        stalled_since: float | None = None
        try:
            while not self._done:
                stop_if_cancelled()
                sub = None
                name = None
                try:
                    info = await self.consumers.create(self.resume_at)
                    name = info.name
                    stop_if_cancelled()  # the create's request may have swallowed a cancel (3.11 wait_for)
                    if self.resume_at is None and info.delivered is not None:
                        # Where this consumer starts, in case it is lost before its first message.
                        self.resume_at = info.delivered.stream_seq + 1
                    if self.end is not None and not info.num_pending:
                        break
                    sub = await self._subscribe(name, info)
                    stalled_since = None
                    backoff = 0.05
                    async for items in self._run():
                        yield items
                except (TimeoutError, Reset, nats.errors.Error) as e:
                    self._detach(sub)  # before any await: nothing of this consumer may reach the reader now
                    if isinstance(e, nats.errors.ConnectionClosedError):
                        raise
                    if isinstance(e, nats.js.errors.APIError) and not isinstance(
                        e, (nats.js.errors.ServiceUnavailableError, nats.js.errors.ServerError)
                    ) and e.code != 404:
                        raise  # a bad request (filter, sequence) will not heal by retrying
                    now = time.monotonic()
                    stalled_since = stalled_since or now
                    if self.stall_timeout is not None and now - stalled_since > self.stall_timeout:
                        raise ReadStalled(f"read stalled at seq {self.resume_at}: {e!r}") from e
                    log.info("reader reset", reason=str(e) or type(e).__name__, resume_at=self.resume_at)
                    # Jittered, so thousands of readers that lost their consumers together (a server restart,
                    # an overloaded JetStream API) do not ask again in step; a sparse reader waits up to its
                    # heartbeat (10 s), the whole log's readers up to 2 s.
                    await asyncio.sleep(backoff * random.uniform(0.5, 1.5))
                    backoff = min(backoff * 2, self.heartbeat)
                finally:
                    self._detach(sub)
                    if sub is not None:
                        try:
                            await sub.unsubscribe()
                        except nats.errors.Error:
                            pass
                    if name is not None:
                        await self.consumers.delete(name)
        finally:
            self.readers.reconnect_listeners.discard(self._on_reconnect)

    def _detach(self, sub: Any) -> None:
        """Stop `sub` from feeding the reader (synchronous: call it before the first await of a reset)."""
        if sub is None:
            return
        self.readers.direct.pop(sub._id, None)
        if self._sid == sub._id:
            self._sid = None

    async def _subscribe(self, name: str, info: ConsumerInfo) -> Any:
        # Whatever is still buffered was never handed out: resume_at is before it, the new consumer re-reads it.
        self._buf = []
        self._end_seen = False
        self._wake.clear()
        self._reset_reason = None
        self._asked_again = False
        self._want = 0
        self._api = f"$JS.API.CONSUMER.MSG.NEXT.{self.readers.link.stream}.{name}"
        req: dict[str, Any] = {"batch": self.batch, "expires": int(self._EXPIRES * 1e9),
                               "idle_heartbeat": int(self.heartbeat * 1e9)}
        self._next_req = json.dumps(req).encode()
        self._inbox = self.nc.new_inbox()
        sub = await self.nc.subscribe(self._inbox, cb=self._on_msg)
        self._sid = sub._id
        if self.readers.direct_ok:
            self.readers.direct[sub._id] = self  # data messages bypass cb (see frames.install_direct_dispatch)
        await self._fill()
        return sub

    async def _fill(self) -> None:
        """Keep up to two batches requested, unless the reader is `_high` messages behind or must not ask."""
        while (self._want < 2 * self.batch and len(self._buf) < self._high and not self._done
               and not self._end_seen and self._reset_reason is None):
            self._want += self.batch
            await self.nc.publish(self._api, self._next_req, reply=self._inbox)

    async def _run(self) -> AsyncGenerator[list[Any], None]:
        """The current consumer's batches; returns at the end of a replay, raises Reset to start over.

        A reset (`_reset_reason`) is raised only once the buffer is empty: what
        arrived before it is handed out first, and nothing arrives after it.
        """
        watchdog = 3 * self.heartbeat
        while True:
            stop_if_cancelled()  # a nats wait (a request, a flush) that swallowed a cancel: stop now, not never
            if (not self._buf and not self._done and not self._end_seen and self._reset_reason is None
                    and self._error is None):
                # Every message and every status (heartbeats included) wakes us: silence means loss.
                self._wake.clear()
                self._waiting = True
                try:
                    # Not asyncio.wait_for: on 3.11 it returns the result instead of raising
                    # CancelledError when a cancel and the wake-up land in the same loop
                    # iteration, and a cancelled tail() would then run on (tests/faults/test_shutdown.py).
                    async with asyncio.timeout(watchdog):
                        await self._wake.wait()
                except TimeoutError:
                    if self._asked_again:
                        # Silent again after asking again: the consumer is lost. Set, not raised: from here
                        # on the callback ignores it. A batch that came in the same loop turn as the expiry
                        # (a process resumed from a pause) is still handed out below; the next consumer
                        # starts after it.
                        self._reset_reason = "no message or heartbeat from the consumer"
                    else:
                        # Silent once: ask the same consumer again before making a new one. A server too
                        # busy to send heartbeats is not helped by thousands of readers deleting and
                        # creating consumers through its API queue at once (bench/RESULTS.md, scale at
                        # 4,096 nodes); a pull request is cheap, and one for a consumer the server no longer
                        # has is answered 503 or 409, which resets (`_status`).
                        self._asked_again = True
                        self._want = 0
                finally:
                    self._waiting = False
            if self._error is not None:
                raise self._error
            if self._buf:
                items, self._buf = self._buf, []
                last = items[-1]
                self.resume_at = last.seq + 1
                yield items
            if self._done:
                return
            if not self._buf:
                if self._end_seen:
                    self._done = True
                    return
                if self._reset_reason is not None:
                    raise Reset(self._reset_reason)
            await self._fill()

    def _on_reconnect(self) -> None:
        # Pull requests (and an in-memory consumer) may not have survived.
        self._reset_reason = "reconnected"
        self._wake.set()

    def _status(self, msg: Msg) -> None:
        self._asked_again = False  # the consumer answered (data messages clear it in `_on_frame`)
        hdr = msg.headers or {}
        code = hdr.get("Status", "")
        if code == "100":
            pass  # idle heartbeat: the consumer is alive, only quiet; it still wakes the watchdog below
        elif code in ("408", "404"):
            # A request expired; the server says how many of its messages were never sent.
            left = hdr.get("Nats-Pending-Messages")
            self._want = max(0, self._want - (int(left) if left and left.isdigit() else self.batch))
            if self.end is not None and code == "404":
                self._end_seen = True
        elif code in ("409", "503"):  # consumer deleted, leadership change, no responders: start over
            self._reset_reason = f"status {code} {hdr.get('Description', '')}".strip()
        else:
            self._error = BusError(f"pull request failed: status {code} {hdr.get('Description', '')}")
        self._wake.set()

    async def _on_msg(self, msg: Msg) -> None:
        """nats-py's callback: status messages, and data messages where direct dispatch is unavailable."""
        if msg._sid != self._sid:
            return  # queued for a consumer that was replaced since: its messages are read again
        data = msg.data
        if not data and msg.headers and "Status" in msg.headers:
            self._status(msg)
            await self._fill()
            return
        if self._on_data(msg.subject.encode(), msg.reply.encode(), data):
            await self._fill()

    def _on_data(self, subject: bytes | bytearray, reply: bytes | bytearray, data: bytes) -> bool:
        """A data message, as raw bytes: the hot path of every replay. True: request more."""
        if self._end_seen or self._reset_reason is not None:
            return False
        try:
            # v1: $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>
            # v2: $JS.ACK.<domain>.<hash>.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>[.<token>]
            t = reply.split(b".")
            o = 0 if len(t) == 9 else 2
            sseq, ts, pending = int(t[5 + o]), int(t[7 + o]), t[8 + o]
        except Exception as e:  # surfaced by batches(), never swallowed by the parser's error path
            self._error = e
            self._wake.set()
            return False
        return self._on_frame(subject, sseq, ts, pending, data)

    def _on_frame(self, subject: bytes | bytearray, sseq: int, ts: int, pending: bytes | bytearray,
                  data: bytes | bytearray) -> bool:
        """A data message with its reply subject parsed. True: request more.

        Kept to decoding and one append.
        """
        if self._end_seen or self._reset_reason is not None:
            return False
        self._asked_again = False
        try:
            self._want -= 1
            end = self.end
            if end is not None and sseq > end:
                self._end_seen = True
            else:
                subj = subject.decode()
                event = read_event(subj, data)
                if event.__class__ is Unknown:
                    self.readers.log_unknown(event, sseq, subj)
                self._buf.append(Envelope(sseq, subj, ts / 1e9, event))
                if end is not None and (sseq >= end or pending == b"0"):
                    self._end_seen = True
            if self._waiting or self._end_seen:
                self._waiting = False  # one wake-up per batch, not one per message
                self._wake.set()
            return self._want <= self.batch and len(self._buf) < self._high and not self._end_seen
        except Exception as e:  # surfaced by batches(), never swallowed by the parser's error path
            self._error = e
            self._wake.set()
            return False

