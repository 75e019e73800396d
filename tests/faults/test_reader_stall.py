"""A following reader stopped for twice its watchdog gets every event appended meanwhile, once, in order.

Fault: a `corral scheduler`, a `corral agent` or a `corral tail --json`
process is SIGSTOPped for 13 s (its read watchdog fires after three silent
2 s heartbeats: 6 s) while the test appends 30 events in three bursts, then
SIGCONTed. On a real cluster: a VM freeze, CPU throttling, a long GC pause.
When it resumes, the pull request it left open has already delivered the
events into its socket and its watchdog has expired, both in the same loop
turn. Before #19 the reader buffered those messages, moved its resume
position past them, and then threw the buffer away when it re-created its
consumer: all 30 were lost (the stream held them).
Check: the process folds (prints) exactly the stream's sequences 1..last,
each once, in order: for the services, `corral_events_read` summed over
types equals the stream's last sequence and so does `corral_log_position`
(a fold counts an event only when its seq is above the last one folded, so
count == last and position == last means every seq once, ascending); for
`tail --json`, the printed seqs are 1..last exactly.
Invariant: DESIGN.md 6, "a reader delivers every event to its fold exactly
once, in order, across stalls ... it never skips".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from events.bus import Bus
from events.server import NatsServer
from schemas import JobSpec, JobSubmitted, NodeCordoned, NodeUncordoned
from schemas.events import Event
from tests.faults.services import Proc, agent_proc, scheduler_proc, stop_all
from tests.integration.harness import CORRAL, log_tail

pytestmark = pytest.mark.slow

#: Twice the reader's watchdog (3 x 2 s idle heartbeats), plus a margin.
STALL_S = 13.0
BURSTS = 3
PER_BURST = 10
DEADLINE_S = 90.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _submitted(tag: str, i: int) -> JobSubmitted:
    """A job nobody can place (no agent has GPUs for it, or no scheduler runs): it only adds a position."""
    return JobSubmitted(event_id=f"{tag}-{i}", occurred_at=0.0, job_id=f"{tag}-{i}",
                        spec=JobSpec(name=f"{tag}-{i}", ranks=1, gpus_per_rank=1, command=("true",)))


def _cordons(node: str) -> Callable[[str, int], Event]:
    """Events in `node`'s slice (its own facts), every third one another job's submission that is not."""
    def make(tag: str, i: int) -> Event:
        if i % 3 == 2:
            return _submitted(tag, i)
        if i % 3 == 0:
            return NodeCordoned(event_id=f"{tag}-{i}", occurred_at=0.0, node_id=node, reason="stall test")
        return NodeUncordoned(event_id=f"{tag}-{i}", occurred_at=0.0, node_id=node)
    return make


async def _append_while_stopped(bus: Bus, proc: Proc, tag: str,
                                make: Callable[[str, int], Event] = _submitted) -> int:
    """SIGSTOP `proc`, append BURSTS x PER_BURST events spread over STALL_S, SIGCONT; how many were appended."""
    assert proc.poll() is None, f"{proc.args!r} died before the stall:\n{log_tail(proc)}"
    os.kill(proc.pid, signal.SIGSTOP)
    n = 0
    try:
        for _ in range(BURSTS):
            for _ in range(PER_BURST):
                await bus.append(make(tag, n))
                n += 1
            await asyncio.sleep(STALL_S / BURSTS)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    return n


@contextlib.contextmanager
def _metrics_env(port: int) -> Iterator[None]:
    """`corral scheduler`/`agent` read CORRAL_METRICS_PORT as --metrics-port's default (start_corral passes the env)."""
    old = os.environ.get("CORRAL_METRICS_PORT")
    os.environ["CORRAL_METRICS_PORT"] = str(port)
    try:
        yield
    finally:
        if old is None:
            del os.environ["CORRAL_METRICS_PORT"]
        else:
            os.environ["CORRAL_METRICS_PORT"] = old


def _scrape(port: int, service: str) -> tuple[int, int | None] | None:
    """(events folded by `service`, log position of its state) from its metrics; None while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    read = 0
    position: int | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "corral_events_read_total" and sample.labels.get("service") == service:
                read += int(sample.value)
            elif sample.name == "corral_log_position":
                position = int(sample.value)
    return read, position


async def _whole_log(bus: Bus) -> tuple[int, int]:
    last = await bus.last_seq()
    return last, last


def _slice_of(node: str) -> Callable[[Bus], Awaitable[tuple[int, int]]]:
    """How many events an agent of `node` reads and the last one's position: its subjects (#40), counted here."""
    async def count(bus: Bus) -> tuple[int, int]:
        n = last = 0
        subjects = [f"corral.node.{node}.>", f"corral.job.*.*.{node}", "corral.sched.>"]
        async for batch in bus.replay(1, subjects=subjects):
            n, last = n + len(batch), batch[-1].seq
        return n, last
    return count


async def _folded_exactly(bus: Bus, proc: Proc, port: int, service: str, what: str,
                          expect: Callable[[Bus], Awaitable[tuple[int, int]]] = _whole_log,
                          ) -> tuple[int, int | None, int]:
    """Wait until the service's fold count and position both equal what it reads of the stream (`expect`: the
    count and the last position); the last figures seen."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    seen: tuple[int, int | None] | None = None
    last = -1
    while loop.time() < deadline:
        assert proc.poll() is None, f"{what} died (rc={proc.returncode}):\n{log_tail(proc)}"
        count, last = await expect(bus)
        seen = await asyncio.to_thread(_scrape, port, service)
        if seen is not None and seen == (count, last) and await expect(bus) == (count, last):
            return seen[0], seen[1], last
        await asyncio.sleep(0.5)
    raise AssertionError(f"{what}: after {DEADLINE_S}s it folded {seen and seen[0]} events up to position "
                         f"{seen and seen[1]}, it should read {count} up to {last}: events were skipped or repeated")


async def _until_started(bus: Bus, port: int, service: str, proc: Proc, what: str) -> None:
    """Until the service answers on its metrics port and has folded as many events as the log holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while loop.time() < deadline:
        assert proc.poll() is None, f"{what} died (rc={proc.returncode}):\n{log_tail(proc)}"
        seen = await asyncio.to_thread(_scrape, port, service)
        if seen is not None and seen[0] >= 1 and seen[0] == await bus.last_seq():
            return
        await asyncio.sleep(0.25)
    raise AssertionError(f"{what} did not start folding within {DEADLINE_S}s:\n{log_tail(proc)}")


async def test_stopped_scheduler_folds_every_event(nats_server: NatsServer, bus: Bus, tmp_path: Path) -> None:
    port = _free_port()
    with _metrics_env(port):
        proc = scheduler_proc(nats_server.url, "s1", tmp_path)
    try:
        await _until_started(bus, port, "scheduler", proc, "the scheduler")
        appended = await _append_while_stopped(bus, proc, "sched")
        read, position, last = await _folded_exactly(bus, proc, port, "scheduler", "the scheduler")
    finally:
        stop_all([proc])
    assert appended == BURSTS * PER_BURST
    assert read == position == last


async def test_stopped_agent_folds_every_event(nats_server: NatsServer, bus: Bus, tmp_path: Path) -> None:
    port = _free_port()
    with _metrics_env(port):
        proc = agent_proc(nats_server.url, "n0", tmp_path)
    try:
        # The agent's first append is its NodeRegistered: it folds from then on.
        await _until_started(bus, port, "agent/n0", proc, "the agent")
        appended = await _append_while_stopped(bus, proc, "agent", _cordons("n0"))
        count, _ = await _slice_of("n0")(bus)
        read, position, last = await _folded_exactly(bus, proc, port, "agent/n0", "the agent", _slice_of("n0"))
    finally:
        stop_all([proc])
    assert appended == BURSTS * PER_BURST
    assert read == count and position == last  # its slice only (#40): every event of it, none twice


def _printed_seqs(path: Path) -> list[int]:
    seqs = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            seqs.append(int(json.loads(line)["seq"]))
    return seqs


async def _until_printed(path: Path, seq: int, proc: Proc, what: str) -> list[int]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while loop.time() < deadline:
        seqs = _printed_seqs(path)
        if seq in seqs:
            return seqs
        assert proc.poll() is None, f"{what} died (rc={proc.returncode}), printed {seqs}"
        await asyncio.sleep(0.25)
    raise AssertionError(f"{what}: seq {seq} not printed within {DEADLINE_S}s; printed {_printed_seqs(path)}")


@pytest.mark.parametrize("filters", [(), ("--type", "JobSubmitted")], ids=["whole-log", "filtered"])
async def test_stopped_tail_prints_every_event(nats_server: NatsServer, bus: Bus, tmp_path: Path,
                                               filters: tuple[str, ...]) -> None:
    """Filtered, `tail` cannot check positions for gaps (it skips other types): only the reader keeps it exact."""
    out = tmp_path / "tail.jsonl"
    first = await bus.append(_submitted("first", 0))
    with open(out, "wb") as stdout, open(tmp_path / "tail.err", "wb") as stderr:
        proc = subprocess.Popen([CORRAL, "--nats", nats_server.url, "tail", "--json", "--from-seq", "1", *filters],
                                stdout=stdout, stderr=stderr)
    try:
        await _until_printed(out, first, proc, "corral tail")
        appended = await _append_while_stopped(bus, proc, "tail")
        # Appended after the stall: once it is printed, everything before it must have been.
        sentinel = await bus.append(_submitted("sentinel", 0))
        seqs = await _until_printed(out, sentinel, proc, "corral tail")
    finally:
        stop_all([proc])
    assert appended == BURSTS * PER_BURST
    assert seqs == list(range(1, sentinel + 1)), f"tail printed {seqs}, the stream holds 1..{sentinel}"
