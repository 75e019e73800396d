"""Stop `corral up` mid-workload (Ctrl-C, --keep-workers) and start it again on the same data dir:
every job finishes, none is lost, none runs twice."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

from events.sdk import Client
from schemas import JobSubmitted, NodeRegistered, WorkerExited, WorkerStarted
from tests.cli.conftest import Up, _with_bus, corral_json, job, log_of, statuses, submit, wait_state


def test_restart_mid_workload_loses_nothing_and_runs_nothing_twice(tmp_path: Path) -> None:
    up = Up(tmp_path / "corral", ["--nodes", "2", "--gpus-per-node", "2", "--keep-workers", "--min-runtime", "1"])
    up.start()
    ids = [f"rs-{i}" for i in range(6)]
    try:
        asyncio.run(_with_bus(up.url, lambda bus: Client(bus).define_queue("default")))
        # 15 s each; 4 GPUs: two waves. The first wave must outlive the restart below (stop, a new
        # process, nats-server, catch-up): at 5 s each, a loaded 2-core machine finished all four
        # while `corral up` was down, and their exits were told before the nodes registered again.
        submit(up.url, {i: job(i, steps=1500) for i in ids})
        wait_state(up.url, lambda s: statuses(s, ids).count("running") == 4, 40, "the first wave")
    finally:
        assert up.stop() == 0, "".join(up.lines[-20:])

    up.start()  # same data dir: the log, the workers (adopted), the checkpoints
    try:
        state = wait_state(up.url, lambda s: statuses(s, ids) == ["completed"] * 6, 90, "every job to finish")
        log = log_of(up.url)
        summary = corral_json("jobs", "--all", url=up.url)
    finally:
        assert up.stop() == 0, "".join(up.lines[-20:])

    # None lost: each submitted once, each completed, and the CLI agrees.
    assert Counter(e.event.job_id for e in log if isinstance(e.event, JobSubmitted)) == dict.fromkeys(ids, 1)
    assert {j["job_id"]: j["status"] for j in summary["jobs"]} == dict.fromkeys(ids, "completed")
    # None run twice: one WorkerStarted per worker identity in the log ...
    starts = Counter((e.event.job_id, e.event.attempt, e.event.rank, e.event.restarts)
                     for e in log if isinstance(e.event, WorkerStarted))
    assert starts and max(starts.values()) == 1, starts
    # ... and one process per worker identity on the nodes (each appends to its own log file).
    logs = sorted((up.data_dir / "agents").glob("*/logs/*.log"))
    assert len(logs) == sum(starts.values()), logs
    for path in logs:
        assert path.read_text().count("rank env:") == 1, path
    assert all(state.jobs[i].attempt == 1 or state.jobs[i].resume_from for i in ids)
    # Some worker ran across the restart: started before its node registered again, exited after.
    again = {e.event.node_id: e.seq for e in log if isinstance(e.event, NodeRegistered)}  # the last one wins
    started = {(e.event.job_id, e.event.attempt): e.seq for e in log if isinstance(e.event, WorkerStarted)}
    exited = {(e.event.job_id, e.event.attempt): (e.seq, e.event.node_id) for e in log
              if isinstance(e.event, WorkerExited)}
    assert any(started[k] < again[node] < seq for k, (seq, node) in exited.items()), "no worker was adopted"
