"""Checkpoint manifests: how a worker tells the agent "step N is saved at PATH".

A worker writes its state, then `manifest-rank<R>.json` = {"step", "path",
"rank", "attempt"} via tmp + rename, so a reader sees the previous manifest or
the new one, never half of one (examples/worker.py does exactly that). The
agent watches the directory and appends `Checkpointed(step, path)`; the newest
manifest's path is what a preempted job later gets as CORRAL_RESUME_FROM.
The manifest, not the state file, is the commit point: a state file without
a manifest is an interrupted write and is ignored.

A checkpoint asked for by preemption may fail (a full disk, a worker that
exits non-zero while saving, or the grace running out): `checkpoint_failure`
says why for the WorkerExited report, and counts the steps lost when the
worker said how far it got, by a `CORRAL_STEP=N` line in its output.

A checkpoint belongs to one attempt (DESIGN.md, "Safety by construction"): a
worker of an earlier attempt may outlive its agent and keep writing. So each
attempt gets its own directory (`checkpoint_dir`), and a manifest that names
its attempt (CORRAL_ATTEMPT) is reported only for that attempt.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import msgspec

MANIFEST_GLOB = "manifest*.json"
#: The line a worker prints to say how far it got (the last one in its output tail counts).
PROGRESS = re.compile(r"^CORRAL_STEP=(\d+)\s*$", re.M)


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    step: int
    path: str
    rank: int = 0
    #: The attempt that wrote it (CORRAL_ATTEMPT); 0: not said (a worker older than this field).
    attempt: int = 0

    def belongs_to(self, attempt: int) -> bool:
        """Whether this may be reported as `attempt`'s checkpoint (unsaid: its directory decides)."""
        return self.attempt in (0, attempt)


_decoder = msgspec.json.Decoder(Manifest)
_encoder = msgspec.json.Encoder()


def manifest_name(rank: int) -> str:
    return f"manifest-rank{rank}.json"


def checkpoint_dir(base: str | Path, attempt: int, rank: int) -> Path:
    """Where `rank` of `attempt` checkpoints under a job's `base` directory: nothing else writes there."""
    return Path(base) / f"attempt-{attempt}" / f"rank-{rank}"


def read_manifest(path: str | Path) -> Manifest | None:
    """The manifest at `path`, or None if it is missing or malformed (never raises for bad content)."""
    try:
        return _decoder.decode(Path(path).read_bytes())
    except (OSError, UnicodeDecodeError, msgspec.DecodeError):  # msgspec lets invalid UTF-8 in a string through
        return None


def write_manifest(directory: str | Path, manifest: Manifest) -> Path:
    """Atomically publish `manifest` in `directory` (tmp + fsync + rename)."""
    final = Path(directory) / manifest_name(manifest.rank)
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")  # per writer: an orphaned attempt may write too
    with open(tmp, "wb") as f:
        f.write(_encoder.encode(manifest))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    return final


def newest_manifest(
    directory: str | Path, *, rank: int | None = None, attempt: int | None = None
) -> Manifest | None:
    """The manifest with the highest step (newest file on ties), optionally of one rank or attempt only."""
    best: tuple[int, int, Manifest] | None = None
    try:
        paths = list(Path(directory).glob(MANIFEST_GLOB))
    except OSError:
        return None
    for p in paths:
        m = read_manifest(p)
        if m is None or (rank is not None and m.rank != rank) or (attempt is not None and not m.belongs_to(attempt)):
            continue
        try:
            mtime = p.stat().st_mtime_ns
        except OSError:
            continue
        key = (m.step, mtime, m)
        if best is None or key[:2] > best[:2]:
            best = key
    return best[2] if best else None


def reached_step(log_tail: str) -> int | None:
    """The step a worker last said it reached (`CORRAL_STEP=N` in its output), None if it never said."""
    found = PROGRESS.findall(log_tail)
    return int(found[-1]) if found else None


def step_of(path: str | None) -> int | None:
    """The step of a checkpoint a worker resumes from (a manifest, or a state file with "step"), None if unknown."""
    if not path:
        return None
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    step = data.get("step") if isinstance(data, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def checkpoint_failure(*, saved_since_signal: bool, exit_code: int | None, signal: int | None, log_tail: str,
                       base_step: int) -> tuple[str, int]:
    """(why a preempted worker saved no checkpoint, steps lost or -1); ("", -1) when it saved one.

    `base_step`: the step its job will resume from (its attempt's newest checkpoint, else the one
    the attempt resumed from, else 0).
    """
    if saved_since_signal:
        return "", -1
    if signal is not None:
        why = f"killed by signal {signal} before it saved a checkpoint (grace period over)"
    elif exit_code is None:
        why = "lost (no exit status) before it saved a checkpoint"
    elif exit_code == 0:
        why = "exited 0 without saving a checkpoint"
    else:
        why = f"exited {exit_code} while checkpointing"
    last = [ln.strip() for ln in log_tail.splitlines() if ln.strip() and not PROGRESS.match(ln.strip())]
    if last and signal is None:
        why += f": {last[-1][:300]}"
    reached = reached_step(log_tail)
    return why, (max(0, reached - base_step) if reached is not None else -1)
