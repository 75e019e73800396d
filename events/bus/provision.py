"""Setting up what the bus needs on the server: the stream and the KV buckets, retried while a cluster forms.

Every service may call it (create-or-update, idempotent). Looks before it
writes: every role may read the stream's info, only the scheduler's may create
or change it (deploy/nats/permissions.py). A forming cluster (no JetStream meta
leader yet, or one that has not met every peer) answers nothing or "no suitable
peers" for its first seconds: asked again for up to `ready_timeout` seconds,
then NotReady names what it waited for. A refusal of the user's permissions is
PermissionDenied at once, or with `wait_for_creator` a wait until another user
created it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats.errors
import nats.js.errors
import structlog
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, RetentionPolicy, StorageType, StreamConfig
from nats.js.kv import KeyValue

from events.bus.errors import NotReady, PermissionDenied, describe
from events.bus.link import Link
from events.subjects import ALL

log = structlog.get_logger("corral.bus")

#: JetStream error code: "stream name already in use with a different configuration".
_STREAM_NAME_IN_USE = 10058
#: JetStream error code: "no suitable peers for placement". A cluster whose meta leader has not
#: yet met every peer answers a replicated create with it for its first seconds (then it heals).
_NO_PLACEMENT = 10005
#: Seconds a setup request (look up or create the stream or a bucket) may go unanswered before it
#: is asked again; doubled per try up to the last. Short first: a cluster without a meta leader
#: answers nothing, and one is usually elected within a second of a quorum being up.
_SETUP_TIMEOUTS = (1.0, 2.0, 4.0, 5.0)

_T = TypeVar("_T")

#: Consumers the stream holds at once. Unset, nats-server caps a stream at 1,000 (error 10026), and every
#: agent has its own filtered consumer of its node's slice (#40), every CLI reader one more: a cluster of
#: thousands of nodes needs more. An operator's higher figure is kept.
MAX_CONSUMERS = 100_000


def _at_least(current: int | None, floor: int) -> int:
    return current if current is not None and (current >= floor) else floor


class Setup:
    """Creates or checks the stream and buckets of `link` at `replicas`, as `user` (for error messages)."""

    def __init__(self, link: Link, replicas: int, *, user: str | None, wait_for_creator: bool,
                 ready_timeout: float) -> None:
        self.link = link
        self.replicas = replicas
        self.user = user
        self.wait_for_creator = wait_for_creator
        self.ready_timeout = ready_timeout
        #: Setup requests in flight, by lowercased subject: set when the server refuses that subject.
        self._refusal_waiters: dict[str, set[asyncio.Future[None]]] = {}

    async def ensure_stream(self, duplicate_window: float) -> None:
        stream = self.link.stream
        config = StreamConfig(
            name=stream,
            subjects=[ALL],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            num_replicas=self.replicas,
            duplicate_window=duplicate_window,
            allow_direct=True,
            max_consumers=MAX_CONSUMERS,
        )

        async def look(js: JetStreamContext) -> StreamConfig | None:
            try:
                return (await js.stream_info(stream)).config
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

        current = await self._look_or_create(f"stream {stream}", stream, look, create)
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
            await self._until_ready(f"update stream {stream}", f"$JS.API.STREAM.UPDATE.{stream}",
                                    lambda js: js.update_stream(wanted))

    async def ensure_consumer_room(self) -> None:
        """Raise the stream's consumer limit to MAX_CONSUMERS, for a stream created before it was set (the
        scheduler calls it: other roles may not update the stream, and use it as it is)."""
        stream = self.link.stream
        current = (await self.link.js.stream_info(stream)).config
        wanted = current.evolve(max_consumers=_at_least(current.max_consumers, MAX_CONSUMERS))
        if wanted != current:
            await self._until_ready(f"update stream {stream}", f"$JS.API.STREAM.UPDATE.{stream}",
                                    lambda js: js.update_stream(wanted))

    async def kv(self, bucket: str, *, ttl: float | None, history: int) -> KeyValue:
        """The bucket, created on first use with these settings; bound to the link's context (its timeout)."""

        # Look first: agents may use a bucket, not create it.
        async def look(js: JetStreamContext) -> KeyValue | None:
            try:
                await js.key_value(bucket)
            except nats.js.errors.BucketNotFoundError:
                return None
            return await self.link.js.key_value(bucket)  # the bus's context, not the setup one

        async def create(js: JetStreamContext) -> KeyValue | None:
            try:
                await js.create_key_value(KeyValueConfig(bucket=bucket, ttl=ttl, history=history,
                                                         storage=StorageType.FILE, replicas=self.replicas))
            except nats.js.errors.BadRequestError as e:
                if e.err_code != _STREAM_NAME_IN_USE:
                    raise
                log.warning("kv bucket exists with other settings; using it as is", bucket=bucket, ttl=ttl,
                            history=history)
            return await self.link.js.key_value(bucket)

        found = await self._look_or_create(f"KV bucket {bucket}", f"KV_{bucket}", look, create)
        assert found is not None  # create returns the bucket
        return found

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
            js = self.link.nc.jetstream(timeout=_SETUP_TIMEOUTS[min(attempt, len(_SETUP_TIMEOUTS) - 1)])
            try:
                return await self._unless_refused(operation, subject, request(js))
            except (TimeoutError, nats.errors.NoRespondersError, nats.js.errors.ServiceUnavailableError) as e:
                reason = "no JetStream meta leader"
                detail = (f"{subject} got {'no answer' if isinstance(e, TimeoutError) else describe(e)}; "
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
        callback (`note_refusal`), so the request is given up then, naming what was refused.
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

    def note_refusal(self, e: Exception) -> None:
        """Wake the setup requests whose subject the server refused (nats-py lowercases the -ERR text)."""
        text = str(e).lower()
        marker = "permissions violation for publish to "
        if marker not in text:
            return
        subject = text.split(marker, 1)[1].strip().strip("'\"")
        for waiter in self._refusal_waiters.get(subject, ()):
            if not waiter.done():
                waiter.set_result(None)
