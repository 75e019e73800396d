"""Where a reader of the cluster state starts: the newest snapshot it can use whose tail the log still holds.

Every reader of the scheduler's state (the scheduler, the CLI's folds) starts
from a snapshot (events/snapshots.py) and folds the log after it. A snapshot
is usable only if both hold: its file passes its checks (format, length,
sha256: a truncated write, a flipped byte or a deleted object is skipped
with one log line naming it and why), and the log still holds the position
after it. The archiver purges the stream only behind the oldest kept
snapshot (orchestrator/archiver.py), so when the newest one is damaged the
next older one still has its tail in the stream.

`restore` walks the snapshots newest first and takes the first usable one;
when none is, it folds from the log's start -- the archive and the stream as
one log when the reader was given `--archive PATH` (events/history.py), else
the stream, which must still start at 1. Where neither holds what is needed,
it raises LogGap naming the positions, every snapshot it skipped and why, and
the flag that mends it: never a state folded over a hole.
"""

from __future__ import annotations

from typing import TypeVar

import structlog

from events.bus import LogGap
from events.logsource import LogSource
from events.snapshots import Loaded, SnapshotStore

log = structlog.get_logger("corral.restore")

S = TypeVar("S")

#: Snapshots tried before folding from the log's start (the store keeps KEEP; a stray extra is harmless).
_TRIES = 16

ARCHIVE_FIX = "give --archive PATH (or set CORRAL_ARCHIVE) to read what retention moved to the archive"


class RestoreImpossible(LogGap):
    """No snapshot is usable and the log does not start at 1: `why` names the positions and the snapshots."""

    def __init__(self, missing: str, snapshots: str) -> None:
        super().__init__(1, 1, f"{missing}; {snapshots}")
        self.args = (f"cannot restore the cluster state: {self.why}",)


async def restore(store: SnapshotStore, state_type: type[S], source: LogSource, *,
                  at_most: int | None = None, archive: bool = False) -> Loaded[S] | None:
    """The newest snapshot at or before `at_most` whose checks pass and whose tail `source` holds; None: fold
    `source` from position 1, which it holds. Raises LogGap naming what is missing when neither works.

    `archive`: `source` already reads the archive too (said in the error, which otherwise names --archive).
    """
    skipped: list[str] = []
    limit = at_most
    for _ in range(_TRIES):
        loaded = await store.load_with_header(state_type, at_most=limit)
        if loaded is None:
            break
        seq = loaded.header.seq
        why = await source.missing(seq + 1)
        if why is None:
            if skipped:
                log.warning("restored_from_older_snapshot", seq=seq, skipped="; ".join(skipped))
            return loaded
        reason = f"its tail is gone: {why}"
        log.warning("snapshot_skipped", seq=seq, reason=reason, fallback="an older snapshot or the log")
        skipped.append(f"the snapshot at seq {seq} ({reason})")
        if seq <= 1:
            break
        limit = seq - 1
    why = await source.missing(1)
    if why is None:
        return None
    unusable = "; ".join(skipped) if skipped else "no usable snapshot (each one skipped is named in the log above)"
    log.error("restore_impossible", why=why, snapshots=unusable, **({} if archive else {"fix": ARCHIVE_FIX}))
    # (The CLI adds the --archive hint to a LogGap whose positions are "not in the stream".)
    raise RestoreImpossible(why, unusable)
