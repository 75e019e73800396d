"""The end of every fault test: replay the whole log and check DESIGN.md's invariants on it.

Whatever a fault did to the services, the log is the truth every reader
agrees on, so the checks run on a fresh replay, position by position:
- invariant 1: no GPU belongs to two live gangs at any position;
- invariant 2: every live gang holds all of its ranks at every position;
- invariant 3: folding the log twice gives byte-equal snapshots;
- invariant 6: stream sequences are contiguous (nothing stored was lost on the
  way to a reader) and every job was submitted exactly once;
- no rank ran twice: at most one WorkerStarted per (job, attempt, rank, restarts);
- every job reached a final state (when the test says the workload is over).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from events.bus import Bus
from orchestrator.core.evolve import fold
from orchestrator.core.model.state import TERMINAL, ClusterState, snapshot
from schemas import AnyEvent, JobSubmitted, Unknown, WorkerStarted
from tests.integration.harness import assert_no_double_booking

LogEntry = tuple[int, AnyEvent | Unknown]


async def read_log(bus: Bus) -> list[LogEntry]:
    """Every event in the stream, with its sequence, by the same replay path the services use."""
    return [(env.seq, env.event) async for batch in bus.replay() for env in batch]


def duplicate_starts(events: Iterable[LogEntry]) -> dict[tuple[str, int, int, int], int]:
    """(job, attempt, rank, restarts) -> count, for every worker identity started more than once."""
    starts = Counter((e.job_id, e.attempt, e.rank, e.restarts) for _, e in events if isinstance(e, WorkerStarted))
    return {k: n for k, n in starts.items() if n > 1}


def check_log(events: list[LogEntry], *, final: bool = True, jobs: Iterable[str] | None = None) -> ClusterState:
    """Assert the invariants above on a whole log; the folded final state, for test-specific checks.

    `jobs`: the ids the test submitted; each must be in the log exactly once (and nothing else).
    """
    seqs = [s for s, _ in events]
    assert seqs == list(range(1, len(seqs) + 1)), "stream sequences have a gap or a repeat"
    submitted = Counter(e.job_id for _, e in events if isinstance(e, JobSubmitted))
    twice = {j: n for j, n in submitted.items() if n > 1}
    assert not twice, f"jobs submitted more than once in the log: {twice}"
    if jobs is not None:
        wanted = set(jobs)
        assert set(submitted) == wanted, (
            f"missing from the log: {sorted(wanted - set(submitted))[:10]}; "
            f"unexpected: {sorted(set(submitted) - wanted)[:10]}"
        )
    dups = duplicate_starts(events)
    assert not dups, f"ranks started twice: {dict(list(dups.items())[:10])}"
    state = assert_no_double_booking(events)
    again = fold(e for _, e in events)
    again.seq = state.seq  # fold() numbers positions 1, 2, ...; the stream's are the same when contiguous
    assert snapshot(again) == snapshot(state), "folding the same log twice gave different states"
    if final:
        open_jobs = {j.job_id: j.status for j in state.jobs.values() if j.status not in TERMINAL}
        assert not open_jobs, f"{len(open_jobs)} jobs not final: {dict(list(open_jobs.items())[:10])}"
    return state
