"""Appending to the log: one event, one after a known last message on its subject, or many pipelined.

`append` publishes with `Nats-Msg-Id = event.event_id`, so a publish retried
after a lost ack is stored once: JetStream answers a duplicate with the
original's sequence, which `append` returns. `append_many` pipelines the
publishes (one connection, acks gathered): 5-8x the throughput of awaiting
each ack. A duplicate ack is believed only if the message it names is on the
subject we published to (anyone may publish first under an id the scheduler
will use: IdSquatted). Timeouts and elections are retried; a stream at its
limit raises LogFull at once, with the server's reason.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Iterable, Sequence
from typing import Protocol

import msgspec
import nats.errors
import nats.js.errors
import structlog
from nats.aio.msg import Msg
from nats.js.api import PubAck

from events.bus.errors import AppendRefused, BusError, IdSquatted, LogFull, NotLast, describe
from events.bus.link import Link
from events.subjects import subject_for
from schemas import Event, encode

log = structlog.get_logger("corral.bus")

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


class Publisher:
    """The appends of one connection (`link`), with append_many's answers inbox."""

    def __init__(self, link: Link) -> None:
        self.link = link
        #: append_many's publishes awaiting the server's answer, by reply token (see _publish_pipelined).
        self._answers_inbox: str | None = None
        self._awaiting_answer: dict[str, asyncio.Future[Msg]] = {}
        self._last_token = 0

    async def append(self, event: Event) -> int:
        return await self._append_raw(*self._message(event))

    async def append_after(self, event: Event, last_seq: int) -> int:
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
            stored = await self.link.message_at(seq)
        except (nats.errors.Error, TimeoutError):
            return False  # not known to be ours: NotLast, and the caller looks at the log
        return stored.subject == subject and (stored.headers or {}).get("Nats-Msg-Id") == event_id

    async def append_many(self, events: Iterable[Event], *, timeout: float) -> list[int]:
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
        nc = self.link.nc
        if self._answers_inbox is None:
            # Set before the await: publishes after this line are queued behind the SUB, so their answers arrive.
            self._answers_inbox = nc.new_inbox()
            await nc.subscribe(f"{self._answers_inbox}.*", cb=self._on_answer)
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
                await nc.publish(subject, payload, reply=f"{self._answers_inbox}.{token}", headers=headers)
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
                ack = await self.link.js.publish(subject, payload, headers=headers, timeout=5.0)
                return await self._stored_seq(ack, subject, headers)
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError, nats.js.errors.NoStreamResponseError,
                    nats.js.errors.APIError) as e:
                if isinstance(e, nats.js.errors.APIError) and (refused := _refusal(e, subject, headers)) is not None:
                    raise refused from e
                # Safe to retry: the same Nats-Msg-Id is stored once.
                if attempt == _APPEND_ATTEMPTS - 1:
                    raise BusError(f"append {headers['Nats-Msg-Id']!r} to {subject}: {describe(e)}") from e
                log.warning("append retry", event_id=headers["Nats-Msg-Id"], error=describe(e), attempt=attempt + 1)
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
            stored = await self.link.message_at(seq)
        except nats.js.errors.NotFoundError:
            # Removed since (stream limits, an operator): there is nothing left to compare with.
            log.warning("duplicate append: the original is gone", event_id=eid, seq=seq, subject=subject)
            return seq
        except (nats.errors.Error, TimeoutError) as e:
            raise BusError(f"append {eid!r} to {subject}: acked as a duplicate of seq {seq}, which could not be "
                           f"checked: {describe(e)}") from e
        if stored.subject != subject:
            raise IdSquatted(eid, seq, subject, str(stored.subject))
        return seq

    @staticmethod
    def _message(event: Event) -> tuple[str, bytes, dict[str, str]]:
        eid = event.event_id
        if not eid or "\r" in eid or "\n" in eid:
            raise ValueError(f"event_id must be a non-empty single line, got {eid!r}")
        return subject_for(event), encode(event), {"Nats-Msg-Id": eid}


# --- a service's own appends ------------------------------------------------------


class Appends(Protocol):
    """What `append_reclaiming` needs of a bus."""

    async def append(self, event: Event) -> int: ...

    async def append_many(self, events: Iterable[Event], *, timeout: float = ...) -> list[int]: ...


async def append_reclaiming(bus: Appends, events: Sequence[Event], *, tries: int = 3) -> list[int]:
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


async def _append_all(bus: Appends, events: list[Event]) -> list[int]:
    # One event (an agent's report): `append`, whose short per-try timeout rides out a
    # reconnect; append_many would wait out its ack window for a publish the old connection lost.
    return [await bus.append(events[0])] if len(events) == 1 else await bus.append_many(events)
