"""Services start in any order under per-role auth, and a missing permission is named.

On a fresh server with deploy/nats's accounts only the `scheduler` user may create the CORRAL
stream and its buckets (deploy/nats/permissions.py). An agent that starts first must wait for
the scheduler rather than die on the refused create (it used to exit with "cannot reach NATS
(TimeoutError)"); a service whose user lacks a permission it needs must exit non-zero with an
error that names the refused operation and the user. Real `corral` processes, real nats-server.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import nats.js.errors
import pytest

from deploy.nats import permissions
from events.bus import Bus
from events.security import connect_options
from orchestrator.cli.errors import DENIED
from tests.deploy.launcher import Server, login_args, password_of, passwords, secured_server
from tests.faults.services import observer, until
from tests.integration.harness import log_tail, start_corral, stop

NODES = ["n1", "n2"]
PASSWORDS = passwords(NODES)


def _password(user: str) -> str:
    return password_of(PASSWORDS, user)


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[Server]:
    """A server with corral's users and no stream yet: nobody has started the scheduler."""
    with secured_server(tmp_path, "fresh", NODES, PASSWORDS) as srv:
        yield srv


def _login(srv: Server, user: str, secrets: Path) -> list[str]:
    return login_args(srv, user, _password(user), secrets)


def _agent(srv: Server, user: str, node: str, d: Path):  # type: ignore[no-untyped-def]
    return start_corral(
        *_login(srv, user, d / "secrets"), "agent", "--node-id", node, "--runtime", "simulated", "--fake-gpus", "2",
        "--data-dir", str(d / "agent"), "--address", "127.0.0.1", "--heartbeat", "0.5", "--log-level", "info",
        log=d / f"agent-{node}.log",
    )


def _scheduler(srv: Server, user: str, d: Path):  # type: ignore[no-untyped-def]
    return start_corral(
        *_login(srv, user, d / "secrets"), "scheduler", "--id", "s1", "--lease-ttl", "2", "--tick", "0.2",
        "--log-level", "info", log=d / f"scheduler-{user}.log",
    )


async def _stream_exists(srv: Server) -> bool:
    nc = await nats.connect(srv.url, **connect_options(user="ops", password=_password("ops")), allow_reconnect=False)
    try:
        await nc.jetstream(timeout=5).stream_info(permissions.STREAM)
        return True
    except nats.js.errors.NotFoundError:
        return False
    finally:
        await nc.close()


def _wait_for_line(proc, text: str, timeout: float) -> str:  # type: ignore[no-untyped-def]
    """The first line of `proc`'s log that contains `text`; fails if the process exits first."""
    deadline = time.monotonic() + timeout
    while True:
        lines = [line for line in log_tail(proc, 200).splitlines() if text in line]
        if lines:
            return lines[0]
        assert proc.poll() is None, f"exited {proc.returncode} before logging {text!r}:\n{log_tail(proc)}"
        assert time.monotonic() < deadline, f"no {text!r} in the log after {timeout}s:\n{log_tail(proc)}"
        time.sleep(0.2)


@pytest.mark.timeout(180)
async def test_an_agent_started_first_waits_for_the_scheduler_to_create_the_stream(
    fresh: Server, tmp_path: Path
) -> None:
    agent = _agent(fresh, "agent-n1", "n1", tmp_path)
    sched = None
    try:
        line = await asyncio.to_thread(_wait_for_line, agent, "waiting_for_stream", 60)
        assert "scheduler" in line and permissions.STREAM in line and "agent-n1" in line, line
        await asyncio.sleep(2)  # it keeps waiting: no exit, no stream
        assert agent.poll() is None, log_tail(agent)
        assert not await _stream_exists(fresh)

        sched = _scheduler(fresh, "scheduler", tmp_path)
        ops = await Bus.connect(fresh.url, name="ops", wait_for_creator=True,
                                **connect_options(user="ops", password=_password("ops")))
        try:
            async with observer(ops) as seen:
                await until(seen, lambda s: "n1" in s.nodes and s.epoch >= 1, 90,
                            "the agent's NodeRegistered and the scheduler's election", alive=[agent, sched])
        finally:
            await ops.close()
        assert agent.poll() is None and sched.poll() is None
    finally:
        codes = [_stopped(p) for p in (agent, sched) if p is not None]
    assert codes == [0] * len(codes), log_tail(agent)


def _stopped(proc) -> int:  # type: ignore[no-untyped-def]
    """SIGTERM and its exit code; a generous wait (a loaded machine), then SIGKILL and a failure that shows the log."""
    try:
        return stop(proc, timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"no exit 60 s after SIGTERM; its log ends:\n{log_tail(proc)}") from None


@pytest.mark.timeout(120)
def test_a_scheduler_that_may_not_create_the_stream_names_the_permission(fresh: Server, tmp_path: Path) -> None:
    """`corral scheduler` run as `ops` (read-only): the create is refused; it exits DENIED saying what and who."""
    sched = _scheduler(fresh, "ops", tmp_path)
    try:
        code = sched.wait(60)
    finally:
        stop(sched)
    out = log_tail(sched, 50)
    assert code == DENIED, out
    last = out.splitlines()[-1]
    assert last.startswith("corral: error:") and "$JS.API.STREAM.CREATE.CORRAL" in last and "'ops'" in last, out
    assert "Traceback" not in out, out


@pytest.mark.timeout(120)
async def test_an_agent_whose_user_may_not_register_its_node_names_the_permission(
    fresh: Server, tmp_path: Path
) -> None:
    """agent-n1's password on node n2 (a wrong secret mounted): its NodeRegistered is refused; exit DENIED."""
    bus = await Bus.connect(fresh.url, **connect_options(user="scheduler", password=_password("scheduler")))
    await bus.kv(permissions.HEARTBEATS)
    await bus.close()
    agent = _agent(fresh, "agent-n1", "n2", tmp_path)
    try:
        code = await asyncio.to_thread(agent.wait, 60)
    finally:
        stop(agent)
    out = log_tail(agent, 50)
    assert code == DENIED, out
    last = out.splitlines()[-1]  # nats-py lowercases the server's error text
    assert last.startswith("corral: error:") and "corral.node.n2.noderegistered" in last.lower(), out
    assert "'agent-n1'" in last and "Traceback" not in out, out
