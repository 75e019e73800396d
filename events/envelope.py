"""An event as a reader of the log gets it: with its position and the time the log stored it.

Its own module, without NATS: what a log file (events/logfile.py) or any other
log source hands out too (events/logsource.py).
"""

from __future__ import annotations

import msgspec

from schemas import AnyEvent, Unknown


class Envelope(msgspec.Struct, frozen=True, gc=False):
    """One event as read from the log, with where and when the log stored it.

    A frozen msgspec Struct rather than a frozen dataclass (same fields, same
    attribute API): building one costs a tenth of a frozen dataclass, and
    `gc=False` keeps replay batches out of the cyclic GC's work (an Envelope
    holds an immutable event tree, so it can never be part of a cycle).
    Together that was ~10% of replay throughput (bench/RESULTS.md).
    """

    seq: int
    subject: str
    #: Server receive time, seconds since the epoch (the publisher's is event.occurred_at).
    stream_time: float
    event: AnyEvent | Unknown
