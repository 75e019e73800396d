"""Who leads: the lease in a KV bucket (a standby scheduler does not waste work) and the elections of epochs.

The lease is an optimisation, not the safety net: two schedulers that both
believe they lead are still safe because `evolve` voids any decision from an
epoch older than the newest SchedulerElected in the log.

It is also what tells a leader that its judgement of time can be trusted
(`current`): the bucket's TTL starts when the server stores our create or
update, which is after we sent it, so nobody else can take the lease before
(our monotonic clock when we sent it) + TTL. A leader that was paused past
that point is no longer sure of anything until it renews.

The elections (`Elections`) sit beside the lease: the lease keeps candidates
from trying at once, the log decides. An election is the next epoch or
nothing: a candidate's SchedulerElected is stored only if no other election
was stored since the newest one it folded (`Bus.append_after`), and the fold
voids any epoch that is not previous + 1. An election the fold refuses (a
forged or corrupt `SchedulerElected`, say epoch 2^64-1 appended by anyone who
may write the log) changes nothing, so scheduling goes on; it is named
loudly all the same: an `election_refused` error line and the
`corral_elections_refused` counter. A scheduler that cannot lead -- its own
election was refused by the server, or its fold lacks the log's newest
election -- says why in `Elections.cannot_lead`, which /readyz reports (503)
until an election is folded again.
"""

from __future__ import annotations

import asyncio
import math
import secrets
import time
from collections.abc import Callable, Sequence

import msgspec
import nats.errors
import structlog
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from events.bus import Bus, BusError, NotLast, append_reclaiming
from events.follow import Follower
from events.subjects import subject_for
from events.swallowed_cancel import stop_if_cancelled
from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import ClusterState, Config
from orchestrator.scheduler import metrics
from schemas import ClusterConfigured, SchedulerElected

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


#: The subject every SchedulerElected is stored on (the compare-and-set of an election is on it).
ELECTIONS = subject_for(SchedulerElected(event_id="-", occurred_at=0.0, epoch=0, scheduler_id="-"))


async def newest_election(bus: Bus) -> tuple[int, int | None]:
    """The stream sequence of the newest SchedulerElected (void or not; 0 if none) and its epoch if readable."""
    newest = await bus.last_on(ELECTIONS)
    if newest is None:
        return 0, None
    return newest.seq, newest.event.epoch if isinstance(newest.event, SchedulerElected) else None


class Elections:
    """One scheduler's campaign: hold the lease, store its election as the epoch after the newest, or stand by.

    `lease` is set by the service once its bucket exists; `appended` is told the seqs of what an election
    stored and answers the seq to wait for before deciding (the service's newest append).
    """

    def __init__(self, bus: Bus, follower: Follower[ClusterState], scheduler_id: str, lease_ttl_s: float,
                 cluster: ClusterConfigured | None, appended: Callable[[Sequence[int]], int],
                 policy: str = "corral") -> None:
        self.bus = bus
        self.follower = follower
        self.scheduler_id = scheduler_id
        self.lease_ttl_s = lease_ttl_s
        #: Appended once when the log has no cluster settings yet, right after our election.
        self.cluster = cluster
        #: The named policy we decide with, written into our SchedulerElected for operators and re-runs to read.
        self.policy = policy
        self._appended = appended
        self.lease: Lease | None = None
        self.epoch = 0  # the epoch we campaign with; leading also needs the log to agree
        #: Why this scheduler cannot lead now ("" when it can, or has not tried): see the module docstring.
        self.cannot_lead = ""

    @property
    def leading(self) -> bool:
        """We lead when the *log* says so: our SchedulerElected is the newest one folded."""
        s = self.follower.state
        return self.epoch > 0 and s.epoch == self.epoch and s.scheduler_id == self.scheduler_id

    def fold(self, state: ClusterState, event: SchedulerElected, seq: int, at: float | None = None) -> ClusterState:
        """`evolve` of an election, naming it if the fold refuses it (module docstring); folds exactly as `evolve`."""
        voids = state.voids
        state = evolve(state, event, seq, at)
        if state.voids > voids:
            metrics.ELECTIONS_REFUSED.inc()
            log.error("election_refused", seq=state.seq, epoch=event.epoch, scheduler_id=event.scheduler_id,
                      event_id=event.event_id, newest_epoch=state.epoch, leader=state.scheduler_id,
                      why="its epoch does not follow the newest election (forged or corrupt?): void, "
                          "scheduling goes on under the newest valid one")
        elif self.cannot_lead:
            log.info("can_lead_again", epoch=state.epoch, leader=state.scheduler_id)
            self.cannot_lead = ""
        return state

    async def campaign(self) -> None:
        assert self.lease is not None
        while True:
            stop_if_cancelled()
            if self.lease.held:
                if not await self.lease.renew(self.epoch):
                    log.warning("standing_by", reason="lease lost")
                    self.epoch = 0
                elif self.follower.state.epoch > self.epoch:
                    log.warning("standing_by", reason="newer epoch in the log", epoch=self.follower.state.epoch)
                    self.epoch = 0
                    await self.lease.release()
            elif await self.lease.try_acquire(self.follower.state.epoch + 1):
                await self.elect()
            await asyncio.sleep(self.lease_ttl_s / 3)

    async def elect(self) -> None:
        """Append our SchedulerElected as the epoch after the newest election, or stand by.

        Our election is stored only if no other was stored since the newest one we folded
        (`Bus.append_after`), so two candidates never both store epoch N+1 (one whose fold is
        behind, say after a pause, loses and stands by).
        """
        sid = self.scheduler_id
        try:
            last, newest = await newest_election(self.bus)
            if self.follower.state.seq < last:
                await self.follower.catch_up(to_seq=last)  # our epoch follows that one
            state = self.follower.state
            epoch = state.epoch + 1
            if newest == epoch:
                # Folded, that election would hold this epoch already: our fold lacks it (a reader
                # that skipped events). Electing would store a second epoch N whose void election
                # we alone would not see, so stand by.
                log.error("standing_by", reason="the fold is behind the log's newest election", seq=last,
                          epoch=newest, folded_epoch=state.epoch)
                self.cannot_lead = (f"cannot lead: the fold (epoch {state.epoch}) lacks the log's newest "
                                    f"election (epoch {newest}, seq {last})")
                await self.stand_by()
                return
            # A fresh id per try: the compare-and-set makes an epoch unique, and an id someone
            # squatted (events/bus.py, IdSquatted) must not keep us from ever being elected.
            elected = SchedulerElected(event_id=f"elect:{epoch}:{sid}:{secrets.token_hex(4)}", occurred_at=time.time(),
                                       epoch=epoch, scheduler_id=sid, policy=self.policy)
            seqs = [await self.bus.append_after(elected, last)]
            # Settings right after, under the new epoch; we decide only once both are folded.
            cfg = self.cluster
            if cfg is not None and self.follower.state.config == Config():
                seqs += await append_reclaiming(self.bus, [msgspec.structs.replace(cfg, epoch=epoch)])
        except NotLast as e:
            log.warning("standing_by", reason="another election was stored first", seq=e.last_seq)
            await self.stand_by()
            return
        except (BusError, nats.errors.Error, TimeoutError) as e:
            # Not elected until the log says so: give the lease back and campaign again later.
            log.error("append_failed", what="election", error=str(e) or repr(e))
            self.cannot_lead = f"cannot lead: its election could not be stored: {str(e) or repr(e)}"
            await self.stand_by()
            return
        self.epoch = epoch
        await self.follower.wait_for_seq(self._appended(seqs))
        if self.leading:
            log.info("leading", epoch=self.epoch, policy=self.policy)
        self.follower.changed.set()

    async def stand_by(self) -> None:
        self.epoch = 0
        assert self.lease is not None
        await self.lease.release()
