"""The whole log, read from the archive and the stream as one: what readers use once retention is on.

With retention (#28) the stream keeps only its newer positions; the older
ones are in the archive (events/archive.py). `History` answers the part of
`Bus` that readers use -- `last_seq`, `replay`, `tail`, `missing`, the
`js`/`replicas` the snapshot readers look at and the `nc` requests go over -- so a Follower, `corral
replay --at`, `explain`, `usage` and `tail --from-seq` read old positions
with the same code as new ones.

Which source answers a position: the archive, for every position it holds;
the stream for the rest. Reading the archive first is what makes a read
race-free against the archiver: the stream drops only positions the archive
already held (orchestrator/archiver.py purges up to its archived end), so a
position past the archive's end when a read starts is still in the stream,
whatever the archiver purges meanwhile.

Where neither holds a position, a read raises LogGap naming the range and
what each source holds; a segment that fails its check is refused (LogGap
naming the file), never folded.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass

import nats.errors
import nats.js.errors

from events.archive import Archive, Manifest, Record, SegmentRefused
from events.authorship import read_event
from events.bus import Bus, Envelope, LogGap, missing_range
from events.subjects import matches, normalize_filters
from schemas import Unknown


@dataclass(frozen=True)
class _Piece:
    """Positions lo..hi of a read, from one segment (`segment`) or from the stream (None)."""

    lo: int
    hi: int
    segment: Manifest | None


class History:
    """`Bus`'s read side over `archive` + the stream of `bus`."""

    def __init__(self, bus: Bus, archive: Archive) -> None:
        self.bus = bus
        self.archive = archive
        self.js = bus.js
        self.nc = bus.nc  # requests (the index's corral-index.*) go over the same connection
        self.replicas = bus.replicas
        self.stream = bus.stream
        #: Segments refused while reading (path -> why): `missing` says it again without re-reading.
        self._refused: dict[str, SegmentRefused] = {}

    async def _stream_range(self) -> tuple[int, int]:
        """(first, last) position the stream holds; first > last when it holds none."""
        info = await self.bus.js.stream_info(self.bus.stream)
        return int(info.state.first_seq), int(info.state.last_seq)

    async def _segments(self) -> list[Manifest]:
        try:
            return await asyncio.to_thread(self.archive.segments)
        except SegmentRefused as e:  # an unreadable manifest: the whole archive's order is in doubt
            raise LogGap(e.first_seq or 1, (e.last_seq or 0) + 1, str(e)) from None

    async def last_seq(self) -> int:
        segs = await self._segments()
        _, last = await self._stream_range()
        return max(last, segs[-1].last_seq if segs else 0)

    def _holds(self, segs: list[Manifest]) -> str:
        if not segs:
            return f"the archive at {self.archive.path} is empty"
        return f"the archive at {self.archive.path} holds {segs[0].first_seq}..{segs[-1].last_seq}"

    def _plan(self, segs: list[Manifest], start: int, end: int, first: int) -> list[_Piece | LogGap]:
        """Which source reads each position of start..end, in order; a LogGap where neither holds them."""
        out: list[_Piece | LogGap] = []
        p = start
        for m in segs:
            if p > end:
                break
            if m.last_seq < p:
                continue
            if m.first_seq > end:
                break
            if m.first_seq > p:
                out.append(self._outside(segs, p, m.first_seq - 1, first))
            out.append(_Piece(max(p, m.first_seq), min(m.last_seq, end), m))
            p = m.last_seq + 1
        if p <= end:
            out.append(self._outside(segs, p, end, first))
        return out

    def _outside(self, segs: list[Manifest], lo: int, hi: int, first: int) -> _Piece | LogGap:
        """lo..hi, which no segment holds: the stream's if it still holds lo, else a gap up to what it holds."""
        if lo >= first:
            return _Piece(lo, hi, None)
        found = min(hi + 1, first)
        return LogGap(lo, found, f"seq {lo}..{found - 1} are in neither the archive nor the stream ("
                                 f"{self._holds(segs)}; the stream starts at seq {first})")

    def _envelope(self, r: Record) -> Envelope:
        event = read_event(r.subject, r.data)
        if event.__class__ is Unknown:
            self.bus.readers.log_unknown(event, r.seq, r.subject)
        return Envelope(r.seq, r.subject, r.time_ns / 1e9, event)

    async def _read_segment(self, m: Manifest) -> list[Record]:
        try:
            return await asyncio.to_thread(self.archive.read, m)
        except SegmentRefused as e:
            self._refused[m.segment] = e
            raise LogGap(m.first_seq, m.last_seq + 1, str(e)) from None

    async def _start_at(self, since: float, segs: list[Manifest]) -> int | None:
        """The first archived position stored at or after `since`; None if every archived one is older."""
        since_ns = int(since * 1e9) - 1000  # a float's rounding must not skip the event at `since` (events/bus/read.py)
        for m in segs:
            if m.last_time_ns >= since_ns:
                for r in await self._read_segment(m):
                    if r.time_ns >= since_ns:
                        return r.seq
        return None

    async def replay(
        self,
        from_seq: int = 1,
        *,
        since: float | None = None,
        to_seq: int | None = None,
        subjects: list[str] | None = None,
        batch: int = 2000,
    ) -> AsyncGenerator[list[Envelope], None]:
        """`Bus.replay` over archive + stream: positions from `from_seq` (or time `since`) to `to_seq`, in order."""
        if since is not None and from_seq != 1:
            raise ValueError("give from_seq or since, not both")
        segs = await self._segments()
        first, last = await self._stream_range()
        end = max(last, segs[-1].last_seq if segs else 0)
        if to_seq is not None:
            end = min(end, to_seq)
        if since is not None:
            start = await self._start_at(since, segs)
            if start is None:  # everything archived is older: the stream answers by time
                if not segs or segs[-1].last_seq + 1 >= first:
                    async with aclosing(self.bus.replay(since=since, to_seq=to_seq, subjects=subjects,
                                                        batch=batch)) as batches:
                        async for items in batches:
                            yield items
                    return
                start = segs[-1].last_seq + 1  # and the positions after the archive are missing: say so below
            from_seq = start
        wanted = normalize_filters(subjects) if subjects else None
        for piece in self._plan(segs, max(1, from_seq), end, first):
            if isinstance(piece, LogGap):
                raise piece
            if piece.segment is None:
                async with aclosing(self.bus.replay(from_seq=piece.lo, to_seq=piece.hi, subjects=subjects,
                                                    batch=batch)) as batches:
                    async for items in batches:
                        yield items
                continue
            out: list[Envelope] = []
            for r in await self._read_segment(piece.segment):
                if piece.lo <= r.seq <= piece.hi and (wanted is None or matches(wanted, r.subject)):
                    out.append(self._envelope(r))
                    if len(out) >= batch:
                        yield out
                        out = []
            if out:
                yield out

    async def tail(
        self,
        *,
        subjects: list[str] | None = None,
        from_seq: int | None = None,
        since: float | None = None,
        batch: int = 500,
    ) -> AsyncGenerator[Envelope, None]:
        """`Bus.tail`: from `from_seq` or `since` the archive and the stream up to now, then the stream live."""
        if since is not None and from_seq is not None:
            raise ValueError("give from_seq or since, not both")
        if from_seq is None and since is None:
            async with aclosing(self.bus.tail(subjects=subjects, batch=batch)) as live:
                async for env in live:
                    yield env
            return
        end = await self.last_seq()
        async with aclosing(self.replay(**({"since": since} if since is not None else {"from_seq": from_seq or 1}),
                                        to_seq=end, subjects=subjects, batch=batch)) as batches:
            async for items in batches:
                for env in items:
                    yield env
        async with aclosing(self.bus.tail(subjects=subjects, from_seq=end + 1, batch=batch)) as live:
            async for env in live:
                yield env

    async def deleted_in(self, lo: int, hi: int) -> int | None:
        """The stream's: an archived segment is whole, and the stream's holes are its own."""
        return await self.bus.deleted_in(lo, hi)

    async def missing(self, seq: int) -> str | None:
        """Why neither the archive nor the stream holds `seq`; None if one does (or the server cannot say now)."""
        for refused in self._refused.values():
            if refused.first_seq <= seq <= refused.last_seq:
                return str(refused)
        try:
            segs = await self._segments()
        except LogGap as gap:
            return gap.why
        if any(m.first_seq <= seq <= m.last_seq for m in segs):
            return None
        why = await self.bus.missing(seq)
        if why is None:
            return None
        try:
            first, _ = await self._stream_range()
        except (nats.errors.Error, nats.js.errors.Error, TimeoutError):
            return f"{why}; {self._holds(segs)}"
        if seq >= first:  # deleted from the stream's middle
            return f"seq {seq} is in neither the archive nor the stream ({self._holds(segs)}; {why})"
        # Up to what the archive holds next, or the stream's start: the exact range neither holds.
        hi = min([first - 1] + [m.first_seq - 1 for m in segs if m.first_seq > seq])
        return f"{missing_range(seq, hi)} in neither the archive nor the stream ({self._holds(segs)}; the stream " \
               f"starts at seq {first})"
