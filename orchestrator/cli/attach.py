"""Staying attached to a job: every rank's output as it is written, labelled like `srun --label`.

`corral run`, `submit --wait --follow` and `logs --all-ranks` read the ranks'
output the way `corral logs` does (orchestrator/cli/logs.py: `ask`, over
`corral-logs.<node>` to each rank's agent), one offset per rank, and print
whole lines as `R: text` so the ranks' lines never mix within a line. The
job's own events (history first, then live: `Client.watch`) say where its
ranks are (GangReserved of each attempt), and when it is over; after its final
event every rank is read to its end once more, so nothing written before the
end is missed.
"""

from __future__ import annotations

import asyncio
import sys
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import BinaryIO

from events.bus import Bus, Envelope
from events.sdk import FINAL, Client
from orchestrator.cli.errors import CliError
from orchestrator.cli.logs import FOLLOW_POLL_S, ask
from orchestrator.cli.render import line
from schemas import (
    GangReserved,
    GangRestarted,
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobRejected,
    JobRequeued,
    Preempted,
    PreemptionRequested,
    WorkerExited,
    tag_of,
)
from schemas.events import RankPlacement
from schemas.logs import LOG_CHUNK, LogRequest

#: After the job's final event, how many times a rank whose agent does not answer is asked again.
DRAIN_TRIES = 3


@dataclass
class RankOutput:
    """How far one rank's log was printed: its node, the worker generation read, the offset, an unfinished line."""

    node: str
    job_id: str
    attempt: int
    rank: int
    restarts: int = -1
    offset: int = 0
    partial: bytes = b""
    #: The worker ended and everything it wrote was read.
    done: bool = False
    #: Why it could not be read (said once).
    problem: str = ""


@dataclass
class JobStream:
    """The output of the ranks added so far, printed to `out` as whole lines with `R: ` in front."""

    bus: Bus
    out: BinaryIO = field(default_factory=lambda: sys.stdout.buffer)
    label: bool = True
    err: BinaryIO = field(default_factory=lambda: sys.stderr.buffer)
    ranks: dict[tuple[int, int], RankOutput] = field(default_factory=dict)
    #: (attempt, rank) whose WorkerExited (not to be restarted in place) is in the log.
    exited: set[tuple[int, int]] = field(default_factory=set)
    #: Only this rank (`corral logs --rank R -f`); None: every rank.
    only: int | None = None
    #: Print bytes as they come, not whole lines (`corral run --pty`: a prompt has no newline).
    raw: bool = False

    def place(self, job_id: str, attempt: int, placements: tuple[RankPlacement, ...]) -> None:
        for p in placements:
            if self.only is None or p.rank == self.only:
                self.ranks.setdefault((attempt, p.rank), RankOutput(p.node_id, job_id, attempt, p.rank))

    def all_done(self) -> bool:
        return bool(self.ranks) and all(ro.done for ro in self.ranks.values())

    async def poll(self) -> None:
        """Print what every rank not done wrote since the last poll."""
        for ro in list(self.ranks.values()):
            if not ro.done:
                await self.read(ro)

    async def drain(self) -> None:
        """The job is over: read every rank to its end, then end each unfinished line."""
        for ro in self.ranks.values():
            for _ in range(DRAIN_TRIES):
                if ro.done or not await self.read(ro, final=True):
                    break
                await asyncio.sleep(FOLLOW_POLL_S)
            self._end_line(ro)
        self.out.flush()

    def _end_line(self, ro: RankOutput) -> None:
        """Print a last line its worker did not end with a newline."""
        if ro.partial:
            self._write(ro, ro.partial + b"\n")
            ro.partial = b""

    async def read(self, ro: RankOutput, *, final: bool = False) -> bool:
        """Read and print what is there now; whether to ask again later (a rank not started, an agent silent)."""
        while True:
            req = LogRequest(job_id=ro.job_id, attempt=ro.attempt, rank=ro.rank, restarts=ro.restarts,
                             offset=ro.offset, limit=LOG_CHUNK)
            try:
                chunk = await ask(self.bus, ro.node, req)
            except CliError as e:  # no agent answers (yet, or any more): try again later
                self._problem(ro, str(e), final)
                return True
            if chunk.error:
                if "not started yet" in chunk.error:  # (after the end: it never started, see the job's story)
                    return not final
                self._problem(ro, chunk.error, final)
                return not final
            if ro.restarts < 0:
                ro.restarts = chunk.restarts
            self._lines(ro, chunk.data)
            ro.offset = chunk.next
            if chunk.data and chunk.next < chunk.size:
                continue  # more than one chunk behind
            if chunk.running:
                return False
            # Not running: a rank restarted in place (restart policy rank) goes on in a newer generation.
            newest = await ask(self.bus, ro.node, LogRequest(job_id=ro.job_id, attempt=ro.attempt, rank=ro.rank,
                                                             restarts=-1, offset=0, limit=0))
            if not newest.error and newest.restarts > ro.restarts:
                self._end_line(ro)
                ro.restarts, ro.offset = newest.restarts, 0
                continue
            # Done once the log says it exited for good (or the job is over): "not running" alone may be
            # a worker whose start the agent has not finished tracking.
            if final or (ro.attempt, ro.rank) in self.exited:
                ro.done = True
            return False

    def _lines(self, ro: RankOutput, data: bytes) -> None:
        if not data:
            return
        if self.raw:
            self.out.write(data)
            self.out.flush()
            return
        text = ro.partial + data
        cut = text.rfind(b"\n") + 1
        ro.partial = text[cut:]
        if cut:
            self._write(ro, text[:cut])
        self.out.flush()

    def _write(self, ro: RankOutput, lines: bytes) -> None:
        if not self.label:
            self.out.write(lines)
            return
        prefix = f"{ro.rank}: ".encode()
        self.out.write(b"".join(prefix + ln for ln in lines.splitlines(keepends=True)))

    def _problem(self, ro: RankOutput, why: str, final: bool) -> None:
        if final and why != ro.problem:
            self.err.write(f"corral: rank {ro.rank} of attempt {ro.attempt}: {why}\n".encode())
            self.err.flush()
        ro.problem = why


@dataclass
class Watched:
    """What the job's events said so far."""

    final: Envelope | None = None
    attempt: int = 0
    #: WorkerExited of each attempt, in log order.
    exits: dict[int, list[WorkerExited]] = field(default_factory=dict)


async def follow_job(bus: Bus, job_id: str, stream: JobStream, *, attempt: int | None = None,
                     stop: asyncio.Event | None = None, poll_s: float = FOLLOW_POLL_S) -> Watched:
    """Print the job's output (all attempts, or only `attempt`) until it is over; what its events said.

    Over means its final event (or, with `attempt`, a newer attempt placed or every rank followed ended).
    `stop` set ends the wait
    early (a second Ctrl-C): the output is then read to where it is. `poll_s`: how often the ranks' output
    is asked for (a terminal's echo, `--pty`, wants it often).
    """
    seen = Watched()
    changed = asyncio.Event()
    stop = stop if stop is not None else asyncio.Event()

    placed: tuple[RankPlacement, ...] = ()

    async def watch() -> None:
        nonlocal placed
        async with aclosing(Client(bus).watch(job_id)) as events:
            async for env in events:
                ev = env.event
                # A gang restart is a new attempt on the same GPUs: no GangReserved of its own.
                if isinstance(ev, (GangReserved, GangRestarted)):
                    placed = ev.ranks if isinstance(ev, GangReserved) else placed
                    if attempt is None or ev.attempt == attempt:
                        stream.place(job_id, ev.attempt, placed)
                        seen.attempt = max(seen.attempt, ev.attempt)
                    elif ev.attempt > attempt:
                        seen.final = env
                if attempt is None and isinstance(ev, (PreemptionRequested, Preempted, GangRestarted, JobRequeued)):
                    # Why the output stops and starts again (the next attempt's lines follow, same labels).
                    stream.err.write(f"corral: {line(env)}\n".encode())
                    stream.err.flush()
                if isinstance(ev, WorkerExited):
                    seen.exits.setdefault(ev.attempt, []).append(ev)
                    if not ev.will_restart:
                        stream.exited.add((ev.attempt, ev.rank))
                if tag_of(ev) in FINAL:
                    seen.final = env
                changed.set()
                if seen.final is not None:
                    return

    watcher = asyncio.create_task(watch())
    stopping = asyncio.create_task(stop.wait())
    try:
        while seen.final is None and not watcher.done() and not stop.is_set():
            if attempt is not None and stream.all_done():
                break  # every rank of the attempt followed ended (the job may go on: another attempt)
            await stream.poll()
            changed.clear()
            woken = asyncio.create_task(changed.wait())
            try:
                await asyncio.wait([woken, watcher, stopping], timeout=poll_s,
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                woken.cancel()
                await asyncio.gather(woken, return_exceptions=True)
        if watcher.done() and not watcher.cancelled() and (error := watcher.exception()) is not None:
            raise error
    finally:
        for task in (watcher, stopping):
            task.cancel()
        await asyncio.gather(watcher, stopping, return_exceptions=True)
    await stream.drain()
    return seen


def exit_status(seen: Watched) -> int:
    """The job's exit status, as a shell gives a command's: 0 completed; the failing rank's exit code (128 +
    signal for a signal); 1 for a failure with no rank's code (a rank that could not start, a rejection)."""
    env = seen.final
    if env is None:
        return 1
    ev = env.event
    if isinstance(ev, JobCompleted):
        return 0
    if isinstance(ev, JobFailed):
        for x in seen.exits.get(ev.attempt, []):
            if x.reason in ("crashed", "killed") and not x.will_restart:
                if x.exit_code not in (None, 0):
                    return int(x.exit_code) & 0xFF or 1
                if x.signal is not None:
                    return 128 + int(x.signal)
        return 1
    if isinstance(ev, (JobCancelled, JobRejected)):
        return 1
    return 1
