"""Restart delays: exponential, capped, jittered, and forgiven after a stable run.

Jitter spreads the restarts of many ranks that crashed together (a lost
filesystem, a dead peer) so they do not hammer the same thing in lockstep.
A worker that ran for `stable_after_s` has proven the earlier crashes were
transient, so its next crash starts the sequence over from `base_s`.
The jitter source is injected so tests are deterministic.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from orchestrator.core.backoff import BASE_S, CAP_S, FACTOR, restart_delay


@dataclass
class Backoff:
    #: The exponential part is the one gang restarts use too (orchestrator.core.backoff).
    base_s: float = BASE_S
    factor: float = FACTOR
    cap_s: float = CAP_S
    #: Fraction of the delay to randomise, both ways: 0.1 -> delay * [0.9, 1.1).
    jitter: float = 0.1
    stable_after_s: float = 60.0
    #: Returns a float in [0, 1); random.random by default.
    rand: Callable[[], float] = field(default=random.random, repr=False)
    failures: int = 0
    _started_at: float | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.base_s < 0 or self.cap_s < 0 or self.factor < 1 or not 0 <= self.jitter <= 1:
            raise ValueError(f"invalid backoff settings: {self!r}")

    def delay_for(self, failures: int) -> float:
        """The delay before restart number `failures` (1-based), jitter included."""
        raw = restart_delay(failures, self.base_s, self.factor, self.cap_s)
        jittered = raw * (1 + self.jitter * (2 * self.rand() - 1))
        return max(0.0, min(self.cap_s, jittered))

    def started(self, now: float) -> None:
        """A worker (re)started at `now` (monotonic seconds)."""
        self._started_at = now

    def failed(self, now: float) -> float:
        """The worker failed at `now`: the delay before restarting it."""
        if self._started_at is not None and now - self._started_at >= self.stable_after_s:
            self.failures = 0
        self.failures += 1
        return self.delay_for(self.failures)

    def reset(self) -> None:
        self.failures = 0
        self._started_at = None
