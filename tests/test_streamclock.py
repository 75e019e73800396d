"""events/streamclock.py: the stream's time as a reader can prove it, and the Follower that keeps it (#30)."""

from __future__ import annotations

from events.bus import Bus, Envelope
from events.follow import Follower
from events.streamclock import StreamClock
from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import ClusterState
from schemas import JobSpec, JobSubmitted


class Monotonic:
    def __init__(self) -> None:
        self.t = 50.0

    def __call__(self) -> float:
        return self.t


def test_unknown_until_an_event_is_read() -> None:
    clock = StreamClock(Monotonic())
    assert not clock.known and clock.now() is None


def test_carried_forward_on_the_monotonic_clock() -> None:
    mono = Monotonic()
    clock = StreamClock(mono)
    clock.saw(1000.0)
    mono.t += 7.5
    assert clock.now() == 1007.5


def test_the_freshest_read_wins_and_old_reads_never_pull_it_back() -> None:
    """A catch-up read of an old event proves an old time only; it never moves the clock back (nor ahead)."""
    mono = Monotonic()
    clock = StreamClock(mono)
    clock.saw(900.0)  # read now, stored long ago (catch-up)
    assert clock.now() == 900.0
    mono.t += 1.0
    clock.saw(1000.0)  # a live event: the server's clock was at least 1000 now
    assert clock.now() == 1000.0
    mono.t += 2.0
    clock.saw(950.0)  # a late read of an older event proves less
    assert clock.now() == 1002.0


def test_a_follower_folds_at_stream_time_and_keeps_the_clock() -> None:
    f = Follower(None, evolve, ClusterState(), stream_times=True)  # type: ignore[arg-type]  # apply does no IO
    submitted = JobSubmitted(event_id="s", occurred_at=700.0, job_id="j", spec=JobSpec(name="j", command=("true",)))
    f.apply(Envelope(1, "corral.job.j.JobSubmitted", 1000.0, submitted))
    assert f.state.jobs["j"].submitted_at == 1000.0  # the stream's time, not the submitter's clock
    now = f.clock.now()
    assert now is not None and now >= 1000.0


def test_a_replay_batch_sets_the_clock_from_its_newest_event() -> None:
    f = Follower(None, evolve, ClusterState(), stream_times=True)  # type: ignore[arg-type]
    events = [JobSubmitted(event_id=f"s{i}", occurred_at=0.0, job_id=f"j{i}", spec=JobSpec(name="j", command=("true",)))
              for i in (1, 2)]
    f.apply_batch([Envelope(i, f"corral.job.j{i}.JobSubmitted", 1000.0 + i, e) for i, e in enumerate(events, 1)])
    assert f.state.jobs["j2"].submitted_at == 1002.0
    now = f.clock.now()
    assert now is not None and now >= 1002.0


async def test_the_server_says_its_time(bus: Bus) -> None:
    """What a reader without a fold takes as "now" (CLI views, `tail --since`): the server's clock, never behind
    what the stream stored."""
    (seq,) = await bus.append_many([JobSubmitted(event_id="s", occurred_at=0.0, job_id="j",
                                                 spec=JobSpec(name="j", command=("true",)))])
    (env,) = [e async for batch in bus.replay(from_seq=seq, to_seq=seq) for e in batch]
    now = await bus.server_time()
    assert now is not None and now >= env.stream_time


def test_a_reporting_reader_keeps_the_publishers_times() -> None:
    """Without `stream_times` (the CLI, the index) a log loaded from a simulation keeps its history; the clock
    still follows the stream."""
    f = Follower(None, evolve, ClusterState())  # type: ignore[arg-type]
    submitted = JobSubmitted(event_id="s", occurred_at=700.0, job_id="j", spec=JobSpec(name="j", command=("true",)))
    f.apply(Envelope(1, "corral.job.j.JobSubmitted", 1000.0, submitted))
    assert f.state.jobs["j"].submitted_at == 700.0
    assert f.clock.known
