"""Leader lease in a KV bucket, so a standby scheduler does not waste work.

The lease is an optimisation, not the safety net: two schedulers that both
believe they lead are still safe because `evolve` voids any decision from an
epoch older than the newest SchedulerElected in the log.

It is also what tells a leader that its judgement of time can be trusted
(`current`): the bucket's TTL starts when the server stores our create or
update, which is after we sent it, so nobody else can take the lease before
(our monotonic clock when we sent it) + TTL. A leader that was paused past
that point is no longer sure of anything until it renews.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import msgspec
import structlog
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

log = structlog.get_logger("corral.leader")

LEASE_BUCKET = "corral-leader"
LEASE_KEY = "scheduler"
#: The share of the TTL a renewal is trusted for: the rest covers the server's and our clocks
#: running at slightly different rates, and the server expiring the key a little early.
TRUSTED_SHARE = 0.8


class LeaseValue(msgspec.Struct):
    scheduler_id: str
    epoch: int


class Lease:
    """Holds or waits for the lease; `try_acquire`/`renew` are called from the scheduler's loop."""

    def __init__(self, kv: KeyValue, scheduler_id: str, ttl_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._kv = kv
        self._id = scheduler_id
        self._ttl_s = ttl_s
        self._clock = clock
        self._revision: int | None = None
        #: Until when (our clock) the lease is provably ours: set from the send time of the newest
        #: create or update the server confirmed; -inf while not held.
        self.valid_until = -math.inf

    @property
    def held(self) -> bool:
        return self._revision is not None

    def current(self) -> bool:
        """Whether nobody else can hold the lease now: held, and the newest confirmed renewal not yet expired."""
        return self._revision is not None and self._clock() < self.valid_until

    def _confirmed(self, sent_at: float) -> None:
        self.valid_until = sent_at + self._ttl_s * TRUSTED_SHARE

    async def try_acquire(self, epoch: int) -> bool:
        """Take the lease if nobody holds it (the key is absent or expired)."""
        value = msgspec.json.encode(LeaseValue(self._id, epoch))
        sent_at = self._clock()
        try:
            self._revision = await self._kv.create(LEASE_KEY, value)
        except KeyWrongLastSequenceError:
            return False
        except Exception as e:
            log.warning("lease_acquire_failed", error=str(e))
            return False
        self._confirmed(sent_at)
        log.info("lease_acquired", scheduler_id=self._id, epoch=epoch)
        return True

    async def renew(self, epoch: int) -> bool:
        """Refresh our lease; False means another scheduler took over (we must stand by)."""
        if self._revision is None:
            return False
        value = msgspec.json.encode(LeaseValue(self._id, epoch))
        sent_at = self._clock()
        try:
            self._revision = await self._kv.update(LEASE_KEY, value, last=self._revision)
            self._confirmed(sent_at)
            return True
        except (KeyWrongLastSequenceError, KeyNotFoundError):
            log.warning("lease_lost", scheduler_id=self._id)
        except Exception as e:
            log.warning("lease_renew_failed", error=str(e))
            # Keep the revision: a transient error must not flip leadership; the TTL decides (and
            # `current` turns false when the last confirmed renewal runs out).
            return True
        self._revision = None
        self.valid_until = -math.inf
        return False

    async def release(self) -> None:
        if self._revision is None:
            return
        try:
            await self._kv.delete(LEASE_KEY, last=self._revision)
        except Exception:
            pass
        self._revision = None
        self.valid_until = -math.inf
