"""The bus: corral's one log (a JetStream stream) and the ways to read it.

Writing. `append` publishes with `Nats-Msg-Id = event.event_id`, so a publish
retried after a lost ack is stored once: JetStream answers a duplicate with
the original's sequence, which `append` returns. `append_many` pipelines the
publishes (one connection, acks gathered): 5-8x the throughput of awaiting
each ack. A duplicate ack is believed only if the message it names is on the
subject we published to (anyone may publish first under an id the scheduler
will use: IdSquatted). Timeouts and elections are retried; a stream at its
limit raises LogFull at once, with the server's reason.

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

Reading. All reads use one mechanism (`_Reader`): an ephemeral or durable
pull consumer, raw `$JS.API.CONSUMER.MSG.NEXT` batch requests answered on one
inbox subscription whose *callback* decodes messages into Envelopes (for
replays and tails, data messages skip even nats-py's per-message work: see
`_install_direct_dispatch`; 1.5x the plain nats-py read). Measured
on the reference machine with nats-py 2.16 (bench/RESULTS.md):
- `PullSubscription.fetch()` (a task per message, like `next_msg()` and
  `async for`) reads 4-5x slower; batched direct gets 2-3x slower;
- a push consumer without flow control overruns the client's pending limits
  and silently drops messages; an ordered push consumer with flow control is
  about as fast as raw pulls, but its flow control paces the callback, not
  the reader behind it; pull requests let a slow reader hold the server back
  and let a replay stop exactly at its last sequence;
- AckPolicy NONE for replays and tails, so max_ack_pending (1,000 by default)
  cannot stall them.
Every read recovers by itself from a lost consumer, a reconnect, a
nats-server restart or its own process being paused past its watchdog: it
creates a new consumer at the sequence after the last one it handed to its
caller (never after one it only buffered), so nothing is lost or repeated.
Readers of the whole stream check that positions are contiguous as well
(events/follow.py) and stop with LogGap rather than skip.

Decoding uses `schemas.decode`, which never raises: an unknown or corrupt event
arrives as an Envelope carrying `Unknown`, logged once per reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import inspect
import itertools
import json
import math
import re
import secrets
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Sequence
from contextlib import aclosing
from typing import Any, TypeVar

import msgspec
import nats
import nats.errors
import nats.js.errors
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    ConsumerInfo,
    DeliverPolicy,
    KeyValueConfig,
    PubAck,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.kv import KeyValue

from events.subjects import ALL, check_id, normalize_filters, subject_for
from events.swallowed_cancel import stop_if_cancelled
from schemas import AnyEvent, Event, Unknown, decode, encode

log = structlog.get_logger("corral.bus")

#: JetStream error code: "stream name already in use with a different configuration".
_STREAM_NAME_IN_USE = 10058
#: Retries of one append after a timeout; each retry is deduplicated by Nats-Msg-Id.
_APPEND_ATTEMPTS = 4
#: JetStream error codes of a refused publish that mean "a limit is reached", not "try again":
#: 10077 a stream limit (its description says which: "maximum messages exceeded", "maximum bytes
#: exceeded", ...), 10023 the server's storage, 10047 the account's storage.
_STORE_FAILED = 10077
_FULL = frozenset({_STORE_FAILED, 10023, 10047})
#: JetStream error code: "wrong last sequence: N" (an expected-last-sequence header did not hold).
_WRONG_LAST_SEQUENCE = 10071
#: Publishes append_many keeps in flight before it waits for their acks.
_PIPELINE = 8192
#: JetStream error code: "no suitable peers for placement". A cluster whose meta leader has not
#: yet met every peer answers a replicated create with it for its first seconds (then it heals).
_NO_PLACEMENT = 10005
#: Seconds a setup request (look up or create the stream or a bucket) may go unanswered before it
#: is asked again; doubled per try up to the last. Short first: a cluster without a meta leader
#: answers nothing, and one is usually elected within a second of a quorum being up.
_SETUP_TIMEOUTS = (1.0, 2.0, 4.0, 5.0)


class Envelope(msgspec.Struct, frozen=True, gc=False):
    """One event as read from the log, with where and when the log stored it.

    A frozen msgspec Struct rather than a frozen dataclass (same fields, same
    attribute API): building one costs a tenth of a frozen dataclass, and
    `gc=False` keeps replay batches out of the cyclic GC's work (an Envelope
    holds an immutable event tree, so it can never be part of a cycle).
    Together that was ~10% of replay throughput (bench/RESULTS.md).
    """

    seq: int
    subject: str
    #: Server receive time, seconds since the epoch (the publisher's is event.occurred_at).
    stream_time: float
    event: AnyEvent | Unknown


Handler = Callable[[Envelope], Awaitable[None] | None]
_T = TypeVar("_T")


class BusError(RuntimeError):
    pass


class PermissionDenied(BusError):
    """The server refused to let this connection's user send a request: its permissions, so no retry helps.

    `subject` is what was refused (e.g. $JS.API.STREAM.CREATE.CORRAL), `operation` what the bus
    was doing ("create stream CORRAL"), `user` the NATS user when the bus knows it.
    """

    def __init__(self, operation: str, subject: str, user: str | None) -> None:
        who = f"user {user!r}" if user else "this connection's user"
        super().__init__(f"NATS refused {who} permission to {operation}: permissions violation for publish to "
                         f"{subject}")
        self.operation = operation
        self.subject = subject
        self.user = user


class NotReady(BusError):
    """JetStream could not look up or create the stream (or a bucket) before the deadline; says what it waited for."""


class ReadStalled(BusError):
    """A read made no progress (no message, no heartbeat) and could not recover in time."""


class LogGap(BusError):
    """A fold needs the event at `expected` next, and the log gave `found` (> expected) instead.

    Readers of the whole stream see contiguous positions, so a gap means a
    read lost events: the reader reads again from `expected`. Raised out of a
    reader only when that cannot help (`why`: the log no longer holds the
    position, or reads keep missing it), so the service stops, naming it,
    rather than fold a state that skipped events (DESIGN.md, "never skips").
    """

    def __init__(self, expected: int, found: int, why: str = "") -> None:
        super().__init__(f"log gap: the fold needs seq {expected} next, the log gave seq {found}"
                         + (f": {why}" if why else ""))
        self.expected = expected
        self.found = found
        self.why = why


def missing_range(lo: int, hi: int) -> str:
    """`seq 1..41 are` / `seq 7 is`: the positions a reader lacks, named exactly."""
    return f"seq {lo} is" if lo >= hi else f"seq {lo}..{hi} are"


class AppendRefused(BusError):
    """The server refused an append with an error that retrying at once will not fix.

    `description` is the server's own text, `err_code` its JetStream error code.
    """

    def __init__(self, message: str, *, code: int | None, err_code: int | None, description: str) -> None:
        super().__init__(message)
        self.code = code
        self.err_code = err_code
        self.description = description


class LogFull(AppendRefused):
    """The stream (or the server's or the account's storage) is at a limit: no event is stored until it is raised."""


class IdSquatted(BusError):
    """The append's event id is taken: the message the stream stored under it is on another subject.

    The duplicate window is per stream, so a publisher may pre-empt an id (deploy/README.md,
    "Nats-Msg-Id squatting"); the event is not in the log, and appending it again with the same id
    fails the same way until the duplicate window has passed.
    """

    def __init__(self, event_id: str, seq: int, subject: str, found: str) -> None:
        super().__init__(f"event id {event_id!r} is taken: the stream holds seq {seq} under it on {found}, "
                         f"not on {subject}; the event was not stored")
        self.event_id = event_id
        self.seq = seq
        self.subject = subject
        self.found = found


class NotLast(AppendRefused):
    """`append_after` refused: another message was stored on the subject after the one expected.

    `last_seq` is the stream sequence of the subject's newest message now (0 if the server did not say).
    """

    def __init__(self, refused: AppendRefused, last_seq: int) -> None:
        super().__init__(str(refused), code=refused.code, err_code=refused.err_code, description=refused.description)
        self.last_seq = last_seq


def _pub_ack(msg: Msg) -> PubAck:
    """The PubAck in the server's answer to a publish; raises what `js.publish` raises for an error answer."""
    if msg.headers and msg.headers.get("Status") == "503":
        raise nats.js.errors.NoStreamResponseError
    resp = json.loads(msg.data)
    if "error" in resp:
        raise nats.js.errors.APIError.from_error(resp["error"])  # raises the typed error itself
    return PubAck.from_response(resp)


def _refusal(e: nats.js.errors.APIError, subject: str, headers: dict[str, str]) -> AppendRefused | None:
    """The BusError for a JetStream error answer to a publish, or None if it may heal by retrying.

    A 503 is a leader election or a lost quorum (retry), unless it is a store
    at its limit: those, and every other error, are raised at once.
    """
    full = e.err_code in _FULL
    if isinstance(e, nats.js.errors.ServiceUnavailableError) and not full:
        return None
    description = e.description or type(e).__name__
    if full and e.err_code == _STORE_FAILED and "exceeded" not in description:
        full = False  # a broken store ("error opening msg block file"): refused, but not full
    what = "the log is full" if full else "refused"
    message = (f"append {headers['Nats-Msg-Id']!r} to {subject}: {what}: {description} "
               f"(JetStream error {e.err_code}, status {e.code})")
    cls = LogFull if full else AppendRefused
    return cls(message, code=e.code, err_code=e.err_code, description=description)


def _describe(e: BaseException) -> str:
    """An exception as a log line: nats-py's APIError has an empty repr but a useful str."""
    return str(e) if isinstance(e, nats.js.errors.APIError) else repr(e)


def _ack_fields(reply: str) -> tuple[int, int, int, int, int]:
    """(stream seq, consumer seq, delivery count, timestamp ns, pending) from a JetStream reply subject.

    v1: $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>
    v2: $JS.ACK.<domain>.<hash>.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>[.<token>]
    """
    t = reply.split(".")
    o = 0 if len(t) == 9 else 2
    return int(t[5 + o]), int(t[6 + o]), int(t[4 + o]), int(t[7 + o]), int(t[8 + o])


class Bus:
    """A connection to the CORRAL stream. Create with `await Bus.connect(url)`."""

    def __init__(self, nc: NATS, js: JetStreamContext, stream: str, replicas: int) -> None:
        self.nc = nc
        self.js = js
        self.stream = stream
        self.replicas = replicas
        self._closed = False
        self._unknown_logged: set[str] = set()
        #: Readers to wake when the connection comes back: their consumers may be gone.
        self._reconnect_listeners: set[Callable[[], None]] = set()
        #: Subscription id -> reader whose data messages skip nats-py's per-message work.
        self._direct: dict[int, _Reader] = {}
        self._direct_ok = _install_direct_dispatch(nc, self._direct)
        #: append_many's publishes awaiting the server's answer, by reply token (see _publish_pipelined).
        self._answers_inbox: str | None = None
        self._awaiting_answer: dict[str, asyncio.Future[Msg]] = {}
        self._last_token = 0
        #: Setup (see `connect`): the NATS user for error messages, whether to wait for another
        #: user to create what this one may not, and how long a forming cluster may take.
        self.user: str | None = None
        self.wait_for_creator = False
        self.ready_timeout = 60.0
        #: Setup requests in flight, by lowercased subject: set when the server refuses that subject.
        self._refusal_waiters: dict[str, set[asyncio.Future[None]]] = {}

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
                holder[0]._notify_reconnect()
            if user_reconnected is not None:
                await user_reconnected()

        async def error(e: Exception) -> None:
            if holder:
                holder[0]._note_refusal(e)
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
            bus = cls(nc, js, stream, replicas)
            bus.user = nats_opts.get("user")
            bus.wait_for_creator = wait_for_creator
            bus.ready_timeout = ready_timeout
            holder.append(bus)
            await bus._ensure_stream(duplicate_window)
        except BaseException:
            await nc.close()
            raise
        return bus

    async def _ensure_stream(self, duplicate_window: float) -> None:
        config = StreamConfig(
            name=self.stream,
            subjects=[ALL],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            num_replicas=self.replicas,
            duplicate_window=duplicate_window,
            allow_direct=True,
        )

        # Look before writing: every role may read the stream's info, only the scheduler's
        # may create or change it, so a client or an agent connecting to a ready stream
        # must not attempt a write it is not allowed (deploy/nats/permissions.py).
        async def look(js: JetStreamContext) -> StreamConfig | None:
            try:
                return (await js.stream_info(self.stream)).config
            except nats.js.errors.NotFoundError:
                return None

        async def create(js: JetStreamContext) -> StreamConfig | None:
            try:
                await js.add_stream(config)
                return None
            except nats.js.errors.BadRequestError as e:
                if e.err_code != _STREAM_NAME_IN_USE:
                    raise
                return await look(js)  # created meanwhile, with other settings

        current = await self._look_or_create(f"stream {self.stream}", self.stream, look, create)
        if current is None:
            return  # created just now, as configured
        # Exists, maybe with other settings (limits set by an operator, replicas raised by
        # the deployment): change only what the bus needs, and never lower replicas.
        wanted = current.evolve(
            subjects=sorted({*(current.subjects or []), ALL}),
            duplicate_window=duplicate_window,
            num_replicas=max(current.num_replicas or 1, self.replicas),
        )
        if wanted != current:
            await self._until_ready(f"update stream {self.stream}", f"$JS.API.STREAM.UPDATE.{self.stream}",
                                    lambda js: js.update_stream(wanted))

    async def _look_or_create(
        self,
        what: str,
        stream: str,
        look: Callable[[JetStreamContext], Awaitable[_T | None]],
        create: Callable[[JetStreamContext], Awaitable[_T | None]],
    ) -> _T | None:
        """What `look` finds (None: missing); else what `create` returns after creating `what` (stream `stream`).

        A user who may not create it waits for one who may (`wait_for_creator`) or gets
        PermissionDenied; a user who may not even look gets PermissionDenied either way.
        """
        found = await self._until_ready(f"look up {what}", f"$JS.API.STREAM.INFO.{stream}", look)
        if found is not None:
            return found
        try:
            return await self._until_ready(f"create {what}", f"$JS.API.STREAM.CREATE.{stream}", create)
        except PermissionDenied as e:
            if not self.wait_for_creator:
                raise
            refused = e
        log.warning("waiting_for_stream", stream=stream, user=self.user, refused=refused.subject,
                    msg=f"waiting for the scheduler to create {what}: {refused}")
        since = time.monotonic()
        while (found := await self._until_ready(f"look up {what}", f"$JS.API.STREAM.INFO.{stream}", look)) is None:
            await asyncio.sleep(1.0)
        log.info("stream_ready", stream=stream, waited_s=round(time.monotonic() - since, 1))
        return found

    async def _until_ready(
        self, operation: str, subject: str, request: Callable[[JetStreamContext], Awaitable[_T]]
    ) -> _T:
        """`request` (one JetStream API request on `subject`), asked again while the cluster is forming.

        What heals by itself within seconds of the servers starting: no answer or a 503 (no
        meta leader yet), "no suitable peers for placement" (the leader has not met every
        peer). Each try gets a short timeout of its own (_SETUP_TIMEOUTS); the whole waits
        `ready_timeout` at most, then NotReady names what it waited for. A refusal of the
        user's permissions is PermissionDenied at once; any other error is raised as it is.
        """
        deadline = time.monotonic() + self.ready_timeout
        for attempt in itertools.count():
            js = self.nc.jetstream(timeout=_SETUP_TIMEOUTS[min(attempt, len(_SETUP_TIMEOUTS) - 1)])
            try:
                return await self._unless_refused(operation, subject, request(js))
            except (TimeoutError, nats.errors.NoRespondersError, nats.js.errors.ServiceUnavailableError) as e:
                reason = "no JetStream meta leader"
                detail = (f"{subject} got {'no answer' if isinstance(e, TimeoutError) else _describe(e)}; "
                          "a cluster elects one once a majority of its servers are up and routed to each other")
            except nats.js.errors.BadRequestError as e:
                if e.err_code != _NO_PLACEMENT:
                    raise
                reason = f"no placement for {self.replicas} replicas"
                detail = f"{e.description}: are {self.replicas} JetStream servers up and routed to each other?"
            left = deadline - time.monotonic()
            if left <= 0:
                raise NotReady(f"cannot {operation}: {reason} after {self.ready_timeout:.0f} s ({detail})")
            if attempt == 2:  # a second of retries is normal while servers start; say so if it goes on
                log.warning("waiting_for_jetstream", operation=operation, reason=reason)
            await asyncio.sleep(min(0.1 * 2**attempt, 1.0, left))
        raise AssertionError("unreachable")  # pragma: no cover

    async def _unless_refused(self, operation: str, subject: str, request: Awaitable[_T]) -> _T:
        """`request`, or PermissionDenied as soon as the server refuses `subject` to this user.

        A refused publish is not answered: nats-py would wait out the request timeout and
        raise a bare TimeoutError. The server's -ERR arrives at once through the error
        callback (`_note_refusal`), so the request is given up then, naming what was refused.
        """
        refused: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters = self._refusal_waiters.setdefault(subject.lower(), set())
        waiters.add(refused)
        task = asyncio.ensure_future(request)
        try:
            await asyncio.wait((task, refused), return_when=asyncio.FIRST_COMPLETED)
            if refused.done():
                raise PermissionDenied(operation, subject, self.user)
            return task.result()
        finally:
            waiters.discard(refused)
            refused.cancel()
            if not task.done():
                task.cancel()
            with contextlib.suppress(BaseException):
                await task  # retrieved: a refused request's timeout is expected, not news

    def _note_refusal(self, e: Exception) -> None:
        """Wake the setup requests whose subject the server refused (nats-py lowercases the -ERR text)."""
        text = str(e).lower()
        marker = "permissions violation for publish to "
        if marker not in text:
            return
        subject = text.split(marker, 1)[1].strip().strip("'\"")
        for waiter in self._refusal_waiters.get(subject, ()):
            if not waiter.done():
                waiter.set_result(None)

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

    def _notify_reconnect(self) -> None:
        for listener in list(self._reconnect_listeners):
            listener()

    # -- writing ---------------------------------------------------------------

    async def append(self, event: Event) -> int:
        """Store one event; its stream sequence. A duplicate event_id returns the original's sequence.

        Raises LogFull when the stream is at a limit, IdSquatted when the event id is taken by a
        message on another subject, another BusError when the server stays out of reach.
        """
        return await self._append_raw(*self._message(event))

    async def append_after(self, event: Event, last_seq: int) -> int:
        """`append`, only if the newest message on the event's subject is at stream sequence `last_seq` (0: none).

        The server checks it as it stores (Nats-Expected-Last-Subject-Sequence), so of two writers
        that read the same `last_seq`, one stores and the other gets NotLast: a compare-and-set on
        the subject (two candidates cannot both store epoch N+1). A retry after a lost ack returns
        the sequence it was stored at, as in `append`.
        """
        subject, payload, headers = self._message(event)
        headers["Nats-Expected-Last-Subject-Sequence"] = str(last_seq)
        try:
            return await self._append_raw(subject, payload, headers)
        except AppendRefused as e:
            if e.err_code != _WRONG_LAST_SEQUENCE:
                raise
            found = e.description.rpartition(":")[2].strip()
            newest = int(found) if found.isdigit() else 0
            if newest and await self._stored_under(newest, subject, event.event_id):
                return newest  # our own first try, whose ack was lost: stored once
            raise NotLast(e, newest) from e

    async def _stored_under(self, seq: int, subject: str, event_id: str) -> bool:
        """Whether the stream's message at `seq` is on `subject` and was published under `event_id`.

        The server checks an expected sequence *before* the id (measured on nats-server 2.15), so
        `append_after`'s retry of a publish that was stored but whose ack was lost is refused as not
        last; the newest message being that very publish says it was stored.
        """
        try:
            try:
                stored = await self.js.get_msg(self.stream, seq, direct=True)
            except nats.errors.NoRespondersError:  # a stream made without allow_direct
                stored = await self.js.get_msg(self.stream, seq)
        except (nats.errors.Error, TimeoutError):
            return False  # not known to be ours: NotLast, and the caller looks at the log
        return stored.subject == subject and (stored.headers or {}).get("Nats-Msg-Id") == event_id

    async def append_many(self, events: Iterable[Event], *, timeout: float = 10.0) -> list[int]:
        """Store events in order, pipelined; their sequences.

        Order is kept unless a publish has to be retried (then that event lands
        after the ones that made it the first time); retries are deduplicated.
        `timeout` bounds the wait for the acks of each window of _PIPELINE
        publishes; a publish without one is retried on its own. Errors as
        `append`, for the first event that fails (later ones may be stored:
        appending them again with the same ids stores nothing twice).
        """
        msgs = [self._message(e) for e in events]
        seqs: list[int] = []
        for start in range(0, len(msgs), _PIPELINE):
            window = msgs[start : start + _PIPELINE]
            answers = await self._publish_pipelined(window, timeout)
            for (subject, payload, headers), answer in zip(window, answers, strict=True):
                ack = None
                if answer is not None:
                    try:
                        ack = _pub_ack(answer)
                    except nats.js.errors.APIError as e:
                        if (refused := _refusal(e, subject, headers)) is not None:
                            raise refused from e
                    except (nats.errors.Error, ValueError):
                        pass  # no stream answered, or a garbled answer: retried below
                if ack is None:
                    seqs.append(await self._append_raw(subject, payload, headers))
                else:
                    seqs.append(await self._stored_seq(ack, subject, headers))
        return seqs

    async def _publish_pipelined(
        self, msgs: list[tuple[str, bytes, dict[str, str]]], timeout: float
    ) -> list[Msg | None]:
        """Publish all without waiting, then the server's answers (up to `timeout`); None where none came.

        Not nats-py's publish_async: in 2.16 its future is never resolved when
        the answer is an error (its reply handler raises instead), so a full
        stream stalled append_many for its whole timeout. Here every answer,
        error or not, resolves its future.
        """
        if self._answers_inbox is None:
            # Set before the await: publishes after this line are queued behind the SUB, so their answers arrive.
            self._answers_inbox = self.nc.new_inbox()
            await self.nc.subscribe(f"{self._answers_inbox}.*", cb=self._on_answer)
        loop = asyncio.get_running_loop()
        tokens: list[str] = []
        futures: list[asyncio.Future[Msg]] = []
        try:
            for subject, payload, headers in msgs:
                self._last_token += 1
                token = str(self._last_token)
                fut: asyncio.Future[Msg] = loop.create_future()
                self._awaiting_answer[token] = fut
                tokens.append(token)
                futures.append(fut)
                await self.nc.publish(subject, payload, reply=f"{self._answers_inbox}.{token}", headers=headers)
            if futures:
                await asyncio.wait(futures, timeout=timeout)
        finally:
            for token in tokens:
                self._awaiting_answer.pop(token, None)
        return [f.result() if f.done() else None for f in futures]

    async def _on_answer(self, msg: Msg) -> None:
        fut = self._awaiting_answer.pop(msg.subject.rpartition(".")[2], None)
        if fut is not None and not fut.done():
            fut.set_result(msg)

    async def _append_raw(self, subject: str, payload: bytes, headers: dict[str, str]) -> int:
        delay = 0.25
        for attempt in range(_APPEND_ATTEMPTS):
            try:
                ack = await self.js.publish(subject, payload, headers=headers, timeout=5.0)
                return await self._stored_seq(ack, subject, headers)
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError, nats.js.errors.NoStreamResponseError,
                    nats.js.errors.APIError) as e:
                if isinstance(e, nats.js.errors.APIError) and (refused := _refusal(e, subject, headers)) is not None:
                    raise refused from e
                # Safe to retry: the same Nats-Msg-Id is stored once.
                if attempt == _APPEND_ATTEMPTS - 1:
                    raise BusError(f"append {headers['Nats-Msg-Id']!r} to {subject}: {_describe(e)}") from e
                log.warning("append retry", event_id=headers["Nats-Msg-Id"], error=_describe(e), attempt=attempt + 1)
                await asyncio.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    async def _stored_seq(self, ack: PubAck, subject: str, headers: dict[str, str]) -> int:
        """The sequence an ack names, once a duplicate ack is checked to point at a message on our subject.

        The duplicate window is per stream, not per subject: whoever published
        first under this id owns it (deploy/README.md, "Nats-Msg-Id squatting").
        The subject names the entity and the event tag (events.subjects), and
        publish permissions are per tag, so the same subject means the same
        kind of fact about the same thing. Payloads are not compared: an honest
        retry by a service re-encodes the event with a new occurred_at.
        """
        seq = int(ack.seq)
        if not ack.duplicate:
            return seq
        eid = headers["Nats-Msg-Id"]
        try:
            try:
                stored = await self.js.get_msg(self.stream, seq, direct=True)
            except nats.errors.NoRespondersError:  # a stream made without allow_direct
                stored = await self.js.get_msg(self.stream, seq)
        except nats.js.errors.NotFoundError:
            # Removed since (stream limits, an operator): there is nothing left to compare with.
            log.warning("duplicate append: the original is gone", event_id=eid, seq=seq, subject=subject)
            return seq
        except (nats.errors.Error, TimeoutError) as e:
            raise BusError(f"append {eid!r} to {subject}: acked as a duplicate of seq {seq}, which could not be "
                           f"checked: {_describe(e)}") from e
        if stored.subject != subject:
            raise IdSquatted(eid, seq, subject, str(stored.subject))
        return seq

    @staticmethod
    def _message(event: Event) -> tuple[str, bytes, dict[str, str]]:
        eid = event.event_id
        if not eid or "\r" in eid or "\n" in eid:
            raise ValueError(f"event_id must be a non-empty single line, got {eid!r}")
        return subject_for(event), encode(event), {"Nats-Msg-Id": eid}

    async def last_seq(self) -> int:
        info = await self.js.stream_info(self.stream)
        return int(info.state.last_seq)

    async def server_time(self) -> float | None:
        """The server's clock now, as its stream info says (`ts`, NATS 2.10+); None if it does not say or answer.

        The "now" of a reader with no fold to prove one (a CLI view, a usage report) against the
        stream's times (#30): this machine's wall clock may be minutes off the server's.
        """
        try:
            msg = await self.nc.request(f"$JS.API.STREAM.INFO.{self.stream}", b"", timeout=2.0)
            ts = json.loads(msg.data).get("ts")
            return dt.datetime.fromisoformat(ts).timestamp() if isinstance(ts, str) else None
        except (nats.errors.Error, TimeoutError, ValueError, AttributeError):
            return None

    # -- reading ---------------------------------------------------------------

    async def missing(self, seq: int) -> str | None:
        """Why the stream holds no message at `seq`; None if it holds one (or the server cannot say now).

        What a reader that must not skip reports when its fold needs `seq`: the
        stream's head moved past it (limits, a purge), or it was deleted. Read
        permissions suffice (stream info, direct get).
        """
        try:
            info = await self.js.stream_info(self.stream)
            first = int(info.state.first_seq)
            if seq < first:
                return f"{missing_range(seq, first - 1)} not in the stream: it now starts at seq {first} (removed " \
                       "by stream limits, retention or a purge)"
            if seq > int(info.state.last_seq):
                return None
            try:
                await self.js.get_msg(self.stream, seq, direct=True)
            except nats.errors.NoRespondersError:  # a stream made without allow_direct
                await self.js.get_msg(self.stream, seq)
        except nats.js.errors.NotFoundError:
            return f"seq {seq} was deleted from the stream"
        except (nats.errors.Error, TimeoutError):
            return None  # the reader reads again, and asks again if that misses it too
        return None

    async def replay(
        self,
        from_seq: int = 1,
        *,
        since: float | None = None,
        to_seq: int | None = None,
        subjects: list[str] | None = None,
        batch: int = 2000,
        stall_timeout: float = 30.0,
    ) -> AsyncGenerator[list[Envelope], None]:
        """The log from `from_seq` (or from stream time `since`, epoch seconds) in batches, in order.

        Ends after `to_seq`, or after the last sequence present when called,
        whichever is lower. `subjects` filter server-side (see events.subjects).
        Break out early inside `contextlib.aclosing(...)` so the consumer is
        removed at once.
        """
        if since is not None and from_seq != 1:
            raise ValueError("give from_seq or since, not both")
        end = await self.last_seq()
        if to_seq is not None:
            end = min(end, to_seq)
        if end < max(from_seq, 1):
            return
        reader = _Reader(
            self, _EphemeralConsumers(self, subjects, from_seq=from_seq, since=since), batch=batch,
            end=end, stall_timeout=stall_timeout,
        )
        async with aclosing(reader.batches()) as batches:
            async for items in batches:
                yield items

    async def tail(
        self,
        *,
        subjects: list[str] | None = None,
        from_seq: int | None = None,
        since: float | None = None,
        batch: int = 500,
    ) -> AsyncGenerator[Envelope, None]:
        """Events as they are appended, from now (default), from `from_seq` or from time `since`. Never ends."""
        if since is not None and from_seq is not None:
            raise ValueError("give from_seq or since, not both")
        consumers = _EphemeralConsumers(self, subjects, from_seq=from_seq, since=since, new_only=from_seq is None and
                                        since is None)
        reader = _Reader(self, consumers, batch=batch, end=None, stall_timeout=None)
        async with aclosing(reader.batches()) as batches:
            async for items in batches:
                for env in items:
                    yield env

    def durable(
        self,
        name: str,
        handler: Handler,
        subjects: list[str] | None = None,
        *,
        last_applied: int = 0,
        batch: int = 256,
        ack_wait: float = 30.0,
    ) -> DurableConsumer:
        """A named consumer that resumes where it stopped, also after its process died.

        See DurableConsumer. Pass the `last_applied` sequence you stored with
        your handler's effects to make a redelivery after a crash a no-op.
        """
        return DurableConsumer(self, name, handler, subjects, last_applied=last_applied, batch=batch,
                               ack_wait=ack_wait)

    async def kv(self, bucket: str, *, ttl: float | None = None, history: int = 1) -> KeyValue:
        """A KV bucket (heartbeats, leader lease), created on first use with these settings.

        Like the stream (`connect`): retried while a cluster forms; a user who may not
        create it waits for one who may, or gets PermissionDenied.
        """

        # Look first: agents may use a bucket, not create it.
        async def look(js: JetStreamContext) -> KeyValue | None:
            try:
                await js.key_value(bucket)
            except nats.js.errors.BucketNotFoundError:
                return None
            return await self.js.key_value(bucket)  # bound to the bus's context (its timeout), not the setup one

        async def create(js: JetStreamContext) -> KeyValue | None:
            try:
                await js.create_key_value(KeyValueConfig(bucket=bucket, ttl=ttl, history=history,
                                                         storage=StorageType.FILE, replicas=self.replicas))
            except nats.js.errors.BadRequestError as e:
                if e.err_code != _STREAM_NAME_IN_USE:
                    raise
                log.warning("kv bucket exists with other settings; using it as is", bucket=bucket, ttl=ttl,
                            history=history)
            return await self.js.key_value(bucket)

        found = await self._look_or_create(f"KV bucket {bucket}", f"KV_{bucket}", look, create)
        assert found is not None  # create returns the bucket
        return found

    # -- decoding --------------------------------------------------------------

    def _envelope(self, data: bytes, subject: str, seq: int, ts_ns: int) -> Envelope:
        event = decode(data)
        if event.__class__ is Unknown:
            self._log_unknown(event, seq, subject)
        return Envelope(seq, subject, ts_ns / 1e9, event)

    def _log_unknown(self, event: Unknown, seq: int, subject: str) -> None:
        # Once per reason, a closed set: keyed by the type a message claims, a hostile publisher
        # could make every reader log (and remember) a line per made-up type.
        if event.reason in self._unknown_logged:
            return
        self._unknown_logged.add(event.reason)
        log.warning("undecodable event (logged once per reason)", reason=event.reason, type=event.type, seq=seq,
                    subject=subject, error=event.error[:200])


# --- a service's own appends ------------------------------------------------------


async def append_reclaiming(bus: Bus, events: Sequence[Event], *, tries: int = 3) -> list[int]:
    """`append_many` for a service's own events: an id someone else took first gets a fresh one.

    Decision ids are predictable on purpose (two schedulers deciding the same
    thing at the same log position dedupe), so a publisher allowed on the
    stream can take one first (IdSquatted). Retrying the same id would fail for
    the whole duplicate window, and a squatter could hold a decision (say, a
    stop at a time limit) off for as long as it liked. So that one event goes
    in again under `<id>~<random>`: it loses id dedupe, which the fold makes up
    for (a repeated decision is void).
    """
    pending = list(events)
    for _ in range(tries):
        try:
            return await _append_all(bus, pending)
        except IdSquatted as e:
            log.error("event_id_squatted", event_id=e.event_id, seq=e.seq, found=e.found)
            fresh = f"{e.event_id}~{secrets.token_hex(8)}"
            pending = [msgspec.structs.replace(ev, event_id=fresh) if ev.event_id == e.event_id else ev
                       for ev in pending]
    return await _append_all(bus, pending)


async def _append_all(bus: Bus, events: list[Event]) -> list[int]:
    # One event (an agent's report): `append`, whose short per-try timeout rides out a
    # reconnect; append_many would wait out its ack window for a publish the old connection lost.
    return [await bus.append(events[0])] if len(events) == 1 else await bus.append_many(events)


# --- direct dispatch ------------------------------------------------------------

#: nats-py's parser state between frames (nats/protocol/parser.py; nats-py is pinned).
_AWAITING_CONTROL_LINE = 1

#: A replay's data frame in one match: subject, sid, then from the v1 ack reply
#: ($JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>) the stream
#: sequence, time and pending count, then header and total sizes. Splitting the
#: line and the reply in Python cost more per event than decoding it (#28);
#: any other frame (v2 replies included) takes the general path.
_DATA_FRAME = re.compile(
    rb"HMSG ([^ \r\n]+) ([0-9]+) \$JS\.ACK\.[^. \r\n]+\.[^. \r\n]+\.[0-9]+\.([0-9]+)\.[0-9]+\.([0-9]+)\.([0-9]+)"
    rb" ([0-9]+) ([0-9]+)\r\n")


def _install_direct_dispatch(nc: NATS, readers: dict[int, _Reader]) -> bool:
    """Hand replay/tail data messages from nats-py's protocol parser straight to their reader.

    For every message nats-py parses a headers dict (the Nats-Msg-Id every
    corral event carries), builds a Msg, queues it and switches to the
    subscription's task: ~40% of a replay's CPU (bench/RESULTS.md). A reader
    needs none of it for a data message: sequence and time are in the reply
    subject. Status messages (heartbeats, expiries: no data) and every other
    subscription keep nats-py's path. Hooked on the parser's one entry point
    (nats-py is pinned); if this nats-py has no such entry point, nothing is
    changed and readers use their callbacks (tests/test_bus.py checks which).
    """
    original = getattr(nc, "_process_msg", None)
    if original is None:
        return False
    try:
        params = list(inspect.signature(original).parameters)
    except (TypeError, ValueError):
        return False
    if params != ["sid", "subject", "reply", "data", "headers"] or not isinstance(getattr(nc, "stats", None), dict):
        return False
    stats = nc.stats

    async def process_msg(sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        reader = readers.get(sid)
        if reader is None or not data:
            await original(sid, subject, reply, data, headers)
            return
        stats["in_msgs"] += 1
        stats["in_bytes"] += len(data)
        if reader._on_data(subject, reply, data):
            await reader._fill()

    nc._process_msg = process_msg  # type: ignore[method-assign]
    _install_fast_parse(nc, readers, process_msg)
    return True


def _install_fast_parse(nc: NATS, readers: dict[int, _Reader], deliver: Callable[..., Awaitable[None]]) -> None:
    """Split MSG/HMSG frames off nats-py's read buffer without its per-message regexes, copies and awaits.

    nats-py's parser tries two regular expressions per message (MSG, then
    HMSG: every corral event has a header), deletes each frame from the
    front of its buffer, copies header and payload, and awaits a coroutine
    per message: most of what a replay from NATS costs beyond a fold of the
    same events from a file (bench/coldread.py, #28). This walks a chunk's
    whole frames with `find`, hands a reader's data messages to it directly
    (one await per batch, when it asks for more) and everything else (status
    messages, other subscriptions) to nats-py's own `_process_msg`, exactly
    as its parser would. Any other line (PING, INFO, -ERR, a malformed
    frame) is left to nats-py's parser, which then finishes the chunk; a
    frame it began is finished here.
    """
    ps = getattr(nc, "_ps", None)
    slow = getattr(ps, "parse", None)
    if ps is None or slow is None or not isinstance(getattr(ps, "buf", None), bytearray) \
            or getattr(ps, "state", None) != _AWAITING_CONTROL_LINE:
        return
    stats = nc.stats
    data_frame = _DATA_FRAME.match

    async def parse(data: bytes = b"") -> None:
        buf: bytearray = ps.buf  # reset() replaces it on reconnect: look it up each time
        buf.extend(data)
        if ps.state != _AWAITING_CONTROL_LINE:  # nats-py's parser read a frame's line, not yet its payload
            total, hlen = ps.needed, ps.header_needed
            if len(buf) < total + 2:
                return
            arg = ps.msg_arg
            hdr, payload = (bytes(buf[:hlen]) if hlen else None), bytes(buf[hlen:total])
            del buf[:total + 2]
            ps.header_needed, ps.state = 0, _AWAITING_CONTROL_LINE
            await deliver(arg["sid"], arg["subject"], arg["reply"], payload, hdr)
            buf = ps.buf
        pos, size = 0, len(buf)
        partial = False  # a frame's start is here, its end is not: wait for the next read
        while pos < size:
            m = data_frame(buf, pos)
            if m is not None and (reader := readers.get(int(m[2]))) is not None:
                start = m.end()
                end = start + int(m[7])
                if end + 2 > size:
                    partial = True
                    break
                hlen = int(m[6])
                if end > start + hlen:  # data, not a status
                    pos = end + 2
                    stats["in_msgs"] += 1
                    stats["in_bytes"] += end - start - hlen
                    # One copy of the payload (a bytearray slice), decoded as it is.
                    if not reader._on_frame(m[1], int(m[3]), int(m[4]), m[5], buf[start + hlen:end]):
                        continue
                    del buf[:pos]  # the buffer is consistent before any await
                    pos, size = 0, len(buf)
                    await reader._fill()
                    buf = ps.buf
                    size = len(buf)
                    continue
            if buf.startswith(b"HMSG ", pos):
                headers = True
            elif buf.startswith(b"MSG ", pos):
                headers = False
            else:
                break
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                partial = True
                break
            args = buf[pos + (5 if headers else 4):eol].split()
            if len(args) not in ((4, 5) if headers else (3, 4)):
                break  # nats-py's parser raises its ProtocolError about it
            try:
                total = int(args[-1])
                hlen = int(args[-2]) if headers else 0
                sid = int(args[1])
            except ValueError:
                break  # the same
            start = eol + 2
            end = start + total
            if end + 2 > size:
                partial = True  # the payload is not all here yet
                break
            has_reply = len(args) == (5 if headers else 4)
            payload = bytes(buf[start + hlen:end])
            pos = end + 2
            reader = readers.get(sid)
            if reader is not None and payload:
                stats["in_msgs"] += 1
                stats["in_bytes"] += end - start - hlen
                # The split's own bytearrays: _on_data only splits, compares and decodes them.
                if not reader._on_data(args[0], args[2] if has_reply else b"", payload):
                    continue
                del buf[:pos]  # the buffer is consistent before any await
                pos, size = 0, len(buf)
                await reader._fill()
            else:
                hdr = bytes(buf[start:start + hlen]) if hlen else None
                del buf[:pos]
                pos, size = 0, len(buf)
                await deliver(sid, bytes(args[0]), bytes(args[2]) if has_reply else b"", payload, hdr)
            buf = ps.buf
            size = len(buf)
        if pos:
            del buf[:pos]
        if buf and not partial:
            await slow(b"")

    ps.parse = parse


# --- consumers ----------------------------------------------------------------


class _EphemeralConsumers:
    """Makes the ephemeral AckNone consumer of a replay or tail, and re-makes it after a loss."""

    ack = False
    keep = False

    def __init__(
        self, bus: Bus, subjects: list[str] | None, *, from_seq: int | None, since: float | None,
        new_only: bool = False,
    ) -> None:
        self.bus = bus
        self.filters = normalize_filters(subjects)
        self.from_seq = from_seq
        self.since = since
        self.new_only = new_only

    async def create(self, resume_at: int | None) -> ConsumerInfo:
        """A fresh consumer at `resume_at` (after a loss) or at the read's own start."""
        cfg = ConsumerConfig(
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
        return await self.bus.js.add_consumer(self.bus.stream, cfg, timeout=5.0)

    async def delete(self, name: str) -> None:
        """Best effort and quick (it runs while a read is being cancelled): inactive_threshold is the backstop."""
        if not self.bus.nc.is_connected:
            return
        try:
            await self.bus.nc.request(f"$JS.API.CONSUMER.DELETE.{self.bus.stream}.{name}", b"", timeout=1.0)
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


class _Reset(Exception):
    """The consumer or its pull requests were lost; make a new one and go on."""


class _Reader:
    """Pull requests on one inbox, decoded in the subscription callback; recovers from losses.

    The callback only decodes and appends to a buffer; the reader's own loop
    takes whole buffers, so a replay costs one await per batch, not per message.
    Flow: two requests of `batch` messages are kept outstanding (so the server
    never waits for a round trip), and none is sent while four batches wait to
    be taken (backpressure: a slow reader holds at most ~6 batches in memory).
    Requests expire after _EXPIRES and ask for idle heartbeats, so silence for
    three heartbeats means the consumer or the connection is gone: start over.

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
        bus: Bus,
        consumers: _EphemeralConsumers | _DurableConsumers,
        *,
        batch: int,
        end: int | None,
        stall_timeout: float | None,
    ) -> None:
        self.bus = bus
        self.nc = bus.nc
        self.consumers = consumers
        self.batch = max(1, batch)
        #: Buffered messages beyond which no more are requested until the reader catches up.
        self._high = 4 * self.batch
        self.end = end
        self.stall_timeout = stall_timeout
        self.keep_reply = consumers.ack
        #: Next stream sequence to ask for after a reset (None: the read's own start): the one
        #: after the last handed to the caller, never after one only buffered.
        self.resume_at: int | None = None
        self._buf: list[Any] = []
        self._wake = asyncio.Event()
        #: The read is over (a replay's end handed out, or `finish()`): no new consumer.
        self._done = False
        #: A replay's last message (or the server's "no more") is in the buffer: request nothing more.
        self._end_seen = False
        self._reset_reason: str | None = None
        self._error: BaseException | None = None
        self._want = 0  # messages requested and not yet delivered or expired
        self._waiting = False  # the reader waits for _wake: only then must a message set it
        #: The current subscription's id; messages of any other (a replaced consumer's) are ignored.
        self._sid: int | None = None
        self._next_req = b""
        self._inbox = ""
        self._api = ""

    async def batches(self) -> AsyncGenerator[list[Any], None]:
        """Lists of Envelopes (or, for durables, (Envelope, reply subject, consumer seq) tuples)."""
        self.bus._reconnect_listeners.add(self._on_reconnect)
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
                except (TimeoutError, _Reset, nats.errors.Error) as e:
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
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)
                finally:
                    self._detach(sub)
                    if sub is not None:
                        try:
                            await sub.unsubscribe()
                        except nats.errors.Error:
                            pass
                    if name is not None and not self.consumers.keep:
                        await self.consumers.delete(name)
        finally:
            self.bus._reconnect_listeners.discard(self._on_reconnect)

    def _detach(self, sub: Any) -> None:
        """Stop `sub` from feeding the reader (synchronous: call it before the first await of a reset)."""
        if sub is None:
            return
        self.bus._direct.pop(sub._id, None)
        if self._sid == sub._id:
            self._sid = None

    async def _subscribe(self, name: str, info: ConsumerInfo) -> Any:
        # Whatever is still buffered was never handed out: resume_at is before it, the new consumer re-reads it.
        self._buf = []
        self._end_seen = False
        self._wake.clear()
        self._reset_reason = None
        self._want = 0
        self._api = f"$JS.API.CONSUMER.MSG.NEXT.{self.bus.stream}.{name}"
        req: dict[str, Any] = {"batch": self.batch, "expires": int(self._EXPIRES * 1e9),
                               "idle_heartbeat": int(self._HEARTBEAT * 1e9)}
        self._next_req = json.dumps(req).encode()
        self._inbox = self.nc.new_inbox()
        self._on_start(info)
        cb = self._on_msg_ack if self.keep_reply else self._on_msg
        sub = await self.nc.subscribe(self._inbox, cb=cb)
        self._sid = sub._id
        if not self.keep_reply and self.bus._direct_ok:
            self.bus._direct[sub._id] = self  # data messages bypass cb (see _install_direct_dispatch)
        await self._fill()
        return sub

    def _on_start(self, info: ConsumerInfo) -> None:
        """Hook for durables (consumer sequence tracking)."""

    async def _fill(self) -> None:
        """Keep up to two batches requested, unless the reader is `_high` messages behind or must not ask."""
        while (self._want < 2 * self.batch and len(self._buf) < self._high and not self._done
               and not self._end_seen and self._reset_reason is None):
            self._want += self.batch
            await self.nc.publish(self._api, self._next_req, reply=self._inbox)

    async def _run(self) -> AsyncGenerator[list[Any], None]:
        """The current consumer's batches; returns at the end of a replay, raises _Reset to start over.

        A reset (`_reset_reason`) is raised only once the buffer is empty: what
        arrived before it is handed out first, and nothing arrives after it.
        """
        watchdog = 3 * self._HEARTBEAT
        while True:
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
                    # Set, not raised: from here on the callback ignores this consumer. A batch that
                    # came in the same loop turn as the expiry (a process resumed from a pause) is
                    # still handed out below; the next consumer starts after it.
                    self._reset_reason = "no message or heartbeat from the consumer"
                finally:
                    self._waiting = False
            if self._error is not None:
                raise self._error
            if self._buf:
                items, self._buf = self._buf, []
                last = items[-1]
                self.resume_at = (last[0] if self.keep_reply else last).seq + 1
                yield items
            if self._done:
                return
            if not self._buf:
                if self._end_seen:
                    self._done = True
                    return
                if self._reset_reason is not None:
                    raise _Reset(self._reset_reason)
            await self._fill()

    def _on_reconnect(self) -> None:
        # Pull requests (and an in-memory consumer) may not have survived.
        self._reset_reason = "reconnected"
        self._wake.set()

    def _status(self, msg: Msg) -> None:
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
            t = reply.split(b".")  # see _ack_fields
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
        try:
            self._want -= 1
            end = self.end
            if end is not None and sseq > end:
                self._end_seen = True
            else:
                event = decode(data)
                subj = subject.decode()
                if event.__class__ is Unknown:
                    self.bus._log_unknown(event, sseq, subj)
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

    async def _on_msg_ack(self, msg: Msg) -> None:
        if msg._sid != self._sid:
            return  # a replaced consumer's: the new one redelivers it (from the durable's last_applied)
        data = msg.data
        if not data and msg.headers and "Status" in msg.headers:
            self._status(msg)
            await self._fill()
            return
        if self._reset_reason is not None:
            return
        try:
            sseq, dseq, _n, ts, _pending = _ack_fields(msg.reply)
            self._want -= 1
            self._buf.append((self.bus._envelope(data, msg.subject, sseq, ts), msg.reply, dseq))
            if self._waiting:
                self._waiting = False
                self._wake.set()
            if self._want <= self.batch and len(self._buf) < self._high:
                await self._fill()
        except Exception as e:
            self._error = e
            self._wake.set()

    def finish(self) -> None:
        """Stop after the current batch (durables)."""
        self._done = True
        self._wake.set()


# --- durable consumers -------------------------------------------------------------


class _DurableConsumers:
    """Creates the named consumer, or re-creates it at `resume_at` so delivery restarts in order."""

    ack = True
    keep = True

    def __init__(self, durable: DurableConsumer) -> None:
        self.d = durable

    async def create(self, resume_at: int | None) -> ConsumerInfo:
        d, js, stream = self.d, self.d.bus.js, self.d.bus.stream
        cfg = d.config()
        info: ConsumerInfo | None
        try:
            info = await js.consumer_info(stream, d.name, timeout=5.0)
        except nats.js.errors.NotFoundError:
            info = None
        if info is not None:
            same = (sorted(info.config.filter_subjects or [info.config.filter_subject or ALL]) == sorted(d.filters)
                    and info.config.ack_policy == AckPolicy.EXPLICIT)
            in_flight = bool(info.num_ack_pending) or bool(info.num_redelivered)
            if same and not in_flight and resume_at is None:
                return info
            # Delivered-but-unacked messages would come back only after ack_wait,
            # behind newer ones. Start over at the first one not applied, in order.
            floor = info.ack_floor.stream_seq if info.ack_floor else 0
            start = max(floor, d.last_applied) + 1
            log.info("durable restarts delivery", name=d.name, start=start, unacked=info.num_ack_pending,
                     filters_changed=not same)
            await js.delete_consumer(stream, d.name)
        else:
            start = d.last_applied + 1
        cfg.deliver_policy, cfg.opt_start_seq = DeliverPolicy.BY_START_SEQUENCE, max(start, 1)
        return await js.add_consumer(stream, cfg, timeout=5.0)

    async def delete(self, name: str) -> None:  # pragma: no cover - durables are kept
        pass


class _DurableReader(_Reader):
    """A Reader that notices lost deliveries by their consumer sequence."""

    expected_dseq: int | None = None

    def _on_start(self, info: ConsumerInfo) -> None:
        self.expected_dseq = (info.delivered.consumer_seq if info.delivered else 0) + 1


class DurableConsumer:
    """Applies every event of its filters exactly once, in log order, across restarts.

    How: events are handled one at a time and acked after the handler returns;
    `last_applied` (the stream seq of the last handled event) skips anything
    delivered again. After a crash, unacked events would be redelivered only
    after ack_wait and behind newer ones, so on start (and whenever a delivery
    is lost: a gap in consumer sequences) the consumer is re-created at the
    first sequence not applied. For exactly-once effects across process
    restarts, store `env.seq` with your handler's effect and pass it back as
    `last_applied`; without it the server's ack floor gives at-least-once.

    `run()` returns after `stop()` and raises the handler's first error (the
    event is then not acked, and is redelivered on the next run).
    """

    def __init__(
        self, bus: Bus, name: str, handler: Handler, subjects: list[str] | None, *, last_applied: int,
        batch: int, ack_wait: float,
    ) -> None:
        self.bus = bus
        self.name = check_id(name, "durable name")
        self.handler = handler
        self.filters = normalize_filters(subjects)
        self.last_applied = last_applied
        self.batch = batch
        self.ack_wait = ack_wait
        self._reader: _DurableReader | None = None
        self._stopping = False
        self._task: asyncio.Task[None] | None = None

    def config(self) -> ConsumerConfig:
        cfg = ConsumerConfig(
            durable_name=self.name,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.ack_wait,
            max_deliver=-1,
            max_ack_pending=max(1000, 2 * self.batch),
        )
        if len(self.filters) == 1:
            cfg.filter_subject = self.filters[0]
        else:
            cfg.filter_subjects = self.filters
        return cfg

    async def run(self) -> None:
        reader = _DurableReader(self.bus, _DurableConsumers(self), batch=self.batch, end=None, stall_timeout=None)
        self._reader = reader
        if self._stopping:
            return
        nc = self.bus.nc
        last_ack = ""
        try:
            async with aclosing(reader.batches()) as batches:
                async for items in batches:
                    for env, reply, dseq in items:
                        expected = reader.expected_dseq
                        if expected is not None and dseq != expected:
                            # A delivery went missing (lost in a reconnect): start over after last_applied.
                            log.warning("durable delivery gap", name=self.name, expected=expected, got=dseq)
                            reader.resume_at = self.last_applied + 1
                            reader._reset_reason = "delivery gap"
                            break
                        reader.expected_dseq = dseq + 1
                        if env.seq > self.last_applied:
                            result = self.handler(env)
                            if inspect.isawaitable(result):
                                await result
                            self.last_applied = env.seq
                        await nc.publish(reply, b"+ACK")
                        last_ack = reply
                        if self._stopping:
                            break  # the rest of the batch is neither handled nor acked: the next run gets it
                    reader.resume_at = self.last_applied + 1
                    if self._stopping:
                        return
        finally:
            if last_ack and nc.is_connected:
                # Acks are fire-and-forget; one acknowledged ack means the server has processed
                # every earlier one too, so whoever starts this consumer next sees an exact ack floor.
                try:
                    await nc.request(last_ack, b"+ACK", timeout=2.0)
                except (nats.errors.Error, TimeoutError):
                    pass

    async def stop(self) -> None:
        """Finish the event in hand, ack it, and make run() return. Idempotent."""
        self._stopping = True
        if self._reader is not None:
            self._reader.finish()
        if self._task is not None:
            task, self._task = self._task, None
            await task

    async def __aenter__(self) -> DurableConsumer:
        self._task = asyncio.create_task(self.run(), name=f"durable:{self.name}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
