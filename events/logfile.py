"""A log file read like the log, for the read-only commands' `--log FILE` and `corral sim --from-log`.

Two kinds of line, in log order:

* an event, `schemas.encode(event)` -- what `corral sim` writes
  (events-<policy>.jsonl). A file has no server, so its position is the line
  number (blank lines skipped) and its stream time the event's own
  `occurred_at` (a simulation's virtual clock);
* a record of `corral tail --json` (`{"seq", "subject", "time", "type",
  "event"}`) -- a real cluster's log exported with `corral tail --no-follow
  --json > FILE`, which keeps the stream's positions and times.

`LogFile` is a `LogSource` (events/logsource.py) as the stream is -- `last_seq`,
`replay` in batches of `Envelope`s, `tail`, `missing` -- so `corral replay`,
`explain`, `jobs` and the rest fold a file with the same code as the NATS
stream: what-if forensics on a simulated run, or on a cluster's log away from
the cluster.
An undecodable line comes back as `Unknown`, as from the stream, on the
subject `corral.unknown` at the time of the event before it.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterator
from contextlib import aclosing
from pathlib import Path

import msgspec

from events.authorship import judged, read_event
from events.envelope import Envelope
from events.subjects import ROOT, matches, normalize_filters, subject_for
from schemas.codec import decode
from schemas.events import AnyEvent, Unknown

#: How a `corral tail --json` record starts (orchestrator/cli/tail.json_line writes "seq" first).
_TAIL_RECORD = b'{"seq":'


class _TailRecord(msgspec.Struct):
    seq: int
    subject: str
    time: float
    event: msgspec.Raw


_tail_record = msgspec.json.Decoder(_TailRecord)


def read_events(path: str | Path) -> Iterator[AnyEvent | Unknown]:
    """Every event of a log file in order (undecodable lines come back as Unknown, as for any reader)."""
    return (env.event for env in LogFile(path).envelopes())


def _parse(line: int, raw: bytes, before: float) -> Envelope:
    """The non-blank line number `line`: a tail record, else an event line (`before`: the time before it)."""
    env = _tail_line(raw) if raw.lstrip().startswith(_TAIL_RECORD) else None
    return env if env is not None else _event_line(line, raw, before)


def _tail_line(raw: bytes) -> Envelope | None:
    """A `corral tail --json` record as the stream delivered it; None if the line is not one."""
    try:
        rec = _tail_record.decode(raw)
    except msgspec.DecodeError:
        return None
    return Envelope(seq=rec.seq, subject=rec.subject, stream_time=rec.time,
                    event=read_event(rec.subject, bytes(rec.event)))


def _event_line(seq: int, raw: bytes, before: float) -> Envelope:
    """An event line at position `seq`: its own time, the subject it would be published on."""
    event = decode(raw)
    if isinstance(event, Unknown):
        return Envelope(seq=seq, subject=f"{ROOT}.unknown", stream_time=before, event=event)
    try:
        subject = subject_for(event)
    except ValueError:  # an id no publisher could have used: not matchable, and refused like any event off its subject
        subject = f"{ROOT}.unknown"
    return Envelope(seq=seq, subject=subject, stream_time=event.occurred_at, event=judged(subject, event, raw))


class LogFile:
    """A log file read as the log (events/logsource.py `LogSource`): its lines are its positions, unless it is
    an export that names them."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._end: tuple[int, float] | None = None

    def envelopes(self) -> Iterator[Envelope]:
        """Every line as the stream would deliver it, in order."""
        t = 0.0  # an Unknown line gets the time of the event before it
        line = 0
        with self.path.open("rb") as f:
            for raw in f:
                if not raw.strip():
                    continue
                line += 1
                env = _parse(line, raw, t)
                t = env.stream_time
                yield env

    def _scan(self) -> tuple[int, float]:
        """(last position, its time): lines are counted, only the last one decoded -- a command folds the
        file once more anyway. An undecodable last line takes its time from the lines before: read them all."""
        if self._end is None:
            line, last = 0, b""
            with self.path.open("rb") as f:
                for raw in f:
                    if raw.strip():
                        line, last = line + 1, raw
            env = _parse(line, last, 0.0) if line else None
            if env is not None and isinstance(env.event, Unknown):
                *_, env = self.envelopes()
            self._end = (env.seq, env.stream_time) if env is not None else (0, 0.0)
        return self._end

    async def last_seq(self) -> int:
        return self._scan()[0]

    async def last_time(self) -> float:
        """The newest event's time: "now" for a file (`--at 2h` is two hours before its end)."""
        return self._scan()[1]

    async def replay(
        self,
        from_seq: int = 1,
        *,
        since: float | None = None,
        to_seq: int | None = None,
        subjects: list[str] | None = None,
        batch: int = 2000,
    ) -> AsyncGenerator[list[Envelope], None]:
        """`Bus.replay` over the file: from `from_seq` (or the first event at or after `since`) to `to_seq`."""
        if since is not None and from_seq != 1:
            raise ValueError("give from_seq or since, not both")
        wanted = normalize_filters(subjects) if subjects else None
        out: list[Envelope] = []
        for env in self.envelopes():
            if to_seq is not None and env.seq > to_seq:
                break
            if env.seq < from_seq or (since is not None and env.stream_time < since):
                continue
            if wanted and not matches(wanted, env.subject):
                continue
            out.append(env)
            if len(out) >= batch:
                yield out
                out = []
        if out:
            yield out

    async def tail(self, *, subjects: list[str] | None = None, from_seq: int | None = None,
                   since: float | None = None, batch: int = 500) -> AsyncGenerator[Envelope, None]:
        """`Bus.tail` over the file, which does not grow: from now (the default) nothing; from `from_seq` or
        `since`, its events up to its last line. Then it ends."""
        if since is not None and from_seq is not None:
            raise ValueError("give from_seq or since, not both")
        if from_seq is None and since is None:
            return
        async with aclosing(self.replay(from_seq or 1, since=since, subjects=subjects, batch=batch)) as batches:
            async for items in batches:
                for env in items:
                    yield env

    async def deleted_in(self, lo: int, hi: int) -> int | None:
        """None: an export may be filtered, so its holes are no gaps."""
        return None

    async def missing(self, seq: int) -> str | None:
        """Why the file holds no event at `seq`; None if it holds one (an export may be filtered or start anywhere)."""
        last = await self.last_seq()
        for env in self.envelopes():
            if env.seq == seq:
                return None
            if env.seq > seq:
                break
        return f"seq {seq} is not in the log file {self.path} (its last position is {last})"
