"""The archiver (`corral archive`): the stream's events into archive segments, and retention that loses nothing.

It follows the stream from the position after the archive's last whole
segment (events/archive.py), so a restart after a crash at any point
resumes with no gap and no duplicate: what it had read but not yet written
is read again. A segment is closed every `segment_events` events or
`segment_seconds` after its first event, whichever comes first.

Retention (`--retention 30d`, `--max-bytes 20GB`): the stream drops only
what the archive holds. The archiver purges the stream below K
(`purge_point`), where K is the smallest of

* the retention cut: whole archived segments older than the retention (on
  the stream's own clock: measured back from the newest event's stream
  time, never from this machine's clock) or needed to bring the stream under
  `max_bytes`;
* the archive's end + 1: age or size alone never drop an unarchived event;
* the OLDEST kept scheduler snapshot's position + 1 (`RestartPoints`): a
  reader whose newest snapshot is damaged (a flipped byte, a truncated
  write, a deleted object: events/snapshots.py names it and skips it) falls
  back to the next older one, and the stream still holds that one's tail
  (events/restore.py);
* the agents' node views' `_base` position + 1 (events/nodeviews.py): an
  agent starts from its node's view and reads its slice of the stream
  after it.

Only when every snapshot (or a node's view) is unusable does a reader need
what was purged: given `--archive PATH` (or CORRAL_ARCHIVE) the scheduler,
an agent, the index and the CLI read it from the archive and the stream as
one log (events/history.py); without one they stop naming the positions
missing and the flag.

A failed segment write (a full disk: ENOSPC, or any OSError) stops
retention at once -- nothing more is purged while the archive cannot be
written -- logs it, and sets `corral_archive_write_failing` (alert
CorralArchiveWriteFailing); the archiver retries, and resumes retention once
a write succeeds again.

The NATS user: `archiver` (deploy/nats/permissions.py): reads, and purges the
CORRAL stream; nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path

import nats.errors
import nats.js.errors
import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from events.archive import Archive, ArchiveError, Manifest, Record, stored_records
from events.bus import Bus, BusError
from events.nodeviews import NodeViewStore
from events.snapshots import SnapshotStore
from events.swallowed_cancel import stop_if_cancelled

log = structlog.get_logger("corral.archiver")

# Created without a registry: each exposed registry registers them (tests build several in one process).
WRITE_FAILING = Gauge("corral_archive_write_failing", "1 while the archive cannot be written (a full disk, a lost "
                      "mount): retention is stopped, the stream keeps everything", registry=None)
WRITE_ERRORS = Counter("corral_archive_write_errors", "Archive segment writes that failed", registry=None)
ARCHIVED_SEQ = Gauge("corral_archive_last_seq", "Last log position the archive holds", registry=None)
SEGMENTS = Counter("corral_archive_segments", "Archive segments this process wrote", registry=None)
PURGED = Counter("corral_stream_purged_events", "Events this process purged from the stream (all archived "
                 "before)", registry=None)
ARCHIVER_METRICS = (WRITE_FAILING, WRITE_ERRORS, ARCHIVED_SEQ, SEGMENTS, PURGED)


def watch_archiver(registry: CollectorRegistry) -> None:
    """Register the archiver's metrics in `registry` (a process's ServiceRegistry)."""
    for metric in ARCHIVER_METRICS:
        registry.register(metric)


class ArchiveGap(BusError):
    """The stream no longer holds positions the archive lacks: archiving on would leave a gap forever."""


@dataclass(frozen=True)
class ArchiverConfig:
    path: Path
    segment_events: int = 10_000
    segment_seconds: float = 60.0
    #: Keep this many seconds of the log in the stream (None: no age limit).
    retention_s: float | None = None
    #: Keep the stream under this many bytes (None: no size limit).
    max_bytes: int | None = None
    purge_every_s: float = 10.0
    retry_s: float = 5.0


@dataclass(frozen=True)
class StreamFacts:
    """What the stream held when asked: positions, messages, bytes; and the newest event's stream time."""

    first: int
    last: int
    messages: int
    bytes: int
    newest_time_ns: int


def purge_point(segments: Sequence[Manifest], stream: StreamFacts, *, retention_s: float | None,
                max_bytes: int | None, snapshot_seq: int) -> int:
    """K: the stream may drop the positions below K (and keep K and above). K <= stream.first: drop nothing.

    Whole archived segments only. The wanted cut (age, size) is capped by the archive's end + 1 and
    `snapshot_seq` + 1, the oldest position a reader restarts from (`RestartPoints`: the oldest kept
    snapshot, the node views' base; module docstring): an event is purged only if archived, and only if
    no reader starting from a kept snapshot or view needs it.
    """
    if not segments:
        return stream.first
    want = stream.first
    if retention_s is not None:
        oldest_kept = stream.newest_time_ns - int(retention_s * 1e9)
        for m in segments:
            if m.last_time_ns >= oldest_kept:
                break
            want = max(want, m.last_seq + 1)
    if max_bytes is not None and stream.bytes > max_bytes and stream.messages > 0:
        per_message = stream.bytes / stream.messages
        excess = float(stream.bytes - max_bytes)
        for m in segments:
            if m.last_seq < stream.first:
                continue
            if excess <= 0:
                break
            excess -= (m.last_seq - max(m.first_seq, stream.first) + 1) * per_message
            want = max(want, m.last_seq + 1)
    return min(want, segments[-1].last_seq + 1, snapshot_seq + 1)


class RestartPoints:
    """The oldest position a reader restarts from (0: keep everything): the oldest kept scheduler snapshot's,
    capped by the node views' `_base` (events/nodeviews.py), so a damaged newest snapshot falls back to an
    older one whose tail the stream still holds.

    Read from the stored names and the `_base` record's prefix, not the snapshots themselves. No
    snapshot, or a store that cannot be read now: 0. No node views (no scheduler wrote them yet, or the
    bucket was deleted: the next snapshot writes them again): the snapshots alone decide.
    """

    def __init__(self, js: object) -> None:
        self._store = SnapshotStore(js)  # type: ignore[arg-type]
        self._views = NodeViewStore(js)  # type: ignore[arg-type]

    async def __call__(self) -> int:
        try:
            seqs = await self._store.seqs()
            if not seqs:
                return 0  # without a snapshot readers start at 1: keep everything
            base = await self._views.base_seq()
        except Exception as e:  # unreadable: keep everything rather than guess
            log.warning("restart_points_unreadable", error=repr(e))
            return 0
        oldest = seqs[-1]
        return oldest if base is None else min(oldest, base)


class Archiver:
    def __init__(self, bus: Bus, config: ArchiverConfig,
                 snapshot_seq: Callable[[], Awaitable[int]] | None = None) -> None:
        self.bus = bus
        self.config = config
        self.archive = Archive(config.path)
        self.snapshot_seq = snapshot_seq or RestartPoints(bus.js)
        self.segments: list[Manifest] = []
        self.pending: list[Record] = []
        #: Why the archive cannot be written now (None: it can): retention waits while set.
        self.failing: str | None = None
        self.newest_time_ns = 0
        self._pending_since = 0.0
        self.purged_to = 0

    @property
    def archived(self) -> int:
        return self.segments[-1].last_seq if self.segments else 0

    async def _stream_facts(self) -> StreamFacts:
        info = await self.bus.js.stream_info(self.bus.stream)
        s = info.state
        return StreamFacts(int(s.first_seq), int(s.last_seq), int(s.messages), int(s.bytes), self.newest_time_ns)

    async def run(self) -> None:
        removed = await asyncio.to_thread(self.archive.clean)
        if removed:
            log.info("archive_leftovers_removed", files=[p.name for p in removed])
        self.segments = await asyncio.to_thread(self.archive.segments)
        if self.segments:
            self.newest_time_ns = self.segments[-1].last_time_ns
        ARCHIVED_SEQ.set(self.archived)
        facts = await self._stream_facts()
        if facts.first > self.archived + 1 and facts.last >= facts.first:
            raise ArchiveGap(f"the stream starts at seq {facts.first} and the archive at {self.archive.path} ends "
                             f"at {self.archived}: seq {self.archived + 1}..{facts.first - 1} are in neither; "
                             "point --path at the archive that holds them")
        log.info("archiver_started", path=str(self.archive.path), archived=self.archived, stream_first=facts.first,
                 stream_last=facts.last)
        stop_if_cancelled()  # a SIGTERM one of the start-up's nats waits swallowed: the loops below never saw it
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._archive_loop())
            if self.config.retention_s is not None or self.config.max_bytes is not None:
                tg.create_task(self._purge_loop())

    # -- archiving ------------------------------------------------------------------------------

    async def _archive_loop(self) -> None:
        while True:
            stop_if_cancelled()
            queue: asyncio.Queue[list[Record]] = asyncio.Queue(maxsize=4)
            pump = asyncio.create_task(self._pump(self.archived + len(self.pending) + 1, queue))
            try:
                await self._take(queue, pump)
            except _Reread as e:
                log.warning("archive_reread", expected=e.expected, found=e.found)
            finally:
                pump.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pump

    async def _pump(self, from_seq: int, queue: asyncio.Queue[list[Record]]) -> None:
        async with aclosing(stored_records(self.bus, from_seq)) as batches:
            async for batch in batches:
                await queue.put(batch)

    async def _take(self, queue: asyncio.Queue[list[Record]], pump: asyncio.Task[None]) -> None:
        """Records into `pending`, in order and once; segments out when full or old enough."""
        cfg = self.config
        while True:
            timeout = None
            if self.pending:
                timeout = max(0.0, self._pending_since + cfg.segment_seconds - time.monotonic())
            batch: list[Record] = []
            if not (self.pending and len(self.pending) >= cfg.segment_events):
                getter = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait({getter, pump}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    batch = getter.result()
                else:
                    getter.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await getter
                if pump in done:
                    pump.result()  # its error, if it failed
                    raise _Reread(self.archived + len(self.pending) + 1, 0)
            for r in batch:
                expected = (self.pending[-1].seq if self.pending else self.archived) + 1
                if r.seq < expected:
                    continue  # read again after a reset: already taken
                if r.seq > expected:
                    await self._jump(expected, r.seq)
                if not self.pending:
                    self._pending_since = time.monotonic()
                self.pending.append(r)
                self.newest_time_ns = max(self.newest_time_ns, r.time_ns)
            while self.pending and (len(self.pending) >= cfg.segment_events
                                    or time.monotonic() >= self._pending_since + cfg.segment_seconds):
                await self._flush(self.pending[:cfg.segment_events])

    async def _jump(self, expected: int, found: int) -> None:
        """The read went from `expected - 1` to `found`: deleted messages (kept as a hole, as in the stream),
        else a lost read (read again) or positions purged before they were archived (stop, naming them)."""
        why = await self.bus.missing(expected)
        if why is None:
            raise _Reread(expected, found)
        if "deleted" in why:
            log.warning("archive_hole", seqs=f"{expected}..{found - 1}", why=why)
            return
        raise ArchiveGap(f"seq {expected}..{found - 1} left the stream before they were archived: {why}")

    async def _flush(self, records: list[Record]) -> None:
        """Write one segment; on failure, stop retention, say so, and try again every retry_s until it works."""
        while True:
            try:
                manifest = await asyncio.to_thread(self.archive.append, records, after=self.archived)
            except OSError as e:
                WRITE_ERRORS.inc()
                why = f"{e.strerror or e} ({type(e).__name__}, errno {e.errno})"
                if self.failing != why:
                    log.error("archive_write_failed", path=str(self.archive.path), error=why,
                              msg="retention stopped: the stream keeps everything until the archive can be written")
                self.failing = why
                WRITE_FAILING.set(1)
                await asyncio.sleep(self.config.retry_s)
                continue
            except ArchiveError as e:
                raise ArchiveGap(f"archive at {self.archive.path}: {e}") from None
            break
        if self.failing is not None:
            log.info("archive_write_recovered", path=str(self.archive.path))
        self.failing = None
        WRITE_FAILING.set(0)
        self.segments.append(manifest)
        del self.pending[:len(records)]
        self._pending_since = time.monotonic()
        SEGMENTS.inc()
        ARCHIVED_SEQ.set(self.archived)
        log.info("segment_written", segment=manifest.segment, events=manifest.count, bytes=manifest.bytes)

    # -- retention ------------------------------------------------------------------------------

    async def purge_once(self) -> int:
        """Purge what retention allows now; the number of positions dropped (0 while the archive fails)."""
        if self.failing is not None:
            log.warning("retention_stopped", why=self.failing)
            return 0
        facts = await self._stream_facts()
        k = purge_point(self.segments, facts, retention_s=self.config.retention_s, max_bytes=self.config.max_bytes,
                        snapshot_seq=await self.snapshot_seq())
        if self.failing is not None or k <= facts.first:  # (a write may have failed while we asked)
            return 0
        await self.bus.js.purge_stream(self.bus.stream, seq=k)
        PURGED.inc(k - facts.first)
        self.purged_to = k
        log.info("stream_purged", below=k, dropped=k - facts.first, archived=self.archived)
        return k - facts.first

    async def _purge_loop(self) -> None:
        while True:
            stop_if_cancelled()
            await asyncio.sleep(self.config.purge_every_s)
            try:
                await self.purge_once()
            except (BusError, nats.errors.Error, TimeoutError) as e:
                log.warning("purge_failed", error=repr(e))


class _Reread(Exception):
    def __init__(self, expected: int, found: int) -> None:
        super().__init__(f"read again from {expected} (got {found})")
        self.expected = expected
        self.found = found
