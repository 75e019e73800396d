"""Ctrl-C on `corral up` stops its jobs gracefully, and the next `corral up` resumes them (issue #41).

As a user would: a real `corral up` subprocess (process runtime) runs a checkpointing job; once it has
checkpointed, SIGINT stops `corral up`; a second `corral up` on the same data dir resumes the job from
the checkpoint its worker saved on the way down, its restart count unchanged. What the CLI says is
checked against the log read on its own, with plain nats-py and json (no corral decoder, no fold).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import nats

from tests.cli.conftest import Up, _with_bus, corral, corral_json, job, statuses, submit, wait_state

STEPS = 300


async def _raw_log(url: str) -> list[tuple[str, dict[str, Any]]]:
    """(subject, payload) of every message in the CORRAL stream, in order: nats-py and json only."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        info = await js.stream_info("CORRAL")
        out = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await js.get_msg("CORRAL", seq)
            out.append((msg.subject, json.loads(msg.data)))
        return out
    finally:
        await nc.close()


def _of(log: list[tuple[str, dict[str, Any]]], kind: str, job_id: str) -> list[dict[str, Any]]:
    return [e for _, e in log if e.get("type") == kind and e.get("job_id") == job_id]


def test_ctrl_c_checkpoints_the_job_and_the_next_up_resumes_it_with_restarts_unspent(tmp_path: Path) -> None:
    up = Up(tmp_path / "corral", ["--nodes", "1", "--gpus-per-node", "1"])
    up.start()
    jid = "gs-1"
    try:
        from events.sdk import Client

        asyncio.run(_with_bus(up.url, lambda bus: Client(bus).define_queue("default")))
        spec = job(jid, steps=STEPS, max_restarts=1)
        spec["command"] = [*spec["command"][:-1], "40", "--checkpoint-every", "20"]  # 40 ms a step: 12 s
        submit(up.url, {jid: spec})
        state = wait_state(up.url, lambda s: (c := s.jobs[jid].checkpoint) is not None and c.step > 0, 60,
                           "a periodic checkpoint")
        periodic = state.jobs[jid].checkpoint
        assert periodic is not None and state.jobs[jid].restarts == 0
    finally:
        rc = up.stop()  # SIGINT, as Ctrl-C
    assert rc == 0, "".join(up.lines[-20:])
    said = "".join(up.lines)
    assert "stopping: jobs checkpoint and stop" in said and "stopped 1 worker for the shutdown" in said, said

    up.start()  # the same data dir
    try:
        state = wait_state(up.url, lambda s: statuses(s, [jid]) == ["completed"], 90, "the resumed job to finish")
        shown = corral_json("job", jid, url=up.url)
        story = corral("explain", jid, url=up.url).stdout
        log = asyncio.run(_raw_log(up.url))
    finally:
        assert up.stop() == 0, "".join(up.lines[-20:])

    # The log, read on its own: the worker saved a checkpoint when asked, its exit says "shutdown", and the
    # gang was requeued (not restarted) from that checkpoint; no restart was spent, no rank restarted.
    saved = _of(log, "Checkpointed", jid)
    on_the_way_down = max((c for c in saved if c["attempt"] == 1), key=lambda c: c["step"])
    assert on_the_way_down["step"] >= periodic.step > 0
    (exited,) = [e for e in _of(log, "WorkerExited", jid) if e["attempt"] == 1]
    assert exited["reason"] == "shutdown" and exited["exit_code"] == 0 and not exited["will_restart"], exited
    assert exited["restarts"] == 0 and not exited.get("checkpoint_error"), exited
    (requeued,) = _of(log, "JobRequeued", jid)
    assert requeued["attempt"] == 2 and requeued["reason"].startswith("shutdown:"), requeued
    assert requeued["resume_from"] == on_the_way_down["path"]
    assert not _of(log, "GangRestarted", jid) and not _of(log, "JobFailed", jid)
    assert [e["restarts"] for e in _of(log, "WorkerStarted", jid)] == [0, 0]

    # The CLI says the same, and the worker of attempt 2 resumed at that step and got the right answer.
    assert shown["status"] == "completed" and shown["attempt"] == 2 and shown["restarts"] == 0, shown
    assert shown["resume_from"] == on_the_way_down["path"], shown
    assert "shutdown: node node-0 stopped its workers" in story, story
    (out,) = (up.data_dir / "agents" / "node-0" / "logs").glob(f"*{jid}*a2*")
    text = out.read_text()
    assert f"resumed at step {on_the_way_down['step']} from {on_the_way_down['path']}" in text, text
    assert f"done at step {STEPS} value {sum(range(STEPS))}" in text, text
