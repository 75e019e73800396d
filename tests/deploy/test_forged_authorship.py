"""With deploy/nats authorization on, a client's and an agent's credentials author only their own types (#39).

A real nats-server on the rendered accounts. Every event type (one payload of each from the golden log, aimed at
a victim job and at node n2) is published with the client's credentials on every subject the client may publish,
and with agent n1's credentials on every subject n1 may publish. Whatever the server stores, the readers count
only events of the publisher's own types on their own subjects: no GPU fault, completion, reservation, election,
failure or order; nothing about n2 from n1. A malformed submission is answered by a JobRejected with why.
"""

from __future__ import annotations

import json
from contextlib import aclosing
from pathlib import Path
from typing import Any

import nats

from events.authorship import AUTHORS
from events.bus import Bus
from events.security import connect_options
from events.subjects import NODE_REPORT_TAGS
from orchestrator.core.decide import decide
from orchestrator.core.evolve import evolve, fold
from schemas import Unknown, tag_of
from schemas.events import REFUSED, JobRejected
from tests.deploy.launcher import password_of, passwords, secured_server

NODES = ["n1", "n2"]
GOLDEN = Path(__file__).parents[1] / "golden" / "v1_events.jsonl"
VICTIM = "j-victim"


def _samples() -> list[dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for line in GOLDEN.read_bytes().splitlines():
        try:
            p = json.loads(line)
        except ValueError:
            continue
        if isinstance(p, dict) and isinstance(p.get("type"), str) and "." not in p["type"]:
            out.setdefault(p["type"], p)
    return list(out.values())


def _aimed(p: dict[str, Any]) -> dict[str, Any]:
    q = dict(p)
    if "job_id" in q:
        q["job_id"] = VICTIM
    if "node_id" in q:
        q["node_id"] = "n2"
    if q["type"] == "SchedulerElected":
        q["epoch"] = 99
    return q


async def _publish_all(url: str, user: str, pw: str, subjects: list[str]) -> int:
    nc = await nats.connect(url, **connect_options(user=user, password=pw), allow_reconnect=False,
                            connect_timeout=5)
    js = nc.jetstream(timeout=10)
    stored = 0
    try:
        for n, p in enumerate(_samples()):
            for s in subjects:
                body = json.dumps({**_aimed(p), "event_id": f"{user}-{n}-{s}"}).encode()
                await js.publish(s, body)
                stored += 1
    finally:
        await nc.close()
    return stored


async def test_client_and_agent_credentials_author_only_their_own_types(tmp_path: Path) -> None:
    pws = passwords(NODES)
    with secured_server(tmp_path, "forged", NODES, pws) as srv:
        sched = await Bus.connect(srv.url, **connect_options(user="scheduler", password=password_of(pws, "scheduler")))
        try:
            # Every subject each may publish (tests/deploy/test_permissions.py checks the server refuses the rest).
            client_subjects = [f"corral.job.{VICTIM}.{t}" for t in AUTHORS["client"]] + ["corral.job.mine.JobSubmitted"]
            agent_subjects = [f"corral.node.n1.{t}" if t not in NODE_REPORT_TAGS else f"corral.job.{VICTIM}.{t}.n1"
                              for t in AUTHORS["agent"]]
            stored = await _publish_all(srv.url, "client", password_of(pws, "client"), client_subjects)
            stored += await _publish_all(srv.url, "agent-n1", password_of(pws, "agent-n1"), agent_subjects)
            bad = b'{"type":"JobSubmitted","event_id":"bad","occurred_at":1.0,"job_id":"bad1","spec":{"ranks":"x"}}'
            nc = await nats.connect(srv.url, **connect_options(user="client", password=password_of(pws, "client")))
            await nc.jetstream().publish("corral.job.bad1.JobSubmitted", bad)
            await nc.close()

            envs = []
            async with aclosing(sched.replay()) as batches:
                async for batch in batches:
                    envs += batch
        finally:
            await sched.close()
    assert len(envs) == stored + 1 and stored > 0
    counted = [e for e in envs if not isinstance(e.event, Unknown)]
    refused = [e for e in envs if isinstance(e.event, Unknown) and e.event.reason == REFUSED]
    assert refused, "the aimed payloads on the publishers' own subjects must be refused"
    for env in counted:
        tag = tag_of(env.event)
        role = "agent" if ".n1" in env.subject or env.subject.startswith("corral.node.") else "client"
        assert tag in AUTHORS[role], (env.subject, tag)
        assert getattr(env.event, "node_id", "n1") != "n2" or role == "client", env.subject
    state = fold(e.event for e in envs)
    assert state.epoch == 0 and not state.nodes and not state.active
    assert all(j.status == "pending" for j in state.jobs.values())  # submitted, never started nor ended
    rejected = [e for e in decide(state, 10.0, epoch=0) if isinstance(e, JobRejected) and e.job_id == "bad1"]
    assert rejected and "unreadable submission" in rejected[0].reasons[0], rejected
    evolve(state, rejected[0])
    assert "bad1" not in state.unreadable_submissions
