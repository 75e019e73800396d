"""The cluster state as the CLI sees it: the same fold of the same log as every other reader.

`jobs`, `nodes`, `queues`, `replay` and `top` never ask a service what it
thinks; they fold the log themselves with the shared `evolve`. To stay fast on
a long log they start from the scheduler's newest snapshot at or before the
position asked for (a snapshot *is* a fold of the log up to its `seq`;
events/snapshots.py), then replay the rest. A snapshot that cannot be used (a
newer corral's, a bad checksum, no permission to read it, a tail the stream
no longer holds) is skipped for an older one or the whole log, with one log
line: slower, never wrong (events/restore.py). Where the whole log is needed
and retention moved its head to the archive, `--archive PATH` reads it there;
without it the command exits non-zero naming the positions.

With `--log FILE` the read-only commands fold a log file instead (what
`corral sim` writes, events/logfile.py): forensics on a simulated run, where
"now" is the file's last event.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from orchestrator.cli.connect import connected
from orchestrator.cli.errors import NOT_FOUND, CliError

# The readers, the fold and the snapshots are imported where they are used: a command's parser (and
# `--help`) imports this module for `add_log_arg`, and a question the index answers needs none of them.
if TYPE_CHECKING:
    from events.bus import Bus, Envelope
    from events.history import History
    from events.logfile import LogFile
    from orchestrator.core.model.state import ClusterState

#: What a read-only command reads: the NATS stream (with `--archive`, the archive and the stream), or a log file.
#: Each is an `events.logsource.LogSource`; the union lets a command tell a file from the stream.
LogSource: TypeAlias = "Bus | History | LogFile"


def add_log_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log", metavar="FILE", help="read this log file instead of NATS: a simulation's "
                   "events-<policy>.jsonl, or an export of `corral tail --no-follow --json`; \"now\" is its "
                   "last event")


@asynccontextmanager
async def log_source(args: argparse.Namespace) -> AsyncIterator[LogSource]:
    """The log the command reads: `--log FILE` if given, else the NATS stream (`connected`)."""
    from events.logfile import LogFile
    from orchestrator.cli.archive import with_archive

    path = getattr(args, "log", None)
    if path is None:
        async with connected(args) as bus:
            yield with_archive(args, bus)
        return
    try:
        Path(path).open("rb").close()  # a missing file, a directory: say so now, in one line
    except OSError as e:
        raise CliError(f"cannot read log file {path}: {e.strerror or e}", NOT_FOUND) from None
    yield LogFile(path)


async def log_now(source: LogSource) -> float:
    """The present for ages and `--at 10m`: the server's clock for the stream, the last event's time for a file.

    The server's, not this machine's: the stream's times are the server's, and a laptop's clock may be
    minutes off (#30). Only a server that does not say its time (before NATS 2.10) leaves ours.
    """
    from events.history import History
    from events.logfile import LogFile

    if isinstance(source, LogFile):
        return await source.last_time()
    server = await (source.bus if isinstance(source, History) else source).server_time()
    return server if server is not None else time.time()


async def restored(bus: Bus | History, *, at_most: int) -> ClusterState | None:
    """The newest usable snapshot at or before `at_most` whose tail `bus` still holds (events/restore.py); None:
    fold from the log's start, which `bus` holds. Neither: LogGap naming what is missing (and --archive)."""
    from events.history import History
    from events.restore import restore
    from events.snapshots import SnapshotStore
    from orchestrator.core.model.state import ClusterState

    loaded = await restore(SnapshotStore(bus.js, replicas=bus.replicas), ClusterState, bus, at_most=at_most,
                           archive=isinstance(bus, History))
    return None if loaded is None else loaded.state


async def load_state(bus: LogSource, *, to_seq: int | None = None, use_snapshot: bool = True) -> ClusterState:
    """The state folded up to `to_seq` (default: the end of the log now)."""
    from events.follow import Follower, fold_batch
    from events.logfile import LogFile
    from orchestrator.core.evolve import evolve
    from orchestrator.core.model.state import ClusterState

    end = await bus.last_seq()
    target = end if to_seq is None else max(0, min(to_seq, end))
    if isinstance(bus, LogFile):  # no snapshots beside a file
        state = ClusterState()
        async for batch in bus.replay(to_seq=target):
            state = fold_batch(state, batch, evolve, contiguous=False)  # an export may be filtered: fold what it holds
        return state
    start = await restored(bus, at_most=target) if use_snapshot else None
    follower = Follower(bus, evolve, start if start is not None else ClusterState())
    await follower.catch_up(to_seq=target)
    return follower.state


async def seq_at_time(bus: LogSource, at: float) -> int:
    """The last sequence the log stored at or before `at` (epoch seconds); 0 if none."""
    async with aclosing(bus.replay(since=at, batch=64)) as batches:
        async for batch in batches:
            for env in batch:
                if env.stream_time > at:
                    return env.seq - 1
    return await bus.last_seq()


async def envelope_at(bus: LogSource, seq: int) -> Envelope | None:
    """The event stored at `seq` (None if there is none)."""
    if seq < 1:
        return None
    async with aclosing(bus.replay(from_seq=seq, to_seq=seq, batch=1)) as batches:
        async for batch in batches:
            for env in batch:
                if env.seq == seq:
                    return env
    return None
