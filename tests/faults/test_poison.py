"""Poison: one malformed message per kind on every subject a client or an admin may write (#19, acceptance 3).

Before decoding was total, a JobSubmitted with one invalid UTF-8 byte inside a
string, published by the least-privileged `client` user, made every reader
(scheduler, agents, `corral tail`) exit 1, and a restarted scheduler died on
the same message again. Here, under deploy/nats's per-role auth, real
`corral scheduler`, two `corral agent` and a `corral tail --json` process run
while `client` and `admin` publish, on each subject their permissions allow,
one message of each kind: invalid UTF-8, truncated JSON, ~1 MB of random bytes
(as large as the server accepts), an unknown type, fields of the wrong types.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.js import JetStreamContext

from deploy.nats.permissions import APPENDS
from events.bus import Bus
from events.security import connect_options
from schemas import JobSpec, JobSubmitted, encode
from tests.deploy.launcher import Server, free_ports, login_args, password_of, passwords, secured_server
from tests.faults.services import observer, stop_all, until
from tests.integration.harness import CORRAL, log_tail, start_corral

NODES = ["n1", "n2"]
PASSWORDS = passwords(NODES)
#: Entity of each tag the `client` and `admin` roles may append.
_ENTITY = {"JobSubmitted": "job", "CancelRequested": "job", "QueueDefined": "queue", "QueueDeleted": "queue",
           "NodeCordoned": "node", "NodeUncordoned": "node", "JobHeld": "job", "JobReleased": "job",
           "GpuUnhealthy": "node", "GpuHealthy": "node", "JobUpdateRequested": "job", "RequeueRequested": "job",
           "JobUpdateByOperator": "job", "ReservationCreated": "sched", "ReservationDeleted": "sched",
           "DatasetEvictRequested": "node"}
#: What each role may append, from the permissions themselves (deploy/nats/permissions.py), so a tag given to
#: `client` or `admin` later is poisoned too; `admin` publishes only what `client` may not.
SUBJECTS = {role: [f"corral.sched.{tag}" if _ENTITY[tag] == "sched" else f"corral.{_ENTITY[tag]}.p-{{i}}.{tag}"
                   for tag in APPENDS[role]] for role in ("client", "admin")}
KINDS = ("invalid_utf8", "truncated", "garbage", "unknown_type", "wrong_types")
POISONED = sum(len(subjects) for subjects in SUBJECTS.values()) * len(KINDS)
GARBAGE_BYTES = 1_000_000


def _password(user: str) -> str:
    return password_of(PASSWORDS, user)


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[Server]:
    with secured_server(tmp_path, "poison", NODES, PASSWORDS) as srv:
        yield srv


def _login(srv: Server, user: str, d: Path) -> list[str]:
    return login_args(srv, user, _password(user), d / "secrets")


async def _js(srv: Server, user: str) -> tuple[nats.NATS, JetStreamContext]:
    nc = await nats.connect(srv.url, **connect_options(user=user, password=_password(user)), allow_reconnect=False)
    return nc, nc.jetstream(timeout=10)


def poison(kind: str, subject: str, rng: random.Random, max_payload: int) -> bytes:
    """One malformed message of `kind` for the event type `subject` names."""
    tag = subject.rsplit(".", 1)[1]
    entity = subject.split(".")[2]
    base = {"type": tag, "event_id": f"poison:{kind}:{entity}:{tag}", "occurred_at": 1.0, "job_id": entity,
            "node_id": entity, "queue": entity, "spec": {"name": "poison", "command": ["sleep", "0.1"]}}
    good = json.dumps(base).encode()
    if kind == "invalid_utf8":  # the byte that stopped every reader: inside a string of a well-formed event
        return good.replace(b'"poison:', b'"poison\xff:', 1)
    if kind == "truncated":
        return good[: len(good) // 2]
    if kind == "garbage":
        return rng.randbytes(min(GARBAGE_BYTES, max_payload - 4096))
    if kind == "unknown_type":
        return json.dumps({**base, "type": "JobTeleported\n\x1b[2Jfake line"}).encode()
    return json.dumps({**base, "event_id": 5, "occurred_at": "yesterday", "job_id": ["x"], "node_id": {"a": 1},
                       "queue": 7, "spec": "nope", "weight": "heavy"}).encode()


def _submit(i: int) -> tuple[str, bytes]:
    job_id = f"after-{i}"
    spec = JobSpec(name=job_id, ranks=1, gpus_per_rank=1, command=("sleep", "0.1"))
    return f"corral.job.{job_id}.JobSubmitted", encode(
        JobSubmitted(event_id=f"submit:{job_id}", occurred_at=time.time(), job_id=job_id, spec=spec))


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return str(r.read().decode())


def _unreadable_count(text: str) -> float:
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
               if ln.startswith("corral_unreadable_events_total{") and 'service="scheduler"' in ln)


@pytest.mark.slow
@pytest.mark.timeout(400)
async def test_poison_messages_stop_no_reader(secured: Server, tmp_path: Path) -> None:
    """Fault: POISONED malformed messages (5 kinds x the subjects `client` and `admin` may write), each
    published by the least-privileged role allowed to, while the services run.
    Check: the scheduler, both agents and a `corral tail --json` keep running; the next 20 jobs
    complete; the scheduler counts them all in `corral_unreadable_events_total`;
    `corral tail --json` printed one valid JSON record of type Unknown per poison message, and a
    `corral tail --no-follow` prints exactly one 'unreadable at position N: why' line for each, at
    its position."""
    srv, rng = secured, random.Random(1919)
    metrics_port = free_ports(1)[0]
    sched = start_corral(*_login(srv, "scheduler", tmp_path), "scheduler", "--id", "s1", "--lease-ttl", "2",
                         "--tick", "0.2", "--metrics-port", str(metrics_port), "--log-level", "info",
                         log=tmp_path / "scheduler.log")
    procs = [sched]
    tail_out = tmp_path / "tail.ndjson"
    bus = None
    try:
        bus = await Bus.connect(srv.url, name="test", **connect_options(user="scheduler",
                                                                        password=_password("scheduler")))
        async with observer(bus) as seen:
            await until(seen, lambda s: s.epoch >= 1, 90, "the scheduler's election", alive=procs)
            for i, node in enumerate(NODES):
                procs.append(start_corral(
                    *_login(srv, f"agent-{node}", tmp_path), "agent", "--node-id", node, "--runtime", "simulated",
                    "--fake-gpus", "4", "--labels", f"block=b0,leaf=l{i}", "--data-dir", str(tmp_path / node),
                    "--address", "127.0.0.1", "--heartbeat", "0.5", "--log-level", "info",
                    log=tmp_path / f"agent-{node}.log"))
            with tail_out.open("wb") as out, (tmp_path / "tail.log").open("wb") as err:
                tail = subprocess.Popen([CORRAL, *_login(srv, "ops", tmp_path), "tail", "--json"], stdout=out,
                                        stderr=err)
            procs.append(tail)
            await until(seen, lambda s: set(NODES) <= set(s.nodes), 90, "both agents registered", alive=procs)
            await asyncio.sleep(2.0)  # the tail has subscribed: it starts at "now"

            poison_seqs: dict[int, str] = {}
            for role, subjects in SUBJECTS.items():
                nc, js = await _js(srv, role)
                try:
                    for i, pattern in enumerate(subjects):
                        for kind in KINDS:
                            subject = pattern.format(i=f"{role}{i}{kind.replace('_', '')}")
                            data = poison(kind, subject, rng, nc.max_payload)
                            ack = await js.publish(subject, data)
                            poison_seqs[ack.seq] = f"{role} {kind} {subject}"
                    if nc.max_payload < GARBAGE_BYTES:  # then the server refuses 1 MB: the largest accepted was sent
                        with pytest.raises(nats.errors.MaxPayloadError):
                            await js.publish(subjects[0].format(i="big"), rng.randbytes(GARBAGE_BYTES))
                finally:
                    await nc.close()
            assert len(poison_seqs) == POISONED

            nc, js = await _js(srv, "client")
            try:
                for i in range(20):
                    await js.publish(*_submit(i))
            finally:
                await nc.close()
            after = [f"after-{i}" for i in range(20)]
            await until(seen, lambda s: all(s.jobs.get(j) is not None and s.jobs[j].status == "completed"
                                            for j in after), 180, "the 20 jobs after the poison to complete",
                        alive=procs)
            await asyncio.sleep(1.0)
            alive = {name: p.poll() is None for name, p in zip(["scheduler", *NODES, "tail"], procs, strict=True)}
            counted = _unreadable_count(await asyncio.to_thread(_scrape, metrics_port))
    finally:
        if bus is not None:
            await bus.close()
        codes = stop_all(procs)
    assert all(alive.values()), f"a reader died of poison: {alive}\n" + "\n".join(
        log_tail(p) for p in procs[:3] if p.poll() not in (None, 0))
    assert codes[0] == 0, log_tail(sched)
    assert counted == len(poison_seqs), f"the scheduler counted {counted} unreadable messages"

    records = [json.loads(ln) for ln in tail_out.read_bytes().splitlines() if ln.strip()]  # each valid JSON
    unknown = {r["seq"]: r for r in records if r["type"] == "Unknown"}
    assert sorted(unknown) == sorted(poison_seqs), (sorted(unknown), sorted(poison_seqs))
    assert all(r["unreadable"].startswith(f"unreadable at position {s}: ") for s, r in unknown.items())

    printed = await asyncio.to_thread(subprocess.run, [CORRAL, *_login(srv, "ops", tmp_path), "tail",
                                                       "--no-follow"], capture_output=True, timeout=120)
    assert printed.returncode == 0, printed.stderr.decode()
    lines = [ln for ln in printed.stdout.decode().splitlines() if "unreadable at position" in ln]
    by_seq: dict[int, list[str]] = {}
    for ln in lines:
        seq = int(ln.split("unreadable at position ", 1)[1].split(":", 1)[0])
        by_seq.setdefault(seq, []).append(ln)
    assert sorted(by_seq) == sorted(poison_seqs) and all(len(v) == 1 for v in by_seq.values()), lines
    for seq, what in poison_seqs.items():
        ln = by_seq[seq][0]
        if "invalid_utf8" in what:
            assert "invalid UTF-8 at byte" in ln, ln
    assert not [ln for ln in printed.stdout.decode().splitlines() if "fake line" in ln and "unreadable" not in ln]
