"""Durable consumers: every event applied once, in order, across SIGKILLed subscriber processes.

The subscriber is this file run as a program (`python -m tests.test_bus_durable URL FILE`):
its handler's effect is one line "seq" appended to FILE, which is also where it
reads its `last_applied` from on start, as a real projection stores its
position with its output.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from events.bus import Bus, Envelope
from events.server import NatsServer
from events.subjects import filters
from schemas import JobCompleted, JobRunning, WorkerStarted

ROOT = Path(__file__).resolve().parent.parent
T0 = 1_750_000_000.0
SUBJECTS = filters(types=["WorkerStarted", "JobCompleted"])


def started(job: str, rank: int) -> WorkerStarted:
    return WorkerStarted(event_id=f"started:{job}:{rank}", occurred_at=T0, job_id=job, attempt=1, rank=rank,
                         node_id="node-1")


def noise(job: str) -> JobRunning:  # not matched by SUBJECTS
    return JobRunning(event_id=f"running:{job}", occurred_at=T0, job_id=job, attempt=1)


SENTINEL = JobCompleted(event_id="completed:end", occurred_at=T0, job_id="end", attempt=1)


# --- the subscriber process ---------------------------------------------------------


async def subscriber(url: str, path: Path) -> None:
    lines = path.read_text().split() if path.exists() else []
    last_applied = int(lines[-1]) if lines else 0
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    finished = asyncio.Event()

    async def apply(env: Envelope) -> None:
        os.write(fd, f"{env.seq}\n".encode())  # effect and position in one write
        await asyncio.sleep(0.002)  # some work after the effect: a SIGKILL lands before the ack
        if env.event == SENTINEL:
            finished.set()

    # A finite reconnect budget: if the test's server is gone for good, exit instead of lingering.
    bus = await Bus.connect(url, max_reconnect_attempts=40)
    async with bus.durable("projector", apply, SUBJECTS, last_applied=last_applied, batch=32):
        await finished.wait()
    await bus.close()
    os.close(fd)


# --- tests ------------------------------------------------------------------------------


def spawn(url: str, path: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "tests.test_bus_durable", url, str(path)], cwd=ROOT)


def wait_for_lines(path: Path, n: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and len(path.read_text().split()) >= n):
        assert proc.poll() is None, f"subscriber exited with {proc.returncode}"
        assert time.monotonic() < deadline, f"subscriber applied fewer than {n} events in {timeout}s"
        time.sleep(0.01)


def matching_seqs(envs: list[Envelope]) -> list[int]:
    return [e.seq for e in envs if isinstance(e.event, (WorkerStarted, JobCompleted))]


async def all_envelopes(bus: Bus) -> list[Envelope]:
    return [e async for batch in bus.replay() for e in batch]


async def test_durable_resumes_after_sigkill_without_loss_or_repeats(
    nats_server: NatsServer, bus: Bus, tmp_path: Path
) -> None:
    backlog = [e for i in range(150) for e in (started(f"j{i}", 0), noise(f"j{i}"))]
    await bus.append_many(backlog)
    out = tmp_path / "applied.txt"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(first := spawn(nats_server.url, out))
        wait_for_lines(out, 40, first)
        first.send_signal(signal.SIGKILL)  # mid-backlog, most likely between an effect and its ack
        first.wait()

        procs.append(second := spawn(nats_server.url, out))
        wait_for_lines(out, 100, second)
        second.send_signal(signal.SIGKILL)
        second.wait()

        procs.append(third := spawn(nats_server.url, out))
        # Live events while it catches up, then the sentinel that lets it exit.
        await bus.append_many([started(f"live{i}", 0) for i in range(50)] + [noise("live")])
        await bus.append(SENTINEL)
        assert await asyncio.to_thread(third.wait, 60) == 0
    finally:
        for proc in procs:  # never leave a subscriber behind, whatever failed
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    applied = [int(x) for x in out.read_text().split()]
    expected = matching_seqs(await all_envelopes(bus))
    assert len(expected) == 150 + 50 + 1
    assert applied == expected  # none lost, none twice, in log order


async def test_durable_in_process_stop_and_resume(bus: Bus) -> None:
    await bus.append_many([started("a", i) for i in range(20)])
    seen: list[int] = []
    got_ten = asyncio.Event()

    async def handler(env: Envelope) -> None:
        seen.append(env.seq)
        if len(seen) == 10:
            got_ten.set()

    d = bus.durable("proj", handler, batch=4)
    async with d:
        await asyncio.wait_for(got_ten.wait(), 10)
    stopped_at = d.last_applied
    assert seen == list(range(1, stopped_at + 1))

    # Same name, no last_applied given: the server's ack floor says where to go on.
    done = asyncio.Event()

    async def handler2(env: Envelope) -> None:
        seen.append(env.seq)
        if env.seq == 25:
            done.set()

    async with bus.durable("proj", handler2, batch=4):
        await bus.append_many([started("b", i) for i in range(5)])
        await asyncio.wait_for(done.wait(), 10)
    assert seen == list(range(1, 26))


async def test_durable_handler_error_propagates_and_event_is_redelivered(bus: Bus) -> None:
    await bus.append_many([started("a", i) for i in range(3)])
    calls: list[int] = []

    def failing(env: Envelope) -> None:  # sync handlers are allowed too
        calls.append(env.seq)
        if env.seq == 2:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await asyncio.wait_for(bus.durable("p", failing).run(), 10)
    done = asyncio.Event()

    def ok(env: Envelope) -> None:
        calls.append(env.seq)
        if env.seq == 3:
            done.set()

    async with bus.durable("p", ok):
        await asyncio.wait_for(done.wait(), 10)
    assert calls == [1, 2, 2, 3]  # 2 failed, was not acked, and came back first


async def test_durable_rejects_a_bad_name(bus: Bus) -> None:
    with pytest.raises(ValueError):
        bus.durable("a.b", lambda env: None)


if __name__ == "__main__":
    asyncio.run(subscriber(sys.argv[1], Path(sys.argv[2])))
