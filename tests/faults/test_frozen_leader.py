"""A leading scheduler frozen past its lease, three times: nothing it does afterwards changes the fold.

Fault: the leading `corral scheduler` process is SIGSTOPped (a VM freeze, a
long GC, a debugger) for 15 s past its lease and its nodes' heartbeat timeout,
then SIGCONTed; three times, each time whichever scheduler leads by then. Four
`corral agent` processes run a workload throughout and never stop beating.
Found (issue #19): the resumed leader judged heartbeat ages by its own paused
clock and appended NodeFailed for every healthy node within 5 s; NodeFailed
carried no epoch, so the fold accepted them and every gang was requeued.
Check, on the raw log:
- every event authored under an epoch older than the newest election stored
  before it is void (counted void by the fold, and changes nothing);
- no NodeFailed at all: every node beat all along (a stale one would be void
  by the check above, but the leader must not even judge after a stall);
- elections are 1, 2, 3, ... each stored once, and leadership changed at
  least once per pause with a standby;
- every job completes (none stranded), and whole-log invariants hold
  (tests/faults/logcheck.py).
Without a standby (the variant below), the same scheduler leads again after
each pause, and no NodeFailed is appended either.
Acceptance 5 of issue #19.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import pytest

from events.bus import Bus, NotLast
from events.sdk import Client
from events.server import NatsServer
from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import ClusterState, snapshot
from schemas import JobSpec, NodeFailed, SchedulerElected, decode
from tests.faults.logcheck import check_log, read_log
from tests.faults.services import Proc, agent_proc, observer, scheduler_proc, stop_all, until

pytestmark = pytest.mark.slow

NODES = 4
LEASE_S = 1.5
HEARTBEAT_TIMEOUT_S = 6.0
#: 15 s past the lease, and well past the heartbeat timeout.
PAUSE_S = LEASE_S + 15.0
PAUSES = 3


def resume(proc: Proc) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)


async def _raw_log(bus: Bus) -> list[tuple[int, bytes]]:
    """Every stored message's bytes, by sequence: what the schedulers wrote, before any reader decodes it."""
    last = await bus.last_seq()
    return [(seq, (await bus.js.get_msg(bus.stream, seq, direct=True)).data or b"") for seq in range(1, last + 1)]


def check_fenced(messages: list[tuple[int, bytes]]) -> tuple[int, int]:
    """Every event stamped with an epoch older than the newest election before it is void and changes nothing.

    The epochs are read from the raw JSON (the newest election is the last SchedulerElected stored
    before the position), not from the fold being checked. Returns (stale events, elections).
    """
    state = ClusterState()
    newest, stale, elections = 0, 0, 0
    for seq, data in messages:
        raw = json.loads(data)
        epoch = raw.get("epoch")
        is_stale = raw["type"] != "SchedulerElected" and isinstance(epoch, int) and 0 < epoch < newest
        before, voids = (_normalized(state), state.voids) if is_stale else (b"", 0)
        evolve(state, decode(data), seq)
        if is_stale:
            stale += 1
            assert state.voids == voids + 1, f"seq {seq}: {raw['type']} from epoch {epoch} < {newest} is not void"
            assert _normalized(state) == before, f"seq {seq}: a stale {raw['type']} changed the fold"
        if raw["type"] == "SchedulerElected":
            elections += 1
            assert raw["epoch"] == newest + 1, f"seq {seq}: election of epoch {raw['epoch']} after {newest}"
            newest = raw["epoch"]
    return stale, elections


def _normalized(state: ClusterState) -> bytes:
    s = state.copy()
    s.seq, s.voids, s.last_void = 0, 0, ""
    return snapshot(s)


async def _frozen_leader(nats_server: NatsServer, bus: Bus, tmp_path: Path, schedulers: int) -> None:
    url = nats_server.url
    procs: dict[str, Proc] = {}
    everyone: list[Proc] = []
    ids: list[str] = []
    try:
        for i in range(1, schedulers + 1):
            procs[f"s{i}"] = scheduler_proc(url, f"s{i}", tmp_path, heartbeat_timeout=HEARTBEAT_TIMEOUT_S,
                                            lease_ttl=LEASE_S)
        everyone.extend(procs.values())
        for i in range(NODES):
            (tmp_path / f"n{i}").mkdir()
            everyone.append(agent_proc(url, f"n{i}", tmp_path / f"n{i}", gpus=8, index=i))
        async with observer(bus) as f:
            await until(f, lambda s: s.epoch >= 1 and len(s.nodes) == NODES, 90, "a leader and the nodes",
                        alive=everyone)
            client = Client(bus, user="test")

            async def submit(wave: int, count: int) -> None:
                for k in range(count):
                    job = f"w{wave}-{k}"
                    ids.append(job)
                    # Long enough to run across the pause that follows; 1-4 GPUs so the nodes stay busy.
                    spec = JobSpec(name=job, ranks=1 + k % 2, gpus_per_rank=1 + k % 4,
                                   command=("sleep", str(4 + k % 5)))
                    await client.submit(spec, job_id=job)

            for i in range(1, PAUSES + 1):
                await submit(i, 10)
                await until(f, lambda s: any(j.status == "running" for j in s.jobs.values()), 60,
                            f"work running before pause {i}", alive=everyone)
                leader, epoch = f.state.scheduler_id, f.state.epoch
                frozen = procs[leader]
                frozen.send_signal(signal.SIGSTOP)
                try:
                    await asyncio.sleep(PAUSE_S)
                    if schedulers > 1:
                        assert f.state.epoch > epoch, f"no standby took over during pause {i}"
                finally:
                    resume(frozen)
                # Leave the resumed one time to act on its stale view (it did within 5 s), and the
                # single scheduler time to lead again.
                await until(f, lambda s, e=epoch: s.epoch > e, 60, f"a leader after pause {i}",  # type: ignore[misc]
                            alive=everyone)
                await asyncio.sleep(HEARTBEAT_TIMEOUT_S)
                failed = [n for n, node in f.state.nodes.items() if node.failed]
                assert not failed, f"healthy nodes failed after pause {i}: {failed}"
            await until(f, lambda s: all(s.jobs[j].status == "completed" for j in ids), 120,
                        "every job to complete", alive=everyone)
    finally:
        for p in everyone:
            resume(p)
        stop_all(everyone)

    events = await read_log(bus)
    check_log(events, jobs=ids)
    appended = [e.node_id for _, e in events if isinstance(e, NodeFailed)]
    assert not appended, f"NodeFailed appended for nodes that beat all along: {appended}"
    stale, elections = check_fenced(await _raw_log(bus))
    assert elections >= PAUSES + 1, f"{elections} elections for {PAUSES} pauses"
    leaders = [e.scheduler_id for _, e in events if isinstance(e, SchedulerElected)]
    print(f"elections: {leaders}; stale events found void: {stale}")


async def test_frozen_leader_with_a_standby(nats_server: NatsServer, bus: Bus, tmp_path: Path) -> None:
    await _frozen_leader(nats_server, bus, tmp_path, schedulers=2)


async def test_frozen_leader_alone(nats_server: NatsServer, bus: Bus, tmp_path: Path) -> None:
    """No standby: nobody takes over, its lease simply expires; after the pause it must not fail the nodes."""
    await _frozen_leader(nats_server, bus, tmp_path, schedulers=1)


async def test_two_candidates_for_the_next_epoch_store_one_election(bus: Bus) -> None:
    """The compare-and-set schedulers elect with: both read the same newest election, one stores."""
    def elected(eid: str, epoch: int, sid: str) -> SchedulerElected:
        return SchedulerElected(event_id=eid, occurred_at=0.0, epoch=epoch, scheduler_id=sid)

    first = await bus.append_after(elected("a-1", 1, "a"), 0)
    with pytest.raises(NotLast) as lost:
        await bus.append_after(elected("b-1", 1, "b"), 0)
    assert lost.value.last_seq == first
    # A retry of a stored publish whose ack was lost is not a lost election: its own sequence.
    assert await bus.append_after(elected("a-1", 1, "a"), 0) == first
    second = await bus.append_after(elected("b-2", 2, "b"), first)
    with pytest.raises(NotLast):
        await bus.append_after(elected("a-2", 2, "a"), first)
    stored = [(e.scheduler_id, e.epoch) for _, e in await read_log(bus) if isinstance(e, SchedulerElected)]
    assert stored == [("a", 1), ("b", 2)] and second == first + 1
