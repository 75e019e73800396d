"""The NATS behaviour deploy/README.md's per-queue scoping design rests on, checked on a real server.

A job subject names no queue, so NATS permissions cannot say "team vision may
submit to queue vision only". The design: each team is its own account that
imports a submission service from CORRAL; the server stamps every request
crossing the import with `Nats-Request-Info` (the caller's account and user),
replacing any such header the caller wrote; an admission service checks the
team against the spec's queue and appends JobSubmitted or JobRejected. It must
be a service, not a filter over the log: JetStream does not store the header.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import nats
from nats.aio.msg import Msg
from nats.js.api import StreamConfig

from deploy.nats.render import server
from tests.deploy.launcher import Server, free_ports

SUBMIT = "corral-submit.*"  # outside corral.>: the log is written by admission only


async def test_admission_service_learns_the_submitting_team_and_it_cannot_be_forged(tmp_path: Path) -> None:
    """A team user's request reaches CORRAL with the server's account/user stamp (a forged stamp is
    replaced), while the same header sent into the stream is not kept."""
    port, http = free_ports(2)
    auth = {
        "accounts": {
            "CORRAL": {
                "jetstream": "enabled",
                "users": [{"user": "scheduler", "password": "s"}],
                "exports": [{"service": SUBMIT}, {"service": "corral.job.*.JobSubmitted"}],
            },
            "TEAM_VISION": {
                "users": [{"user": "alice", "password": "a"}],
                "imports": [
                    # share: the stamp also names the user (without it: the account only)
                    {"service": {"account": "CORRAL", "subject": SUBMIT}, "share": True},
                    {"service": {"account": "CORRAL", "subject": "corral.job.*.JobSubmitted"}},
                ],
            },
        }
    }
    cfg = server(name="q", listen=f"127.0.0.1:{port}", http=f"127.0.0.1:{http}", store_dir=str(tmp_path), auth=auth)
    srv = Server(cfg, tmp_path / "q.conf").start().wait_healthy()
    admission = await nats.connect(srv.url, user="scheduler", password="s")
    team = await nats.connect(srv.url, user="alice", password="a")
    try:
        seen: list[dict[str, str]] = []

        async def admit(msg: Msg) -> None:
            seen.append(json.loads((msg.headers or {})["Nats-Request-Info"]))
            await msg.respond(b"ok")

        await admission.subscribe(SUBMIT, cb=admit)
        await admission.flush()
        forged = {"Nats-Request-Info": json.dumps({"acc": "CORRAL", "user": "scheduler"})}
        reply = await _request_when_served(team, "corral-submit.j1", b'{"queue": "nlp"}', forged)
        assert reply.data == b"ok"
        assert (seen[0]["acc"], seen[0]["user"]) == ("TEAM_VISION", "alice")

        # Straight into the stream instead: stored, but without any identity to check.
        js = admission.jetstream()
        await js.add_stream(StreamConfig(name="CORRAL", subjects=["corral.>"]))
        ack = await team.jetstream().publish("corral.job.j1.JobSubmitted", b"{}", headers=forged)
        stored = await js.get_msg("CORRAL", ack.seq)
        assert "Nats-Request-Info" not in (stored.headers or {})
    finally:
        await team.close()
        await admission.close()
        srv.stop()


async def _request_when_served(nc: nats.NATS, subject: str, payload: bytes, headers: dict[str, str]) -> Msg:
    """The request once the server routes it: flush() confirms the subscription in its own account, but the
    importing account learns of the responder a moment later (seen as "no responders" on a loaded machine)."""
    for _ in range(50):
        try:
            return await nc.request(subject, payload, headers=headers, timeout=3)
        except nats.errors.NoRespondersError:
            await asyncio.sleep(0.1)
    return await nc.request(subject, payload, headers=headers, timeout=3)
