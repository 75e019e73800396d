"""Every log corral reads is a LogSource (events/logsource.py): a Follower folds a log file as it folds the stream.

Checked against the file itself: its lines folded one by one with `evolve` (no Follower, no LogFile).
"""

from __future__ import annotations

import json
from contextlib import aclosing
from pathlib import Path

import pytest

from events.bus import LogGap
from events.follow import Follower
from events.logfile import LogFile
from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import ClusterState, snapshot
from schemas import QueueDefined, decode, encode

T0 = 1_750_000_000.0
N = 20


def queue(i: int) -> QueueDefined:
    return QueueDefined(event_id=f"q{i}", occurred_at=T0 + i, queue=f"team{i}", weight=1.0 + i)


@pytest.fixture
def sim_log(tmp_path: Path) -> Path:
    """A log as `corral sim` writes it: one encoded event a line, positions 1..N."""
    path = tmp_path / "events-corral.jsonl"
    path.write_bytes(b"".join(encode(queue(i)) + b"\n" for i in range(1, N + 1)))
    return path


def folded_lines(path: Path) -> bytes:
    state = ClusterState()
    for seq, line in enumerate(path.read_bytes().splitlines(), 1):
        evolve(state, decode(line), seq)
    return snapshot(state)


async def test_a_follower_catches_up_with_a_log_file_and_follows_it_to_its_end(sim_log: Path) -> None:
    caught = Follower(LogFile(sim_log), evolve, ClusterState())
    await caught.catch_up()
    assert caught.caught_up and snapshot(caught.state) == folded_lines(sim_log)
    followed = Follower(LogFile(sim_log), evolve, ClusterState())
    seen: list[int] = []
    followed.on_event(lambda env: seen.append(env.seq))
    await followed.follow()  # a file does not grow: following it ends at its last line
    assert seen == list(range(1, N + 1)) and snapshot(followed.state) == folded_lines(sim_log)


async def test_a_log_files_tail_starts_where_asked_and_ends_at_its_last_line(sim_log: Path) -> None:
    log = LogFile(sim_log)

    async def seqs(**kw: object) -> list[int]:
        async with aclosing(log.tail(**kw)) as envs:  # type: ignore[arg-type]
            return [env.seq async for env in envs]

    assert await seqs() == []  # from now: nothing is appended to a file
    assert await seqs(from_seq=15) == list(range(15, N + 1))
    assert await seqs(since=T0 + 18) == [18, 19, 20]
    with pytest.raises(ValueError):
        await seqs(from_seq=2, since=T0)


async def test_a_follower_stops_at_a_gap_in_an_export_naming_it(tmp_path: Path) -> None:
    """An export of `corral tail --json` keeps the stream's positions: one it lacks is a gap, never skipped."""
    path = tmp_path / "export.jsonl"
    lines = [{"seq": s, "subject": f"corral.queue.team{s}.QueueDefined", "time": T0 + s, "type": "QueueDefined",
              "event": json.loads(encode(queue(s)))} for s in (1, 2, 3, 5, 6)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    log = LogFile(path)
    assert await log.missing(3) is None
    assert "not in the log file" in (await log.missing(4) or "")
    follower = Follower(log, evolve, ClusterState())
    with pytest.raises(LogGap) as gap:
        await follower.catch_up()
    assert (gap.value.expected, gap.value.found) == (4, 5) and "not in the log file" in gap.value.why
    assert follower.state.seq == 3
