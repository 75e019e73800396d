"""Following the log into a projection: the one fold loop every service shares.

The scheduler, the node agents and the live CLI views all hold the same
projection (`orchestrator.core.evolve` over the log); this is the IO around
any such fold, which the caller passes in with its initial state (the bus
knows no core): catch up by the fast replay path, then tail live, skipping
anything already folded (so a redelivery is never applied twice, DESIGN.md
invariant 6).

Exactly once and in order, or stop (#19): a follower reads the whole stream,
whose positions are contiguous, so every fold checks that an event sits at
exactly `state.seq + 1`. At or below it is a redelivery, skipped silently.
Beyond it, the read lost events: the follower reads again from its last
folded position. If the log no longer holds that position (deleted, or the
stream's head moved past it), or reads keep missing it, it raises LogGap
naming the position; a service then exits non-zero. It never skips.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Generic, Protocol, TypeVar

import structlog

from events.bus import LogGap
from events.envelope import Envelope
from events.logsource import LogSource
from events.streamclock import StreamClock
from schemas import AnyEvent, Unknown

log = structlog.get_logger("corral.follow")

_T = TypeVar("_T")


class Positioned(Protocol):
    """A projection that knows the last log position folded into it."""

    @property
    def seq(self) -> int: ...


S = TypeVar("S", bound=Positioned)

#: `fold(state, event, seq, at) -> state`: apply the event at log position `seq` (it may work in place); `at` is
#: when the stream stored it for a reader that dates events by the stream's clock, None for one that takes the
#: publishers' `occurred_at` (#30: the scheduler and agents judge time, so they take the stream's).
Fold = Callable[[S, AnyEvent | Unknown, int, float | None], S]

#: Reads in a row that may miss the same position (which the log still holds) before a reader gives up.
REREADS = 3


def fold_batch(state: S, batch: list[Envelope], fold: Fold[S], *, contiguous: bool = True,
               stream_times: bool = False) -> S:
    """Fold a replay batch into `state`, skipping positions it already holds (every reader's fold loop).

    `contiguous` (a read of the whole stream): an event beyond `state.seq + 1`
    raises LogGap; the events before it are folded (`evolve` works in place),
    and the caller reads again from `state.seq + 1`. A log file folds what it
    holds: an export may be filtered or start anywhere. `stream_times`: `fold`'s `at` is each event's
    stream time (Follower's `stream_times`).
    """
    for env in batch:
        seq = env.seq
        if seq > state.seq:
            if contiguous and seq != state.seq + 1:
                raise LogGap(state.seq + 1, seq)
            state = fold(state, env.event, seq, env.stream_time if stream_times else None)
    return state


class Rereads:
    """What a reader of the whole stream does about a gap: read again from the missing position, or stop.

    One per read loop. `check` returns when reading again may deliver the
    position; it raises LogGap when the log no longer holds it (asked of the
    stream itself, not inferred from the read that just lost something) or
    when REREADS reads in a row missed the same position.
    """

    def __init__(self, bus: LogSource) -> None:
        self.bus = bus
        self._at = 0
        self._misses = 0

    async def check(self, gap: LogGap) -> None:
        why = await self.bus.missing(gap.expected)
        if why is None:
            self._misses = self._misses + 1 if self._at == gap.expected else 1
            self._at = gap.expected
            if self._misses < REREADS:
                log.warning("log_gap_reread", expected=gap.expected, found=gap.found, attempt=self._misses)
                return
            why = f"the log holds seq {gap.expected}, but {self._misses} reads in a row did not deliver it"
        log.error("log_gap", expected=gap.expected, found=gap.found, why=why)
        raise LogGap(gap.expected, gap.found, why) from None


class Follower(Generic[S]):
    """`fold` over the log from `initial` (a fresh state, or a snapshot at its `seq`), kept in `state`.

    `bus` is any LogSource: the stream (`Bus`), the archive and the stream
    (`History`), or a log file (`LogFile`, whose `follow` ends at its last line).
    """

    def __init__(self, bus: LogSource, fold: Fold[S], initial: S, *, stream_times: bool = False,
                 subjects: list[str] | None = None) -> None:
        self.bus = bus
        self.fold = fold
        self.state = initial
        #: A slice of the log, filtered by the server (an agent's node, issue #40: events/subjects.py
        #: `slice_filters`), or None for the whole log. A slice's positions are not contiguous: it is read from
        #: the position after the state's, in order, each position once; a start the stream no longer holds
        #: raises LogGap (`_check_start`). Needs a source that filters (`Bus`).
        self.subjects = subjects
        #: The highest position read through: a slice's fold may lie behind it where nothing of the slice is.
        self.read_through = initial.seq
        #: Date each event by when the stream stored it (`fold`'s `at`), not by its publisher's clock: what a
        #: reader that judges time across machines folds (the scheduler, the agents; #30). Reporting readers
        #: keep the publishers' times, so a log loaded from a simulation keeps its history.
        self.stream_times = stream_times
        #: The log's time as far as what this follower read proves it (events/streamclock.py): the "now"
        #: of every time judgement against the fold's times.
        self.clock = StreamClock()
        #: Set whenever an event was folded; consumers clear it when they have looked.
        self.changed = asyncio.Event()
        self._listeners: list[Callable[[Envelope], None]] = []
        self._seq_waiters: list[tuple[int, asyncio.Future[None]]] = []
        #: The log's last position when this follower first read it (its first `catch_up` or
        #: `follow`): what "caught up" means for a service's readiness (/readyz). Taken once: a
        #: busy log never holds still, so "the end now" would keep a service unready forever.
        self.target: int | None = None
        #: The event types folded as "no change" because this corral does not know them (Unknown with
        #: reason unknown_type), since the log's start: what a snapshot of `state` records (events/
        #: snapshots.py). Whoever starts `state` from a snapshot sets it from that snapshot's record
        #: (None: not known; it then stays None).
        self.skipped: set[str] | None = set()

    def _note_unknown(self, env: Envelope) -> None:
        ev = env.event
        if ev.__class__ is Unknown and self.skipped is not None:
            tag = ev.type
            if tag is not None and ev.reason == "unknown_type":
                self.skipped.add(tag)

    @property
    def position(self) -> int:
        """The last log position read: a slice's fold (`subjects`) read past the positions it did not hold."""
        return max(self.state.seq, self.read_through)

    @property
    def caught_up(self) -> bool:
        """Whether the fold has reached `target` (the fold only moves forward: once true, it stays true)."""
        return self.target is not None and self.position >= self.target

    async def _take_target(self) -> None:
        if self.target is None:
            self.target = await self.bus.last_seq()

    def on_event(self, listener: Callable[[Envelope], None]) -> None:
        """Called after each folded event (for counters, live views)."""
        self._listeners.append(listener)

    def apply(self, env: Envelope) -> bool:
        """Fold `env` if it is the next position; False if it is folded already (a redelivery).

        Raises LogGap if it is beyond the next position: read again from `state.seq + 1`.
        """
        seq = env.seq
        if seq <= self.state.seq:
            return False
        if seq != self.state.seq + 1 and self.subjects is None:
            raise LogGap(self.state.seq + 1, seq)
        self.read_through = max(self.read_through, seq)
        self.state = self.fold(self.state, env.event, seq, env.stream_time if self.stream_times else None)
        self.clock.saw(env.stream_time)
        self._note_unknown(env)
        for listener in self._listeners:
            listener(env)
        self.changed.set()
        if self._seq_waiters:
            self._wake()
        return True

    def _wake(self) -> None:
        keep = []
        through = self.position
        for seq, fut in self._seq_waiters:
            if through >= seq:
                if not fut.done():
                    fut.set_result(None)
            else:
                keep.append((seq, fut))
        self._seq_waiters = keep

    async def wait_changed(self, timeout: float) -> None:
        """Until an event is folded (`changed` is set) or `timeout` seconds pass; the caller clears `changed`.

        asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a
        cancellation that arrives just as the event fires, so a loop around it
        that is cancelled while events keep coming (SIGTERM, Ctrl-C, a test's
        deadline) runs on and never stops.
        """
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self.changed.wait()

    async def wait_for_seq(self, seq: int) -> None:
        """Until the fold has reached `seq` (e.g. our own append came back; in a slice, one of its own positions)."""
        if self.position >= seq:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._seq_waiters.append((seq, fut))
        await fut

    async def catch_up(self, to_seq: int | None = None) -> None:
        """Fold the log up to `to_seq` (default: its end now)."""
        await self._take_target()
        if self.subjects is None:
            await self._fold_from(lambda start: self.bus.replay(from_seq=start, to_seq=to_seq), self.apply_batch)
            return
        end = await self.bus.last_seq() if to_seq is None else to_seq
        first = self.position + 1
        await self._check_start()
        await self._fold_from(lambda start: self.bus.replay(from_seq=start, to_seq=end, subjects=self.subjects),
                              self.apply_batch)
        # A position deleted in between may have been this slice's: stop, naming it, as a whole-log reader does.
        if (gone := await self.bus.deleted_in(first, end)) is not None:
            why = f"seq {gone} was deleted from the stream"
            log.error("log_gap", expected=gone, why=why, subjects=self.subjects)
            raise LogGap(gone, gone + 1, why)
        self.read_through = max(self.read_through, end)
        self._wake()

    async def _check_start(self) -> None:
        """A slice starts after its state's position: the stream must still hold that position (or be before it)."""
        start = self.position + 1
        why = await self.bus.missing(start)
        if why is not None and "not in the stream" in why:
            log.error("log_gap", expected=start, why=why, subjects=self.subjects)
            raise LogGap(start, start, why)

    def apply_batch(self, batch: list[Envelope]) -> None:
        """`apply` for a replay batch: the same fold, with one wake-up per batch instead of per event.

        This loop is most of a rebuild's own cost (bench/rebuild.py), so with
        nobody listening per event it calls `fold` and nothing else. A gap
        raises LogGap with the events before it folded.
        """
        if self._listeners:
            for env in batch:
                self.apply(env)
            return
        before = self.state.seq
        try:
            self.state = fold_batch(self.state, batch, self.fold, contiguous=self.subjects is None,
                                    stream_times=self.stream_times)
        finally:
            after = self.state.seq
            self.read_through = max(self.read_through, after)
            for env in batch:  # (a second pass: this loop's cost is one class check per event)
                if env.event.__class__ is Unknown and before < env.seq <= after:
                    self._note_unknown(env)
            if batch:
                self.clock.saw(batch[-1].stream_time)  # the newest of the batch proves the most
            self.changed.set()
            if self._seq_waiters:
                self._wake()

    async def follow(self) -> None:
        """Tail the log forever (after `catch_up`)."""
        await self._take_target()
        if self.subjects is not None:
            await self._check_start()
        await self._fold_from(lambda start: self.bus.tail(from_seq=start, subjects=self.subjects), self.apply)

    async def _fold_from(self, read: Callable[[int], AsyncGenerator[_T, None]], fold: Callable[[_T], object]) -> None:
        """`fold` each item of `read(state.seq + 1)`; after a gap, read again from the new `state.seq + 1`."""
        rereads = Rereads(self.bus)
        while True:
            try:
                async with aclosing(read(self.position + 1)) as items:
                    async for item in items:
                        fold(item)
                return
            except LogGap as gap:
                await rereads.check(gap)
