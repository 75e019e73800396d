"""A forged election never stops scheduling silently, and a scheduler that cannot lead says so on /readyz.

Fault (issue #30 point 5): on a server without auth anyone may append; one `SchedulerElected` with
epoch 2^64-1 (an epoch no live scheduler holds, that does not follow the newest) is published raw
while a leader runs, then the leader is SIGKILLed so the standby must elect past it. Check, with
real `corral scheduler` / `corral agent` processes: every job submitted after it completes, under
the leader of the time and under the standby that took over with the epoch after the newest valid
one; the refusal is named loudly by both schedulers (an `election_refused` error line naming the
epoch, `corral_elections_refused_total` on /metrics); a scheduler that can lead stays ready.
Second fault: a scheduler whose own election cannot be stored (the stream full, discard new) is
not ready, and /readyz says why, until its election is stored.

The outcomes are read from the raw stream as JSON (no corral decoder, no fold).
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from events.bus import Bus
from events.sdk import Client
from events.server import NatsServer
from schemas import JobSpec
from tests.faults.services import Proc, agent_proc, kill, observer, stop_all, until
from tests.faults.test_stream_full import set_limits
from tests.integration.harness import log_tail, start_corral

pytestmark = pytest.mark.slow

FORGED_EPOCH = 2**64 - 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scheduler(url: str, sid: str, logs: Path, port: int) -> Proc:
    return start_corral("--nats", url, "scheduler", "--id", sid, "--lease-ttl", "1.5", "--tick", "0.2",
                        "--heartbeat-timeout", "60", "--metrics-port", str(port), "--metrics-host", "127.0.0.1",
                        "--log-level", "warning", log=logs / f"{sid}.log")  # fmt: skip


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


async def _http(url: str) -> tuple[int, str]:
    return await asyncio.to_thread(_get, url)


async def _raw_log(bus: Bus) -> list[dict[str, object]]:
    """Every stored message as plain JSON, in order."""
    info = await bus.js.stream_info(bus.stream)
    out = []
    for seq in range(1, info.state.last_seq + 1):
        msg = await bus.js.get_msg(bus.stream, seq)
        out.append(json.loads(msg.data or b"{}"))
    return out


def _refusals(log: Path) -> list[dict[str, object]]:
    """The `election_refused` lines of a service's JSON log."""
    lines = []
    for line in log.read_text(errors="replace").splitlines():
        if '"election_refused"' in line:
            lines.append(json.loads(line))
    return lines


def _refused_counter(metrics: str) -> float:
    m = re.search(r"^corral_elections_refused_total (\S+)$", metrics, re.M)
    assert m is not None, "no corral_elections_refused_total on /metrics"
    return float(m.group(1))


async def test_a_forged_election_is_refused_loudly_and_scheduling_goes_on(
        nats_server: NatsServer, bus: Bus, tmp_path: Path) -> None:
    url = nats_server.url
    ports = {"s1": _free_port(), "s2": _free_port()}
    scheds = {sid: _scheduler(url, sid, tmp_path, port) for sid, port in ports.items()}
    (tmp_path / "n0").mkdir()
    agent = agent_proc(url, "n0", tmp_path / "n0", gpus=4)
    everyone = [*scheds.values(), agent]
    client = Client(bus, user="test")
    ids: list[str] = []

    async def run_jobs(prefix: str, n: int, f) -> None:  # type: ignore[no-untyped-def]
        batch = [f"{prefix}{i}" for i in range(n)]
        for job in batch:
            await client.submit(JobSpec(name=job, ranks=1, gpus_per_rank=1 + len(ids) % 2, command=("sleep", "0.2")),
                                job_id=job)
            ids.append(job)
        await until(f, lambda s: all(s.jobs[j].status == "completed" for j in batch), 90,
                    f"the {prefix} jobs to complete", alive=[p for p in everyone if p.poll() is None])

    try:
        async with observer(bus) as f:
            await until(f, lambda s: s.epoch >= 1 and len(s.nodes) == 1, 90, "a leader and the node", alive=everyone)
            await run_jobs("before", 2, f)
            leader = f.state.scheduler_id
            # Raw, as anyone on an open server could: no corral code builds it.
            forged = {"type": "SchedulerElected", "event_id": "forged-election", "occurred_at": time.time(),
                      "epoch": FORGED_EPOCH, "scheduler_id": "intruder"}
            await bus.js.publish("corral.sched.SchedulerElected", json.dumps(forged).encode())
            await run_jobs("after", 5, f)

            status, body = await _http(f"http://127.0.0.1:{ports[leader]}/readyz")
            assert (status, body) == (200, "ready\n"), "a leader that can lead must stay ready"
            _, metrics = await _http(f"http://127.0.0.1:{ports[leader]}/metrics")
            assert _refused_counter(metrics) == 1.0

            # The leader dies: the standby must elect past the forged epoch and schedule.
            kill(scheds[leader])
            standby = next(sid for sid in scheds if sid != leader)
            everyone.remove(scheds[leader])
            await until(f, lambda s: s.scheduler_id == standby, 90, "the standby to lead", alive=everyone)
            await run_jobs("failover", 5, f)
            status, body = await _http(f"http://127.0.0.1:{ports[standby]}/readyz")
            assert (status, body) == (200, "ready\n")
            _, metrics = await _http(f"http://127.0.0.1:{ports[standby]}/metrics")
            assert _refused_counter(metrics) == 1.0
    finally:
        stop_all(everyone)

    # Independent check on the raw log: every job completed once; elections are 1, 2, ... apart
    # from the forged one, and the standby's follows the newest valid one, not the forged one.
    log = await _raw_log(bus)
    completed = [str(e["job_id"]) for e in log if e.get("type") == "JobCompleted"]
    assert sorted(completed) == sorted(ids), f"jobs not completed once: {sorted(set(ids) ^ set(completed))}"
    elections = [(e["epoch"], e["scheduler_id"]) for e in log if e.get("type") == "SchedulerElected"]
    valid = [el for el in elections if el[1] != "intruder"]
    assert [epoch for epoch, _ in valid] == list(range(1, len(valid) + 1)), elections
    assert valid[-1][1] == standby and (FORGED_EPOCH, "intruder") in elections
    # Named loudly, by both: the epoch and who claimed it.
    for sid in scheds:
        lines = _refusals(tmp_path / f"{sid}.log")
        assert [(r["epoch"], r["scheduler_id"], r["level"]) for r in lines] == [(FORGED_EPOCH, "intruder", "error")], (
            f"{sid} did not name the forged election once:\n{log_tail(scheds[sid])}")


async def test_a_scheduler_that_cannot_store_its_election_is_not_ready(
        nats_server: NatsServer, bus: Bus, tmp_path: Path) -> None:
    await Client(bus, user="test").submit(JobSpec(name="x", ranks=1, gpus_per_rank=1, command=("true",)), job_id="x")
    await set_limits(bus, max_msgs=1)  # full: the election cannot be appended
    port = _free_port()
    proc = _scheduler(nats_server.url, "s1", tmp_path, port)
    readyz = f"http://127.0.0.1:{port}/readyz"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, f"the scheduler exited {proc.returncode}:\n{log_tail(proc)}"
            assert time.monotonic() < deadline, f"never said it cannot lead:\n{log_tail(proc)}"
            try:
                status, body = await _http(readyz)
            except OSError:
                status, body = 0, ""  # not serving yet
            if "cannot lead" in body:
                break
            await asyncio.sleep(0.2)
        assert status == 503 and "scheduler: cannot lead" in body and "maximum messages exceeded" in body, body

        await set_limits(bus, max_msgs=-1)
        deadline = time.monotonic() + 90
        while (answer := await _http(readyz)) != (200, "ready\n"):
            assert time.monotonic() < deadline, f"not ready after the log had room: {answer}\n{log_tail(proc)}"
            await asyncio.sleep(0.2)
    finally:
        stop_all([proc])
    elections = [e for e in await _raw_log(bus) if e.get("type") == "SchedulerElected"]
    assert [(e["epoch"], e["scheduler_id"]) for e in elections] == [(1, "s1")]
