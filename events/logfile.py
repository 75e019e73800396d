"""A log file read like the log: what `corral sim` writes, for the read-only commands' `--log FILE`.

The file holds one `schemas.encode(event)` JSON object per line, in log order
(events-<policy>.jsonl of a simulation). `LogFile` answers the part of `Bus`
that readers use -- `last_seq` and `replay` in batches of `Envelope`s -- so
`corral replay`, `explain`, `jobs` and the rest fold it with the same code
as the NATS stream: what-if forensics on a simulated run.

A file has no server, so a position is a line number (blank lines skipped)
and an event's stream time is its own `occurred_at` (a simulation's virtual
clock); an undecodable line comes back as `Unknown`, as from the stream, on
the subject `corral.unknown` at the time of the event before it.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterator
from pathlib import Path

from events.bus import Envelope
from events.subjects import ROOT, matches, normalize_filters, subject_for
from schemas.codec import decode
from schemas.events import AnyEvent, Unknown


def read_events(path: str | Path) -> Iterator[AnyEvent | Unknown]:
    """Every event of a log file in order (undecodable lines come back as Unknown, as for any reader)."""
    with Path(path).open("rb") as f:
        for raw in f:
            if raw.strip():
                yield decode(raw)


class LogFile:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._end: tuple[int, float] | None = None

    def _envelopes(self) -> Iterator[Envelope]:
        t = 0.0
        for seq, event in enumerate(read_events(self.path), 1):
            if isinstance(event, Unknown):
                subject = f"{ROOT}.unknown"
            else:
                t = event.occurred_at
                try:
                    subject = subject_for(event)
                except ValueError:  # an id no publisher could have used: readable, not matchable
                    subject = f"{ROOT}.unknown"
            yield Envelope(seq=seq, subject=subject, stream_time=t, event=event)

    def _scan(self) -> tuple[int, float]:
        if self._end is None:
            seq, t = 0, 0.0
            for env in self._envelopes():
                seq, t = env.seq, env.stream_time
            self._end = (seq, t)
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
        for env in self._envelopes():
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
