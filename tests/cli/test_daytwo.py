"""Day-two controls through the real CLI against a real `corral up` (issue #41): update, requeue, reservations.

The cluster is this module's own (3 nodes x 2 GPUs): a reservation would change what the shared one places.
What ran where and when is checked from the log itself (the events, read here), not from the fold's code.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from events.bus import Bus
from events.server import NatsServer
from schemas import GangReserved, JobRequeued, JobSpec, JobSubmitted
from schemas.events import Checkpointed, JobUpdated, JobUpdateRequested, ReservationCreated
from tests.cli.conftest import (
    Up,
    assert_one_line_error,
    corral,
    corral_json,
    job,
    log_of,
    state_of,
    wait_state,
    worker_cmd,
)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    cluster = Up(tmp_path_factory.mktemp("daytwo") / "corral", ["--nodes", "3", "--gpus-per-node", "2"])
    cluster.start()
    try:
        yield cluster
    finally:
        assert cluster.stop() == 0


def _spec(tmp_path: Path, name: str, **fields: Any) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(job(name, **fields)))
    return str(path)


def test_update_reorders_the_queue_and_changes_time_limits(up: Up, tmp_path: Path) -> None:
    url = up.url
    # Fill the cluster (3 x 2 GPUs) for as long as it takes; a 1-hour limit to play with.
    corral("submit", _spec(tmp_path, "up-wall", ranks=3, gpus=2, steps=100_000, time_limit_s=3600), "--id", "up-wall",
           url=url)
    wait_state(url, lambda s: s.jobs["up-wall"].status == "running", 60, "the wall to run")
    corral("submit", _spec(tmp_path, "up-a", steps=10), "--id", "up-a", url=url)
    corral("submit", _spec(tmp_path, "up-b", steps=10), "--id", "up-b", url=url)
    line = [key[3] for key in state_of(url).lines.get("default", []) if key[3] in ("up-a", "up-b")]
    assert line == ["up-a", "up-b"]
    out = corral("update", "up-b", "--priority", "10", "--time-limit", "30m", url=url).stdout
    assert out.splitlines() == ["up-b: priority 0 -> 10", "up-b: time_limit_s none -> 1800"], out
    line = [key[3] for key in state_of(url).lines.get("default", []) if key[3] in ("up-a", "up-b")]
    assert line == ["up-b", "up-a"]  # its new place in line (a backfill reservation up-a holds, it keeps)
    shown = corral("job", "up-b", url=url).stdout
    assert "priority 0 -> 10, time_limit_s none -> 1800 by " in shown and "time limit" in shown, shown
    assert "updated priority 0 -> 10, time_limit_s none -> 1800" in corral("explain", "up-b", url=url).stdout
    # A running job's limit: only lower, unless an operator asks (corral up has no auth: anyone may say so).
    refused = corral("update", "up-wall", "--time-limit", "2h", url=url, check=1)
    assert "only an operator may raise its time limit" in assert_one_line_error(refused, 1)
    answer = corral_json("update", "up-wall", "--time-limit", "2h", "--operator", "--json", url=url)
    assert answer["changes"] == [{"field": "time_limit_s", "old": 3600.0, "new": 7200.0}] and answer["refused"] is None
    corral("update", "up-wall", "--time-limit", "1s", url=url)  # lower, and passed already: the wall stops
    state = wait_state(url, lambda s: all(s.jobs[j].status == "completed" for j in ("up-a", "up-b")), 90,
                       "the queued jobs to run")
    assert state.jobs["up-wall"].status == "failed" and "time limit 1s exceeded" in state.jobs["up-wall"].end_reason
    # Who asked what, old -> new, is in the log.
    answers = [e.event for e in log_of(url) if isinstance(e.event, JobUpdated) and e.event.job_id == "up-b"]
    assert [(c.field, c.old, c.new) for c in answers[0].changes] == [("priority", 0, 10), ("time_limit_s", None, 1800.0)]
    assert answers[0].requested_by and answers[0].epoch >= 1


def test_update_usage_errors(up: Up) -> None:
    url = up.url
    assert_one_line_error(corral("update", "no-such-job", "--priority", "1", url=url, check=4), 4)
    assert "nothing to update" in assert_one_line_error(corral("update", "x", url=url, check=2), 2)
    assert "bad duration" in assert_one_line_error(corral("update", "x", "--time-limit", "soon", url=url, check=2), 2)
    assert "usage: corral update" in corral("update", "--help").stdout


def test_requeue_a_running_job_keeps_its_checkpoint_and_its_restarts(up: Up, tmp_path: Path) -> None:
    url = up.url
    ckpt = tmp_path / "ckpt"
    spec = _spec(tmp_path, "rq", steps=600, checkpoint_dir=str(ckpt),
                 command=[*worker_cmd(600, 20), "--checkpoint-every", "20"])
    corral("submit", spec, "--id", "rq", url=url)
    wait_state(url, lambda s: s.jobs["rq"].checkpoint is not None, 60, "a checkpoint")
    out = corral("requeue", "rq", "--reason", "try again", url=url).stdout
    assert "requeue requested for rq (running): its workers stop, then it waits again, resuming from" in out, out
    state = wait_state(url, lambda s: s.jobs["rq"].attempt == 2 and s.jobs["rq"].status == "running", 60,
                       "the requeued job to run again")
    job2 = state.jobs["rq"]
    assert job2.restarts == 0 and job2.resume_from is not None and job2.stop is None
    log = log_of(url)
    (rq,) = [e.event for e in log if isinstance(e.event, JobRequeued) and e.event.job_id == "rq"]
    ckpts = [e.event.path for e in log if isinstance(e.event, Checkpointed) and e.event.job_id == "rq"
             and e.event.attempt == 1]
    assert rq.attempt == 2 and rq.reason.endswith(": try again") and rq.resume_from in ckpts
    assert "requeued as attempt 2: requeued by" in corral("explain", "rq", url=url).stdout
    corral("cancel", "rq", url=url)
    wait_state(url, lambda s: s.jobs["rq"].status == "cancelled", 60, "the cancel")
    # A finished job goes back to the queue at once (Slurm's requeue of a finished job).
    rows = corral_json("requeue", "rq", "--json", url=url)
    assert rows[0]["was"] == "cancelled"
    wait_state(url, lambda s: s.jobs["rq"].attempt == 3 and s.jobs["rq"].status == "running", 60, "attempt 3")
    corral("cancel", "rq", url=url)
    assert_one_line_error(corral("requeue", "nope", url=url, check=4), 4)


def _node_of(env_event: GangReserved) -> set[str]:
    return {rp.node_id for rp in env_event.ranks}


def test_a_reservation_keeps_its_nodes_free_of_other_work_over_its_window(up: Up, tmp_path: Path) -> None:
    url = up.url
    wait_state(url, lambda s: not s.active, 60, "an idle cluster")
    made = corral_json("reservation", "create", "maint", "--nodes", "node-0,node-1", "--start", "now+2s",
                       "--duration", "25s", "--users", "ops", "--reason", "firmware", "--json", url=url)
    assert made["nodes"] == ["node-0", "node-1"]
    listed = corral_json("reservation", "list", "--json", url=url)
    assert [(r["name"], r["state"], r["users"]) for r in listed] == [("maint", "upcoming", ["ops"])]
    assert "maint" in corral("reservation", "list", url=url).stdout
    # Work for everyone else: 1-GPU jobs without a limit (never on node-0/1 while the reservation stands), jobs with
    # short limits (may use them before the window only), and one of the reservation's own jobs.
    ids = [f"rs-{i}" for i in range(12)]
    for i, jid in enumerate(ids):
        extra = {"time_limit_s": 2, "steps": 50} if i % 2 else {"steps": 150}
        corral("submit", _spec(tmp_path, jid, **extra), "--id", jid, url=url)
    corral("submit", _spec(tmp_path, "rs-own", steps=100), "--id", "rs-own", "--reservation", "maint", "--user", "ops",
           url=url)
    refused = corral("submit", _spec(tmp_path, "rs-not", steps=1), "--reservation", "maint", url=url, check=2)
    assert "reservation maint is for ops" in assert_one_line_error(refused, 2)
    wait_state(url, lambda s: all(s.jobs[j].status in ("completed", "failed") for j in [*ids, "rs-own"]), 120,
               "the jobs to end")
    # An independent reading of the log: no placement of a job outside the reservation on its nodes that falls
    # inside the window or reaches into it (its own time limit, or none), and the reservation's job inside it.
    log = log_of(url)
    ((made_at, res),) = [(e.seq, e.event) for e in log if isinstance(e.event, ReservationCreated)
                         and e.event.name == "maint"]
    limits = {e.event.job_id: e.event.spec.time_limit_s for e in log if isinstance(e.event, JobSubmitted)}
    reserved_nodes = set(res.nodes)
    for env in log:
        ev = env.event
        if not isinstance(ev, GangReserved) or env.seq < made_at or not _node_of(ev) & reserved_nodes:
            continue
        t, limit = ev.occurred_at, limits[ev.job_id]
        if ev.job_id == "rs-own":
            assert res.start <= t < res.end and _node_of(ev) <= reserved_nodes
            continue
        reaches = limit is None or t + limit > res.start
        assert t >= res.end or not reaches, f"{ev.job_id} placed on {_node_of(ev)} at {t} into {res.start}..{res.end}"
    inside = [e.event.job_id for e in log if isinstance(e.event, GangReserved) and e.event.job_id in ids
              and res.start <= e.event.occurred_at < res.end]
    assert inside, "no job of others was placed during the window: the test proves nothing"
    assert any(isinstance(e.event, GangReserved) and e.event.job_id == "rs-own" for e in log)
    assert "maint" in corral("job", "rs-own", url=url).stdout
    # Over running work that may reach into the window: refused, unless --ignore-jobs.
    corral("submit", _spec(tmp_path, "rs-long", steps=100_000, gpus=2), "--id", "rs-long", url=url)
    state = wait_state(url, lambda s: s.jobs["rs-long"].status == "running", 60, "a long job")
    busy = state.jobs["rs-long"].placement[0].node_id
    over = corral("reservation", "create", "late", "--nodes", busy, "--start", "now+1h", "--duration", "1h", url=url,
                  check=1)
    assert "rs-long" in assert_one_line_error(over, 1)
    corral("reservation", "create", "late", "--nodes", busy, "--start", "now+1h", "--duration", "1h", "--ignore-jobs",
           url=url)
    picked = corral_json("reservation", "create", "two", "--count", "2", "--start", "now+1h", "--end", "now+2h",
                         "--json", url=url)
    assert len(picked["nodes"]) == 2 and busy not in picked["nodes"]  # free of work reaching the window, and of "late"
    corral("reservation", "delete", "two", url=url)
    corral("cancel", "rs-long", url=url)
    corral("reservation", "delete", "late", url=url)
    corral("reservation", "delete", "maint", url=url)
    assert corral_json("reservation", "list", "--json", url=url) == []
    assert_one_line_error(corral("reservation", "delete", "maint", url=url, check=4), 4)
    assert_one_line_error(corral("reservation", "create", "x", "--nodes", "node-9", "--duration", "1h", url=url,
                                 check=4), 4)
    assert_one_line_error(corral("reservation", "create", "x", "--count", "1", "--start", "soon", "--duration", "1h",
                                 url=url, check=2), 2)
    _ = time  # (times are read from the log, never the test's clock)


def test_update_without_a_scheduler_says_so_and_leaves_the_request_in_the_log(tmp_path: Path) -> None:
    async def submitted(url: str) -> None:
        bus = await Bus.connect(url)
        try:
            await bus.append(JobSubmitted(event_id="submit:lonely", occurred_at=1.0, job_id="lonely",
                                          spec=JobSpec(name="lonely")))
        finally:
            await bus.close()

    with NatsServer(tmp_path / "nats") as server:
        asyncio.run(submitted(server.url))
        proc = corral("update", "lonely", "--priority", "3", "--timeout", "0.5", url=server.url, check=5)
        assert "the scheduler has not answered in 0.5s" in proc.stdout
        asked = [e.event for e in log_of(server.url) if isinstance(e.event, JobUpdateRequested)]
        assert [(a.job_id, a.priority) for a in asked] == [("lonely", 3)]
        assert "asked, not answered by the scheduler yet" in corral("job", "lonely", url=server.url).stdout
