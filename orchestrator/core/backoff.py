"""How long the n-th restart of a crashing job waits: one rule for both restart policies.

`rank`: the node agent restarts the worker itself and sleeps this delay first
(nodeagent.backoff adds jitter). `gang`: the
scheduler core decides the restart and writes `now + delay` into the
GangRestarted as `not_before`, which every agent of the gang honours, counted
from the event's stream time (#30: whatever each machine's clock says); so the
delay is in the log, the same for every node, and survives an agent restart.
"""

from __future__ import annotations

#: First delay, growth per restart and ceiling (seconds); nodeagent.backoff.Backoff's defaults.
BASE_S = 1.0
FACTOR = 2.0
CAP_S = 60.0


def restart_delay(restarts: int, base_s: float = BASE_S, factor: float = FACTOR, cap_s: float = CAP_S) -> float:
    """Seconds before restart number `restarts` (1-based): `base_s`, times `factor` per restart, at most `cap_s`."""
    try:
        raw = base_s * factor ** max(restarts - 1, 0)
    except OverflowError:  # a huge restart count: far past the cap anyway
        raw = cap_s
    return max(0.0, min(cap_s, raw))
