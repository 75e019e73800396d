"""Every role against every action, on a real nats-server running deploy/nats's accounts.

Each (role, action) pair is its own test case. An allowed action must succeed
with no permission error; a denied one must draw a "Permissions Violation"
from the server (a publish, a JetStream API request or a subscription it
refused), and a denied append must leave nothing in the log. The expected
matrix is written out here, independently of deploy/nats/permissions.py, so
the test checks the design rather than restating the config.
"""

from __future__ import annotations

import asyncio
import copy
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy, RawStreamMsg, StreamConfig
from nats.js.errors import NotFoundError

from deploy.nats import permissions
from deploy.nats.render import accounts, server
from events.security import connect_options
from events.snapshots import SnapshotStore
from orchestrator.core.model.state import ClusterState
from tests.deploy.launcher import Server, free_ports, passwords

NODES = ["n1", "n2"]
TEAMS = ("vision",)
USERS = {  # role -> the user that plays it
    "client": "client",  # client-<team> users live in their team accounts (test_gateway.py)
    "admin": "admin",
    "agent": "agent-n1",
    "scheduler": "scheduler",
    "ops": "ops",
    "archiver": "archiver",
    "index": "index",
}
NAIVE = "agent-naive"  # agent-n1's rights plus core subscriptions to corral.>: the control case


@dataclass
class Ctx:
    """A role's connection, the scheduler's (for setup and checks), and a fresh token for ids."""

    nc: Client
    js: JetStreamContext
    admin: JetStreamContext
    token: str


@dataclass(frozen=True)
class Action:
    run: Callable[[Ctx], Awaitable[None]]
    stores: Callable[[Ctx], str] | None = None  # the log subject an allowed run appends to


def _append(subject: str) -> Action:
    async def run(c: Ctx) -> None:
        await c.js.publish(subject.format(t=c.token), b"{}", headers={"Nats-Msg-Id": c.token})

    return Action(run, stores=lambda c: subject.format(t=c.token))


async def _kv_put(c: Ctx, bucket: str, key: str) -> None:
    kv = await c.js.key_value(bucket)
    await kv.put(key, c.token.encode())


async def _kv_delete(c: Ctx, bucket: str, key: str) -> None:
    kv = await c.js.key_value(bucket)
    await kv.delete(key)


#: The position of the scheduler's snapshot the server is seeded with.
SEEDED_SNAPSHOT_SEQ = 42


async def _snapshot_put(c: Ctx) -> None:
    obj = await c.js.object_store(permissions.SNAPSHOTS)
    await obj.put(f"snap-{c.token}", b"state")


async def _snapshot_get(c: Ctx) -> None:
    """As every reader starts (events/snapshots.py): list the snapshots, read the newest, check it."""
    obj = await c.js.object_store(permissions.SNAPSHOTS)
    assert (await obj.get("seed")).data == b"seed-state"
    loaded = await SnapshotStore(c.js).load(ClusterState)
    assert loaded is not None and loaded.seq == SEEDED_SNAPSHOT_SEQ


async def _create_stream(c: Ctx) -> None:
    await c.js.add_stream(StreamConfig(name=f"SCRATCH-{c.token}", subjects=[f"scratch.{c.token}.>"]))


async def _delete_stream(c: Ctx) -> None:
    name = f"SCRATCH-{c.token}"
    await c.admin.add_stream(StreamConfig(name=name, subjects=[f"scratch.{c.token}.>"]))
    await c.js.delete_stream(name)


async def _purge_log(c: Ctx) -> None:
    await c.js.purge_stream(permissions.STREAM)


async def _delete_log_message(c: Ctx) -> None:
    ack = await c.admin.publish(f"corral.job.{c.token}.JobSubmitted", b"{}")
    await c.js.delete_msg(permissions.STREAM, ack.seq)


async def _replay(c: Ctx) -> None:
    """A pull consumer from the start with explicit acks: how a service folds the log."""
    subject = f"corral.job.{c.token}.JobSubmitted"
    await c.admin.publish(subject, b"{}")
    sub = await c.js.pull_subscribe(subject, stream=permissions.STREAM)
    (msg,) = await sub.fetch(1, timeout=2)
    await msg.ack_sync()
    await sub.unsubscribe()


async def _tail(c: Ctx) -> None:
    """An ordered push consumer (flow control, heartbeats): how `corral tail` follows the log."""
    subject = f"corral.job.{c.token}.JobSubmitted"
    await c.admin.publish(subject, b"{}")
    sub = await c.js.subscribe(subject, stream=permissions.STREAM, ordered_consumer=True)
    msg = await sub.next_msg(timeout=2)
    assert msg.subject == subject
    await sub.unsubscribe()


async def _read_heartbeat(c: Ctx) -> None:
    kv = await c.js.key_value(permissions.HEARTBEATS)
    assert (await kv.get("n1")).value


async def _watch_heartbeats(c: Ctx) -> None:
    kv = await c.js.key_value(permissions.HEARTBEATS)
    watcher = await kv.watchall()
    entry = await watcher.updates(timeout=2)
    if entry is None:
        # nats-py's "initial values done" marker comes first when the watch reads its consumer
        # info (0 pending) before the entries the server pushed (seen in CI, stop 15).
        entry = await watcher.updates(timeout=2)
    assert entry is not None and entry.value
    await watcher.stop()


async def _stream_info(c: Ctx) -> None:
    info = await c.js.stream_info(permissions.STREAM)
    assert info.config.name == permissions.STREAM


async def _subscribe(c: Ctx, subject: str) -> None:
    await c.nc.subscribe(subject.format(t=c.token))
    await c.nc.flush()


async def _publish_core(c: Ctx, subject: str) -> None:
    await c.nc.publish(subject, b"forged")
    await c.nc.flush()


async def _inject_by_deliver_subject(c: Ctx) -> None:
    """A push consumer on the heartbeat bucket delivering into the log's subjects, plus the
    literal subscription that makes JetStream deliver; the CORRAL stream captures the deliveries."""
    target = f"corral.job.{c.token}.GangReserved"

    async def ignore(_: object) -> None:
        pass

    await c.nc.subscribe(target, cb=ignore)
    await c.nc.flush()
    await c.js.add_consumer(
        f"KV_{permissions.HEARTBEATS}", ConsumerConfig(deliver_subject=target, deliver_policy=DeliverPolicy.ALL)
    )
    await asyncio.sleep(0.3)  # time for a delivery, were there one


def _injected_subject(c: Ctx) -> str:
    """A push delivery keeps its source subject, so what lands in the log is a heartbeat message."""
    return f"$KV.{permissions.HEARTBEATS}.n1"


ACTIONS: dict[str, Action] = {
    # appends to the log
    "submit-job": _append("corral.job.{t}.JobSubmitted"),
    "cancel-job": _append("corral.job.{t}.CancelRequested"),
    "define-queue": _append("corral.queue.{t}.QueueDefined"),
    "delete-queue": _append("corral.queue.{t}.QueueDeleted"),
    "cordon-node": _append("corral.node.n1.NodeCordoned"),
    "reserve-gang": _append("corral.job.{t}.GangReserved"),
    "complete-job": _append("corral.job.{t}.JobCompleted"),
    "requeue-job": _append("corral.job.{t}.JobRequeued"),
    "elect-scheduler": _append("corral.sched.SchedulerElected"),
    "fail-node": _append("corral.node.n1.NodeFailed"),
    "register-own-node": _append("corral.node.n1.NodeRegistered"),
    "register-other-node": _append("corral.node.n2.NodeRegistered"),
    "recover-other-node": _append("corral.node.n2.NodeRecovered"),
    "gpu-fault-own-node": _append("corral.node.n1.GpuUnhealthy"),
    "gpu-fault-other-node": _append("corral.node.n2.GpuUnhealthy"),
    "health-check-other-node": _append("corral.node.n2.NodeHealthChecked"),
    "report-worker-started": _append("corral.job.{t}.WorkerStarted.n1"),
    "report-worker-exited": _append("corral.job.{t}.WorkerExited.n1"),
    "report-checkpoint": _append("corral.job.{t}.Checkpointed.n1"),
    # an agent reports about its own node only (#39), and on the subject that names it (#40)
    "report-worker-started-as-other-node": _append("corral.job.{t}.WorkerStarted.n2"),
    "report-worker-started-without-node": _append("corral.job.{t}.WorkerStarted"),
    "order-own-node": _append("corral.node.n1.WorkAssigned"),
    # key-value and object store
    "heartbeat-own-node": Action(lambda c: _kv_put(c, permissions.HEARTBEATS, "n1")),
    "heartbeat-other-node": Action(lambda c: _kv_put(c, permissions.HEARTBEATS, "n2")),
    "delete-other-heartbeat": Action(lambda c: _kv_delete(c, permissions.HEARTBEATS, "n2")),
    "take-leader-lease": Action(lambda c: _kv_put(c, permissions.LEADER, "leader")),
    "save-snapshot": Action(_snapshot_put),
    # stream administration
    "create-stream": Action(_create_stream),
    "delete-stream": Action(_delete_stream),
    "purge-log": Action(_purge_log),
    "delete-log-message": Action(_delete_log_message),
    # reading, which everyone may do
    "replay-log": Action(_replay),
    "tail-log": Action(_tail),
    "read-stream-info": Action(_stream_info),
    "read-heartbeat": Action(_read_heartbeat),
    "watch-heartbeats": Action(_watch_heartbeats),
    "read-snapshot": Action(_snapshot_get),
    # `corral logs`: a request to a node's agent, which serves its own node only
    "request-logs": Action(lambda c: _publish_core(c, "corral-logs.n1")),
    "serve-own-node-logs": Action(lambda c: _subscribe(c, "corral-logs.n1")),
    "serve-other-node-logs": Action(lambda c: _subscribe(c, "corral-logs.n2")),
    "serve-every-node-logs": Action(lambda c: _subscribe(c, "corral-logs.*")),
    # `corral run`'s input: users send it to rank 0's agent, which alone may hear its node's (the key is in it)
    "send-input": Action(lambda c: _publish_core(c, "corral-stdin.n1.j-1")),
    "serve-own-node-input": Action(lambda c: _subscribe(c, "corral-stdin.n1.*")),
    "serve-other-node-input": Action(lambda c: _subscribe(c, "corral-stdin.n2.*")),
    "sniff-every-input": Action(lambda c: _subscribe(c, "corral-stdin.>")),
    # the index (`corral index`): users ask it, the index service answers
    "ask-index": Action(lambda c: _publish_core(c, "corral-index.usage")),
    "serve-index": Action(lambda c: _subscribe(c, "corral-index.*")),
    # ways around the rules
    "core-subscribe-log": Action(lambda c: _subscribe(c, "corral.>")),
    "sniff-all-inboxes": Action(lambda c: _subscribe(c, "_INBOX.>")),
    "sniff-scheduler-inbox": Action(lambda c: _subscribe(c, "_INBOX_scheduler.>")),
    "forge-reply-to-inbox": Action(lambda c: _publish_core(c, "_INBOX.forged")),
    "inject-via-deliver-subject": Action(_inject_by_deliver_subject, stores=_injected_subject),
}

EVERYONE = set(USERS)
READS = {"replay-log", "tail-log", "read-stream-info", "read-heartbeat", "watch-heartbeats", "read-snapshot"}
ALLOWED: dict[str, set[str]] = {
    "client": READS | {"submit-job", "cancel-job", "request-logs", "send-input", "ask-index"},
    "admin": READS | {"submit-job", "cancel-job", "define-queue", "delete-queue", "cordon-node", "request-logs",
                      "send-input", "ask-index", "gpu-fault-own-node", "gpu-fault-other-node"},
    "agent": READS
    | {
        "serve-own-node-logs",
        "serve-own-node-input",
        "register-own-node",
        "report-worker-started",
        "report-worker-exited",
        "report-checkpoint",
        "heartbeat-own-node",
        "gpu-fault-own-node",
    },
    "ops": READS | {"ask-index"},
    "index": READS | {"serve-index"},
    # Retention: it reads, and purges the log (up to what its archive holds); nothing else (#28).
    "archiver": READS | {"purge-log"},
    "scheduler": set(ACTIONS)
    - {
        # Nobody, not even the scheduler, makes core subscriptions outside its own inbox.
        "core-subscribe-log",
        "sniff-all-inboxes",
        "forge-reply-to-inbox",
        "inject-via-deliver-subject",
        # Logs are the agents' to serve and users' to read, not the scheduler's.
        "request-logs",
        "serve-own-node-logs",
        "serve-other-node-logs",
        "serve-every-node-logs",
        # A job's input is its submitter's to send and rank 0's agent's to hear.
        "send-input",
        "serve-own-node-input",
        "serve-other-node-input",
        "sniff-every-input",
        # The index is asked by users and answered by the index service.
        "ask-index",
        "serve-index",
    },
}
CASES = [
    pytest.param(
        role, action, action in ALLOWED[role], id=f"{role}-{'may' if action in ALLOWED[role] else 'not'}-{action}"
    )
    for role in USERS
    for action in ACTIONS
]


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Server:
    """One server with corral's accounts (+ the naive control user), seeded by the scheduler."""
    d: Path = tmp_path_factory.mktemp("secured")
    port, http = free_ports(2)
    auth = accounts(NODES, TEAMS)
    corral_users = auth["accounts"]["CORRAL"]["users"]
    naive = copy.deepcopy(next(u for u in corral_users if u["user"] == "agent-n1"))
    naive["user"] = NAIVE
    naive["password"] = "naive-pw"
    naive["permissions"]["subscribe"]["allow"] = [f"{permissions.inbox_prefix(NAIVE)}.>", "corral.>"]
    corral_users.append(naive)
    srv = Server(
        server(
            name="secured", listen=f"127.0.0.1:{port}", http=f"127.0.0.1:{http}", store_dir=str(d / "js"), auth=auth
        ),
        d / "secured.conf",
        passwords(NODES, TEAMS),
    )
    srv.start().wait_healthy()
    asyncio.run(_seed(srv))
    yield srv
    srv.stop()


async def _seed(srv: Server) -> None:
    nc = await _connect(srv, "scheduler")
    js = nc.jetstream(timeout=5)
    await js.add_stream(StreamConfig(name=permissions.STREAM, subjects=["corral.>"], duplicate_window=120))
    hb = await js.create_key_value(bucket=permissions.HEARTBEATS)
    await hb.put("n1", b"alive")
    await hb.put("n2", b"alive")
    await js.create_key_value(bucket=permissions.LEADER)
    obj = await js.create_object_store(permissions.SNAPSHOTS)
    await obj.put("seed", b"seed-state")
    await SnapshotStore(js).save(ClusterState(seq=SEEDED_SNAPSHOT_SEQ))
    await nc.drain()


async def _connect(srv: Server, user: str, **kw: object) -> Client:
    pw = "naive-pw" if user == NAIVE else passwords(NODES, TEAMS)[f"CORRAL_{user.upper().replace('-', '_')}_PASSWORD"]
    return await nats.connect(
        srv.url, **connect_options(user=user, password=pw), allow_reconnect=False, connect_timeout=5, **kw
    )


async def _attempt(srv: Server, user: str, action: Action, admin: JetStreamContext) -> tuple[Ctx, str | None]:
    """Run `action` as `user`; the server's permission error if it sent one, else None."""
    violations: list[str] = []
    seen = asyncio.Event()

    async def on_error(e: Exception) -> None:
        if "permissions violation" in str(e).lower():
            violations.append(str(e))
            seen.set()

    nc = await _connect(srv, user, error_cb=on_error)
    ctx = Ctx(nc, nc.jetstream(timeout=3), admin, uuid.uuid4().hex[:12])
    run = asyncio.ensure_future(action.run(ctx))
    denied = asyncio.ensure_future(seen.wait())
    try:
        await asyncio.wait({run, denied}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        if not seen.is_set():
            run.result()  # succeeded, or raises what went wrong (a timeout counts as a failure)
            # A refused subscription's -ERR can trail the flush that carried it by a moment.
            await nc.flush()
            await asyncio.sleep(0.05)
    finally:
        for t in (run, denied):
            t.cancel()
        await asyncio.gather(run, denied, return_exceptions=True)
        await nc.close()
    return ctx, violations[0] if violations else None


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("role", "action", "allowed"), CASES)
async def test_role_action(secured: Server, role: str, action: str, allowed: bool) -> None:
    """`role` may do `action` iff the matrix says so, and a refused append leaves no trace in the log."""
    act = ACTIONS[action]
    admin_nc = await _connect(secured, "scheduler")
    try:
        admin = admin_nc.jetstream(timeout=3)
        before = (await admin.stream_info(permissions.STREAM)).state.last_seq
        ctx, violation = await _attempt(secured, USERS[role], act, admin)
        if allowed:
            assert violation is None, f"{role} was refused {action}: {violation}"
        else:
            assert violation is not None, f"{role} could {action}, which it must not"
        if act.stores is not None:
            subject = act.stores(ctx)
            last = await _last_or_none(ctx.admin, subject)
            stored = last is not None and last.seq > before
            assert stored == allowed, f"{subject} {'missing from' if allowed else 'got into'} the log"
    finally:
        await admin_nc.close()


async def test_deliver_subject_injection_works_for_a_user_who_may_subscribe(secured: Server) -> None:
    """Control for inject-via-deliver-subject: an agent that may subscribe to corral.> CAN put its
    own heartbeat payload into the CORRAL stream. This is why permissions.inbox_prefix exists."""
    nc = await _connect(secured, NAIVE)
    admin_nc = await _connect(secured, "scheduler")
    try:
        token = uuid.uuid4().hex[:12]
        admin = admin_nc.jetstream(timeout=3)
        before = (await admin.stream_info(permissions.STREAM)).state.last_seq
        kv = await nc.jetstream().key_value(permissions.HEARTBEATS)
        await kv.put("n1", b'{"type":"GangReserved","job_id":"' + token.encode() + b'"}')
        ctx = Ctx(nc, nc.jetstream(timeout=3), admin, token)
        await _inject_by_deliver_subject(ctx)
        deadline = time.monotonic() + 3
        while (msg := await _last_or_none(admin, _injected_subject(ctx))) is None or msg.seq <= before:
            assert time.monotonic() < deadline, "no injection: if NATS now prevents it, drop this control"
            await asyncio.sleep(0.05)
        assert token.encode() in msg.data
    finally:
        await nc.close()
        await admin_nc.close()


async def _last_or_none(js: JetStreamContext, subject: str) -> RawStreamMsg | None:
    try:
        return await js.get_last_msg(permissions.STREAM, subject)
    except NotFoundError:
        return None


def test_every_event_tag_has_a_writer() -> None:
    """A new event type forces a decision on who may append it (permissions.APPENDS)."""
    from schemas import EVENT_TAGS

    owned = [tag for tags in permissions.APPENDS.values() for tag in tags]
    assert sorted(owned) == sorted(set(owned)), "a tag has two owners"
    assert set(owned) == set(EVENT_TAGS)


def test_agent_users_name_a_valid_node() -> None:
    """A node id that is not one subject token would widen or break its agent's permissions."""
    with pytest.raises(ValueError, match="subject token"):
        permissions.role_permissions("agent", "agent-x", "gpu1.example.com")
    with pytest.raises(ValueError):
        permissions.role_permissions("agent", "agent-x")


async def test_message_id_squatting_is_not_stopped_by_permissions(secured: Server) -> None:
    """Residual risk, documented in deploy/README.md: the duplicate window is per stream, not per
    subject, so a client that appends its own JobSubmitted under the Nats-Msg-Id of a decision the
    scheduler will make (decide's ids are predictable) makes that decision a "duplicate": acked, not
    stored. Permissions cannot prevent this; the appender must check where a duplicate ack points."""
    client = await _connect(secured, USERS["client"])
    admin_nc = await _connect(secured, "scheduler")
    try:
        token = uuid.uuid4().hex[:12]
        squat = f"GangReserved:{token}:1:42"
        mine = await client.jetstream(timeout=3).publish(
            f"corral.job.{token}.JobSubmitted", b"{}", headers={"Nats-Msg-Id": squat}
        )
        admin = admin_nc.jetstream(timeout=3)
        decision = await admin.publish(f"corral.job.{token}.GangReserved", b"{}", headers={"Nats-Msg-Id": squat})
        assert decision.duplicate and decision.seq == mine.seq
        assert (await admin.get_msg(permissions.STREAM, decision.seq)).subject.endswith(".JobSubmitted")
        assert await _last_or_none(admin, f"corral.job.{token}.GangReserved") is None
    finally:
        await client.close()
        await admin_nc.close()


@pytest.mark.parametrize("user", ["agent-n1", "client", "ops"])
async def test_every_role_connects_a_bus_to_the_ready_stream(secured: Server, user: str) -> None:
    """A Bus only looks at a stream and buckets that exist: roles that may not create them still connect."""
    from events.bus import Bus

    pw = passwords(NODES, TEAMS)[f"CORRAL_{user.upper().replace('-', '_')}_PASSWORD"]
    bus = await Bus.connect(secured.url, duplicate_window=120, connect_attempts=1,
                            **connect_options(user=user, password=pw))
    try:
        assert await bus.last_seq() >= 0
        kv = await bus.kv(permissions.HEARTBEATS)
        assert (await kv.get("n1")).value  # readable (earlier matrix cases may have rewritten it)
    finally:
        await bus.close()
