"""The embedded nats-server: finding the binary, start/stop/restart, readiness, failures."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import nats
import pytest

from events.server import NatsServer, NatsServerError, nats_server_binary


def test_binary_comes_from_the_wheel() -> None:
    binary = nats_server_binary()
    assert binary.name == "nats-server" and os.access(binary, os.X_OK)
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=True).stdout
    assert "v2.15.1" in out  # the version pyproject pins


def test_binary_override(tmp_path: Path) -> None:
    real = nats_server_binary()
    assert nats_server_binary(real) == real
    with pytest.raises(FileNotFoundError, match="--nats-server"):
        nats_server_binary(tmp_path / "missing")
    not_exec = tmp_path / "nats-server"
    not_exec.write_text("")
    with pytest.raises(FileNotFoundError):
        nats_server_binary(not_exec)


async def test_start_serves_jetstream_on_a_free_loopback_port(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "d")
    server.stop()  # safe before start
    server.start()
    try:
        assert server.running and server.url.startswith("nats://127.0.0.1:")
        nc = await nats.connect(server.url)
        info = await nc.jetstream().account_info()
        assert info.limits is not None
        await nc.drain()
        assert (tmp_path / "d" / "jetstream").is_dir()
    finally:
        server.stop()
        server.stop()  # idempotent
    assert not server.running


async def test_given_port_and_max_payload(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with NatsServer(tmp_path, port=port, max_payload=4 * 1024 * 1024) as server:
        assert server.url == f"nats://127.0.0.1:{port}"
        nc = await nats.connect(server.url)
        assert nc.max_payload == 4 * 1024 * 1024
        await nc.drain()
    assert not server.running


async def test_restart_keeps_port_and_data(tmp_path: Path) -> None:
    server = NatsServer(tmp_path).start()
    try:
        url = server.url
        nc = await nats.connect(url)
        js = nc.jetstream()
        await js.add_stream(name="S", subjects=["s.>"])
        await js.publish("s.1", b"kept")
        await nc.drain()
        server.restart()
        assert server.url == url
        nc = await nats.connect(url)
        msg = await nc.jetstream().get_msg("S", 1)
        assert msg.data == b"kept"
        await nc.drain()
    finally:
        server.stop()


def test_a_failed_start_says_why(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(NatsServerError, match="address already in use"):
            NatsServer(tmp_path, port=port, start_timeout=10).start()
    with pytest.raises(NatsServerError, match="sync_interval"):
        NatsServer(tmp_path / "x", sync_interval="sometimes").start()


def test_sync_always_and_kill(tmp_path: Path) -> None:
    server = NatsServer(tmp_path, sync_interval="always").start()
    assert '"sync_interval": "always"' in (tmp_path / "run" / "nats-server.conf").read_text()
    pid = server.pid
    assert pid is not None
    server.kill()
    assert not server.running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def _alive(pid: int) -> bool:
    """Running: not gone, and not a zombie (a container's init may be slow to reap orphans)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="PR_SET_PDEATHSIG and /proc are Linux-only")
def test_a_server_started_to_die_with_its_parent_does_when_the_parent_is_killed(tmp_path: Path) -> None:
    """`corral up` starts its server so: SIGKILL of the CLI must not leave a server holding port and store."""
    script = ("import time; from events.server import NatsServer; "
              f"s = NatsServer({str(tmp_path)!r}, die_with_parent=True).start(); print(s.pid, flush=True); "
              "time.sleep(120)")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              cwd=Path(__file__).resolve().parent.parent)
    try:
        assert parent.stdout is not None
        server_pid = int(parent.stdout.readline())
        assert _alive(server_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 20
        while _alive(server_pid):
            if time.monotonic() > deadline:
                os.kill(server_pid, signal.SIGKILL)
                raise AssertionError("nats-server outlived its SIGKILLed parent")
            time.sleep(0.1)
    finally:
        parent.kill()
        parent.wait()
