"""A 3-server JetStream cluster (deploy/nats's loopback layout and accounts) survives losing its
stream leader to SIGKILL mid-workload: no acknowledged event lost, none stored twice, and the
killed server catches up from its own store when it comes back. And a cluster still forming is
waited for: `corral scheduler --replicas 3` started with its servers creates the stream and leads.

A fresh cluster answers a replicated create only once it has a JetStream meta leader that has met
every peer (before: no answer, or "no suitable peers for placement"); /healthz alone does not say
so, which made the first test flaky (issue 24)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import StreamConfig

from deploy.nats import permissions
from deploy.nats.render import accounts, loopback_cluster
from events.bus import Bus, NotReady
from events.security import connect_options
from tests.deploy.launcher import Server, add_stream_when_ready, free_ports, passwords, wait_meta_leader
from tests.faults.services import observer, until
from tests.integration.harness import log_tail, start_corral, stop

NODES = ["n1"]
EVENTS = 300
WORKERS = 4  # concurrent publishers, so some publishes are in flight when the leader dies
KILL_AT = EVENTS // 3


def _servers(tmp_path: Path) -> list[Server]:
    """Three cluster members with corral's accounts, not started."""
    ports = free_ports(9)
    auth = accounts(NODES)
    servers = []
    for cfg in loopback_cluster(ports[0:3], ports[3:6], ports[6:9], str(tmp_path / "store")):
        cfg.update(auth)
        servers.append(Server(cfg, tmp_path / f"{cfg['server_name']}.conf", passwords(NODES)))
    return servers


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[Server]]:
    """A formed cluster: every server healthy and one meta leader that sees them all."""
    servers = _servers(tmp_path)
    for s in servers:
        s.start()
    try:
        for s in servers:
            s.wait_healthy(timeout=60)
        wait_meta_leader(servers)
        yield servers
    finally:
        for s in servers:
            s.stop()


async def _connect(urls: list[str]) -> Client:
    """The scheduler's connection: tries `urls` in order, then every server the cluster advertises."""
    pw = passwords(NODES)["CORRAL_SCHEDULER_PASSWORD"]
    return await nats.connect(
        urls,
        **connect_options(user="scheduler", password=pw),
        dont_randomize=True,
        reconnect_time_wait=0.1,
        max_reconnect_attempts=-1,
        connect_timeout=2,
    )


async def _publish_until_acked(js: JetStreamContext, i: int, deadline: float, retries: list[str]) -> tuple[int, bool]:
    """Append event i, retrying with the same Nats-Msg-Id until acked: a retry of a publish that
    was stored after all is answered `duplicate` with the original sequence, never stored twice."""
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            ack = await js.publish(
                f"corral.job.j{i}.JobSubmitted", json.dumps({"i": i}).encode(), headers={"Nats-Msg-Id": f"ev-{i}"}
            )
            return ack.seq, bool(ack.duplicate)
        except (TimeoutError, nats.errors.Error) as e:  # leader election, reconnect: retry
            last = e
            retries.append(type(e).__name__)
            await asyncio.sleep(0.05)
    raise AssertionError(f"event {i} never acknowledged; last error {last!r}")


async def _wait(what: str, check, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        try:
            if await check():
                return
        except (TimeoutError, nats.errors.Error):
            pass
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


def _local_state(server: Server) -> dict[str, int]:
    """The CORRAL replica on `server`'s own disk, from its monitoring endpoint (not the leader's view)."""
    jsz = server.monitor("jsz?accounts=true&streams=true")
    for acc in jsz.get("account_details", []):
        for stream in acc.get("stream_detail", []):
            if stream["name"] == permissions.STREAM:
                return stream["state"]
    return {}


@pytest.mark.timeout(240)
async def test_leader_killed_mid_workload_loses_and_duplicates_nothing(cluster: list[Server]) -> None:
    """Kill the stream leader (SIGKILL) while 4 publishers append 300 events with acks: every acked
    event is in the log exactly once at its acked sequence, re-sending acked events after the
    failover stores nothing, and the restarted server's own replica catches up to the same log."""
    admin = await _connect([s.url for s in cluster])
    js = admin.jetstream(timeout=5)
    await add_stream_when_ready(
        js, StreamConfig(name=permissions.STREAM, subjects=["corral.>"], num_replicas=3, duplicate_window=120)
    )

    async def has_leader() -> bool:
        info = await js.stream_info(permissions.STREAM)
        return bool(info.cluster and info.cluster.leader and len(info.cluster.replicas or []) == 2)

    await _wait("a stream leader with two followers", has_leader, timeout=60)
    info = await js.stream_info(permissions.STREAM)
    assert info.cluster is not None
    leader = next(s for s in cluster if s.name == info.cluster.leader)

    # The publisher sits on the leader's server, so the kill also forces it to reconnect.
    pub = await _connect([leader.url, *(s.url for s in cluster if s is not leader)])
    pjs = pub.jetstream(timeout=1)  # publishes: a short timeout, retried (_publish_until_acked)
    rjs = pub.jetstream(timeout=10)  # the checks' reads: asked once each, so a loaded machine gets time
    acked: dict[int, tuple[int, bool]] = {}
    retries: list[str] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(EVENTS):
        queue.put_nowait(i)
    killed = asyncio.Event()
    deadline = time.monotonic() + 90

    async def worker() -> None:
        while not queue.empty():
            i = queue.get_nowait()
            acked[i] = await _publish_until_acked(pjs, i, deadline, retries)
            if len(acked) >= KILL_AT and not killed.is_set():
                killed.set()
                leader.kill()

    async with asyncio.TaskGroup() as tg:
        for _ in range(WORKERS):
            tg.create_task(worker())
    assert killed.is_set() and not leader.healthy()
    assert retries, "no publish failed: the kill did not land mid-workload"
    assert pub.connected_url is not None and pub.connected_url.port != leader.port, "publisher did not fail over"
    print(
        f"retried {len(retries)} publishes ({set(retries)}), {sum(d for _, d in acked.values())} acks were duplicates"
    )

    # 1. Every event acknowledged, each at a distinct sequence, and the log holds exactly these.
    assert sorted(acked) == list(range(EVENTS))
    seqs = [seq for seq, _ in acked.values()]
    assert len(set(seqs)) == EVENTS, "two events acknowledged at one sequence"
    state = (await rjs.stream_info(permissions.STREAM)).state
    assert state.messages == EVENTS, f"{state.messages} stored for {EVENTS} events: duplicates or losses"
    stored = {}
    for seq in range(state.first_seq, state.last_seq + 1):
        msg = await rjs.get_msg(permissions.STREAM, seq)
        stored[seq] = msg.headers["Nats-Msg-Id"] if msg.headers else None
    assert sorted(stored.values()) == sorted(f"ev-{i}" for i in range(EVENTS)), "an event stored twice or lost"
    for i, (seq, _) in acked.items():
        assert stored[seq] == f"ev-{i}", f"event {i} acknowledged at {seq}, but {stored[seq]} is there"

    # 2. The new leader knows the old leader's message ids: re-sending events it acknowledged
    #    before the kill is answered `duplicate` with the original sequence.
    for i in range(10):
        seq, duplicate = await _publish_until_acked(pjs, i, time.monotonic() + 10, retries)
        assert duplicate and seq == acked[i][0], f"event {i} re-sent after failover was stored again"
    assert (await rjs.stream_info(permissions.STREAM)).state.messages == EVENTS

    # 3. The killed server comes back on its own store dir and catches up to the same log.
    leader.start().wait_healthy(timeout=60)

    async def caught_up() -> bool:
        local = _local_state(leader)
        cl = (await rjs.stream_info(permissions.STREAM)).cluster
        assert cl is not None
        peer = next((p for p in cl.replicas or [] if p.name == leader.name), None)
        rejoined = cl.leader == leader.name or (peer is not None and peer.current and not peer.lag)
        return rejoined and local.get("messages") == EVENTS and local.get("last_seq") == state.last_seq

    await _wait(f"{leader.name} to catch up", caught_up, timeout=60)
    await pub.close()
    await admin.close()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("third_after", [0.0, 8.0], ids=["together", "third-late"])
async def test_scheduler_started_with_the_servers_creates_the_stream_and_leads(
    tmp_path: Path, third_after: float
) -> None:
    """`corral scheduler --replicas 3` started at the same moment as the servers (or with the third
    one late, so the first two elect a meta leader that cannot place three replicas for a while):
    it waits for the cluster, creates the stream with 3 replicas and its buckets, and is elected."""
    servers = _servers(tmp_path)
    password_file = tmp_path / "scheduler.password"
    password_file.write_text(passwords(NODES)["CORRAL_SCHEDULER_PASSWORD"] + "\n")
    urls = [s.url for s in servers]
    first, third = servers[:2], servers[2]
    for s in first:
        s.start()
    sched = start_corral(
        "--nats", ",".join(urls), "--user", "scheduler", "--password-file", str(password_file), "scheduler",
        "--replicas", "3", "--id", "s1", "--lease-ttl", "2", "--tick", "0.2", "--log-level", "info",
        log=tmp_path / "scheduler.log",
    )
    try:
        await asyncio.sleep(third_after)
        assert sched.poll() is None, f"the scheduler gave up on a forming cluster:\n{log_tail(sched)}"
        third.start()
        ops_pw = passwords(NODES)["CORRAL_OPS_PASSWORD"]
        ops = await Bus.connect(urls, name="ops", wait_for_creator=True, ready_timeout=120,
                                **connect_options(user="ops", password=ops_pw))
        try:
            async with observer(ops) as seen:
                await until(seen, lambda st: st.epoch >= 1 and st.scheduler_id == "s1", 120,
                            "the scheduler's election", alive=[sched])
            info = await ops.js.stream_info(permissions.STREAM)
            assert info.config.num_replicas == 3
            assert info.cluster is not None and info.cluster.leader and len(info.cluster.replicas or []) == 2
            for bucket in (permissions.LEADER, permissions.HEARTBEATS):
                assert (await ops.js.stream_info(f"KV_{bucket}")).config.num_replicas == 3
        finally:
            await ops.close()
        assert sched.poll() is None, log_tail(sched)
    finally:
        code = stop(sched)
        for s in servers:
            s.stop()
    assert code == 0, log_tail(sched)


@pytest.mark.timeout(120)
async def test_no_meta_leader_is_named_when_setup_gives_up(tmp_path: Path) -> None:
    """One server of three never gets a quorum: setup stops at its deadline and says what it waited for."""
    lone = _servers(tmp_path)[0].start()
    try:
        started = time.monotonic()
        with pytest.raises(NotReady, match=r"no JetStream meta leader after 3 s") as e:
            await Bus.connect(lone.url, replicas=3, ready_timeout=3, connect_attempts=80,
                              **connect_options(user="scheduler", password=passwords(NODES)["CORRAL_SCHEDULER_PASSWORD"]))
        assert time.monotonic() - started < 60, "the deadline did not hold"
        assert "$JS.API.STREAM.INFO.CORRAL" in str(e.value)
    finally:
        lone.stop()
