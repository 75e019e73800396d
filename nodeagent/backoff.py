"""Rank restart delays: exponential, capped and jittered.

Jitter spreads the restarts of many ranks that crashed together (a lost
filesystem, a dead peer) so they do not hammer the same thing in lockstep.
How many restarts a rank had is in the log (`WorkerStarted.restarts`), not
here, so an agent that restarts during a backoff goes on where it was.
The jitter source is injected so tests are deterministic.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from orchestrator.core.backoff import BASE_S, CAP_S, FACTOR, restart_delay


@dataclass(frozen=True)
class Backoff:
    #: The exponential part is the one gang restarts use too (orchestrator.core.backoff).
    base_s: float = BASE_S
    factor: float = FACTOR
    cap_s: float = CAP_S
    #: Fraction of the delay to randomise, both ways: 0.1 -> delay * [0.9, 1.1).
    jitter: float = 0.1
    #: Returns a float in [0, 1); random.random by default.
    rand: Callable[[], float] = field(default=random.random, repr=False)

    def __post_init__(self) -> None:
        if self.base_s < 0 or self.cap_s < 0 or self.factor < 1 or not 0 <= self.jitter <= 1:
            raise ValueError(f"invalid backoff settings: {self!r}")

    def delay_for(self, failures: int) -> float:
        """The delay before restart number `failures` (1-based), jitter included."""
        raw = restart_delay(failures, self.base_s, self.factor, self.cap_s)
        jittered = raw * (1 + self.jitter * (2 * self.rand() - 1))
        return max(0.0, min(self.cap_s, jittered))
