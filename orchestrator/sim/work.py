"""How far a simulated job got, and what each interruption cost it.

A job needs `duration` seconds on its whole gang. It saves a checkpoint every
`interval` seconds of progress; an interrupted attempt keeps only the newest
checkpoint (preemption and node failure alike: the work since then is lost),
and every later attempt first pays a restart overhead (rescheduling, image
pull, loading the checkpoint). With interval 0 a job checkpoints on the
preemption signal instead, so a preemption loses only the overhead, while a
node failure (no signal) loses everything since the attempt began.
"""

from __future__ import annotations

import math


def checkpoint_at(progress: float, saved: float, interval: float, *, signalled: bool) -> float:
    """The newest checkpoint after `progress` seconds of work (never older than `saved`)."""
    if interval > 0:
        return max(saved, math.floor(progress / interval) * interval)
    return progress if signalled else saved


class Work:
    __slots__ = ("cause", "duration", "gpus", "lost", "overhead", "ran", "saved", "started_at")

    def __init__(self, duration: float, gpus: int) -> None:
        self.duration = duration
        self.gpus = gpus
        #: Checkpointed progress in seconds of work.
        self.saved = 0.0
        #: Start of the running attempt (nan when not running) and its restart overhead.
        self.started_at = math.nan
        self.overhead = 0.0
        #: The job ran before (so the next attempt restarts), and why it stopped last.
        self.ran = False
        self.cause = ""
        #: GPU-seconds lost per cause ("preemption", "failure"): work after the last checkpoint plus overheads.
        self.lost: dict[str, float] = {}

    def start(self, now: float, restart_overhead_s: float) -> float:
        """Begin an attempt; returns when it completes if nothing stops it."""
        self.started_at = now
        self.overhead = restart_overhead_s if self.ran else 0.0
        self.ran = True
        return now + self.overhead + (self.duration - self.saved)

    def progress(self, now: float) -> float:
        return self.saved + max(0.0, now - self.started_at - self.overhead)

    def interrupt(self, now: float, cause: str, interval: float, *, signalled: bool) -> float:
        """End the running attempt early; returns the checkpoint it resumes from (seconds of work)."""
        ck = checkpoint_at(min(self.progress(now), self.duration), self.saved, interval, signalled=signalled)
        wasted = (now - self.started_at) - (ck - self.saved)
        self.lost[cause] = self.lost.get(cause, 0.0) + max(0.0, wasted) * self.gpus
        self.saved = ck
        self.started_at = math.nan
        self.cause = cause
        return ck

    def complete(self) -> None:
        """The attempt finished the job: its restart overhead is charged to what caused the restart."""
        if self.overhead and self.cause:
            self.lost[self.cause] = self.lost.get(self.cause, 0.0) + self.overhead * self.gpus
        self.started_at = math.nan

    def abandon(self, now: float) -> float:
        """The attempt ends without saving (killed at its time limit, cancelled): GPU-seconds it used."""
        used = (now - self.started_at) * self.gpus if not math.isnan(self.started_at) else 0.0
        self.started_at = math.nan
        return used
