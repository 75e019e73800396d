"""Leader lease in a KV bucket, so a standby scheduler does not waste work.

The lease is an optimisation, not the safety net: two schedulers that both
believe they lead are still safe because `evolve` voids any decision from an
epoch older than the newest SchedulerElected in the log.
"""

from __future__ import annotations

import msgspec
import structlog
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

log = structlog.get_logger("corral.leader")

LEASE_BUCKET = "corral-leader"
LEASE_KEY = "scheduler"


class LeaseValue(msgspec.Struct):
    scheduler_id: str
    epoch: int


class Lease:
    """Holds or waits for the lease; `try_acquire`/`renew` are called from the scheduler's loop."""

    def __init__(self, kv: KeyValue, scheduler_id: str) -> None:
        self._kv = kv
        self._id = scheduler_id
        self._revision: int | None = None

    @property
    def held(self) -> bool:
        return self._revision is not None

    async def try_acquire(self, epoch: int) -> bool:
        """Take the lease if nobody holds it (the key is absent or expired)."""
        value = msgspec.json.encode(LeaseValue(self._id, epoch))
        try:
            self._revision = await self._kv.create(LEASE_KEY, value)
        except KeyWrongLastSequenceError:
            return False
        except Exception as e:
            log.warning("lease_acquire_failed", error=str(e))
            return False
        log.info("lease_acquired", scheduler_id=self._id, epoch=epoch)
        return True

    async def renew(self, epoch: int) -> bool:
        """Refresh our lease; False means another scheduler took over (we must stand by)."""
        if self._revision is None:
            return False
        value = msgspec.json.encode(LeaseValue(self._id, epoch))
        try:
            self._revision = await self._kv.update(LEASE_KEY, value, last=self._revision)
            return True
        except (KeyWrongLastSequenceError, KeyNotFoundError):
            log.warning("lease_lost", scheduler_id=self._id)
        except Exception as e:
            log.warning("lease_renew_failed", error=str(e))
            # Keep the revision: a transient error must not flip leadership; the TTL decides.
            return True
        self._revision = None
        return False

    async def release(self) -> None:
        if self._revision is None:
            return
        try:
            await self._kv.delete(LEASE_KEY, last=self._revision)
        except Exception:
            pass
        self._revision = None
