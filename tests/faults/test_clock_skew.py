"""Machines whose wall clocks disagree: every time judgement is on the log's one clock (#30 point 2).

Fault (libfaketime, real processes): agent n0 runs 5 min ahead and n1 5 min
behind; scheduler "slow" (5 min behind) leads first, scheduler "fast" (5 min
ahead) stands by and takes over when "slow" is killed. Only the NATS server
(and this test) keep true time. The run:
1. under "slow": a 2-node gang crashing in every attempt (restart policy
   gang, 3 restarts: backoffs 1, 2, 4 s);
2. under "slow": a preemptible job and a job with a time limit are reserved;
3. "slow" is SIGKILLed, "fast" takes over; a high-priority job needs the
   preemptible job's node, so "fast" preempts it once --min-runtime has passed,
   and stops the limited job once its time limit has;
4. under "fast": the crashing gang again.
Checked from the exported log (`corral tail --no-follow --json`) by checkers
that import nothing of corral (clock_check, chaos_check), on the stream's
times: each backoff within 20% of its configured length on both nodes, no
time-limit stop before the limit, no preemption inside --min-runtime, every
job ends, no GPU double-booked. Before #30 the fast agent skipped the
backoffs, the slow one waited 10 min, the fast scheduler stopped the limited
job and preempted the protected one at once.
Acceptance 2 of issue #30.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import glob
import json
import subprocess
import sys
from pathlib import Path

import pytest

from events.bus import Bus
from events.follow import Follower
from events.sdk import Client
from events.server import NatsServer
from orchestrator.core.model.state import TERMINAL, ClusterState
from schemas import JobSpec
from tests.faults import chaos_check, clock_check
from tests.faults.services import agent_proc, kill, observer, scheduler_proc, stop_all, until
from tests.integration.harness import CORRAL

pytestmark = pytest.mark.slow

LIBFAKETIME = next(iter(sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")
                               + glob.glob("/usr/lib/faketime/libfaketime.so.1"))), None)
SKEW_S = 300.0
MIN_RUNTIME_S = 20.0
LIMIT_S = 30.0
CRASHING = JobSpec(name="crash", ranks=2, gpus_per_rank=8, restart_policy="gang", max_restarts=3,
                   command=("sh", "-c", "sleep 0.3; exit 3"))
LONG = ("sleep", "1000")
#: Each agent's wall clock, as libfaketime sets it.
AGENT_SKEWS = {"n0": "+5m", "n1": "-5m"}


def skewed(offset: str) -> dict[str, str]:
    """The environment that sets a process's wall clock `offset` off (its monotonic clock stays true)."""
    assert LIBFAKETIME is not None
    return {"LD_PRELOAD": LIBFAKETIME, "FAKETIME": offset, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


def test_libfaketime_skews_the_wall_clock_only() -> None:
    """What the run relies on: time.time() is 5 min off in a process under it, time.monotonic() is not."""
    if LIBFAKETIME is None:
        pytest.skip("needs libfaketime (apt-get install faketime; .ci/run installs it)")
    probe = "import time; print(time.time(), time.monotonic())"
    true = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    fake = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                          env={**skewed("+5m")}).stdout.split()
    assert float(fake[0]) - float(true[0]) == pytest.approx(SKEW_S, abs=10)
    assert float(fake[1]) - float(true[1]) == pytest.approx(0, abs=10)


@pytest.mark.skipif(LIBFAKETIME is None, reason="needs libfaketime (apt-get install faketime; .ci/run installs it)")
async def test_skewed_clocks_and_a_failover(nats_server: NatsServer, bus: Bus, tmp_path: Path) -> None:
    url = nats_server.url
    procs = [scheduler_proc(url, "slow", tmp_path, min_runtime=MIN_RUNTIME_S, env=skewed("-5m"))]
    stuck = None
    try:
        async with observer(bus) as f:
            await until(f, lambda s: s.scheduler_id == "slow", 30, "the slow scheduler to lead", alive=procs)
            procs.append(scheduler_proc(url, "fast", tmp_path, min_runtime=MIN_RUNTIME_S, env=skewed("+5m")))
            for i, offset in enumerate(AGENT_SKEWS.values()):
                (tmp_path / f"n{i}").mkdir()
                procs.append(agent_proc(url, f"n{i}", tmp_path / f"n{i}", runtime="process", gpus=8, index=i,
                                        env=skewed(offset)))
            await until(f, lambda s: len(s.nodes) == 2, 30, "two agents", alive=procs)
            client = Client(bus)
            try:
                await _scenario(f, client, procs)
            except AssertionError as e:  # judged below with everything the log shows
                stuck = str(e)
    finally:
        stop_all(procs)

    export = tmp_path / "export.jsonl"
    with export.open("wb") as out:
        done = await asyncio.to_thread(subprocess.run, [CORRAL, "--nats", url, "tail", "--no-follow", "--json"],
                                       stdout=out, stderr=subprocess.PIPE, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    records = clock_check.read_export(export)
    _assert_clocks_were_skewed(records)
    report = clock_check.check(records, min_runtime_s=MIN_RUNTIME_S, tolerance=0.2, decided=_decided(tmp_path))
    booking = chaos_check.check(clock_check.as_stored(records), [], heartbeat_timeout=60.0, heartbeat_interval=0.5,
                                final=False)
    figures = (f"backoffs (job, attempt, rank, configured, took): {report.backoffs}\n"
               f"time limits (job, limit, stopped after): {report.limits}\n"
               f"preemptions (job, attempt, after): {report.preemptions}\nended: {report.ended}")
    problems = ([f"stuck: {stuck}"] if stuck else []) + report.violations + booking.violations
    assert not problems, "\n".join(problems) + "\n" + figures
    # The run did what it is about (a checker finding nothing in a run that did nothing proves nothing).
    assert len(report.backoffs) == 12, figures  # 2 jobs x 3 restarts x 2 ranks
    assert {b[0] for b in report.backoffs} == {"crash-a", "crash-b"}, figures
    assert [j for j, *_ in report.limits] == ["limited"], figures
    assert [j for j, *_ in report.preemptions] == ["victim"], figures


async def _scenario(obs: Follower[ClusterState], client: Client, procs: list[subprocess.Popen[bytes]]) -> None:
    live = procs

    # 1. Gang restarts decided by the slow scheduler, waited out by a fast and a slow agent.
    await client.submit(CRASHING, job_id="crash-a")
    await until(obs, lambda s: s.jobs["crash-a"].status in TERMINAL, 90, "crash-a to use up its restarts", alive=live)
    # 2. Reservations made by the slow scheduler: one job with a time limit, one preemptible.
    await client.submit(JobSpec(name="limited", ranks=1, gpus_per_rank=8, command=LONG, time_limit_s=LIMIT_S,
                                preemptible=False, grace_period_s=2.0), job_id="limited")
    await client.submit(JobSpec(name="victim", ranks=1, gpus_per_rank=8, command=LONG, grace_period_s=2.0),
                        job_id="victim")
    await until(obs, lambda s: s.jobs["limited"].status == "running" and s.jobs["victim"].status == "running", 30,
                "limited and victim to run", alive=live)
    # 3. Failover to the fast scheduler, which judges the ages of what the slow one reserved.
    kill(procs[0])
    live = procs[1:]
    await until(obs, lambda s: s.scheduler_id == "fast", 30, "the fast scheduler to take over", alive=live)
    await client.submit(JobSpec(name="urgent", ranks=1, gpus_per_rank=8, command=("sleep", "3"), priority=10,
                                preemptible=False), job_id="urgent")
    await until(obs, lambda s: s.jobs["urgent"].status == "completed" and s.jobs["limited"].status in TERMINAL,
                LIMIT_S + 60, "urgent to run and limited to reach its time limit", alive=live)
    await client.cancel("victim", reason="done with it")
    await until(obs, lambda s: s.jobs["victim"].status in TERMINAL, 30, "victim to be cancelled", alive=live)
    # 4. Gang restarts decided by the fast scheduler.
    await client.submit(CRASHING, job_id="crash-b")
    await until(obs, lambda s: s.jobs["crash-b"].status in TERMINAL, 90, "crash-b to use up its restarts", alive=live)


def _assert_clocks_were_skewed(records: list[clock_check.Record]) -> None:
    """Each service's own stamps (occurred_at) are SKEW_S off the stream's time, as the fault says."""
    offsets: dict[str, list[float]] = {}
    for r in records:
        who = (r.event.get("node_id") if r.type in ("WorkerStarted", "NodeRegistered")
               else r.event.get("scheduler_id") if r.type == "SchedulerElected" else None)
        stamp = r.event.get("occurred_at")
        if isinstance(who, str) and isinstance(stamp, float):
            offsets.setdefault(who, []).append(stamp - r.time)
    expected = {"n0": SKEW_S, "n1": -SKEW_S, "slow": -SKEW_S, "fast": SKEW_S}
    for who, skew in expected.items():
        seen = offsets.get(who, [])
        assert seen and all(abs(o - skew) < 10 for o in seen), f"{who}: clock offsets {seen[:5]}, expected {skew}"


def _decided(tmp_path: Path) -> dict[tuple[str, int, int], float]:
    """(job, attempt, rank) -> when its agent set out to start the worker: its `worker_starting` log line's
    time, less the skew libfaketime gave that agent (exact: a fixed offset), so on this machine's true clock."""
    out: dict[tuple[str, int, int], float] = {}
    for node, offset in AGENT_SKEWS.items():
        skew = float(offset[:-1]) * 60
        for line in (tmp_path / node / f"agent-{node}.log").read_text(errors="replace").splitlines():
            if '"worker_starting"' not in line:
                continue
            with contextlib.suppress(ValueError, KeyError):
                rec = json.loads(line)
                at = dt.datetime.fromisoformat(rec["timestamp"].replace("Z", "+00:00")).timestamp() - skew
                out.setdefault((rec["job_id"], int(rec["attempt"]), int(rec["rank"])), at)
    return out
