"""Workers as local processes: the embedded default (`corral up`) and the tests.

Each worker lives in `state_dir/<labels.name>/`:
- meta.json  labels, command, log path, the shim's pid and start ticks;
- child.json the worker's pid (= its process group) and start ticks, from the shim;
- exit.json  exit code or signal, from the shim, written the moment the worker ends;
- log        stdout + stderr (unless WorkerSpec.log_dir puts it elsewhere).
Start ticks from /proc/<pid>/stat guard against pid reuse: a recycled pid
never matches, so a new runtime object (after an agent restart) neither
signals a stranger nor mistakes one for its worker.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal as signals
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodeagent.runtime.base import (
    ExitInfo,
    FoundWorker,
    WorkerExists,
    WorkerHandle,
    WorkerLabels,
    WorkerSpec,
    WorkerStartError,
    stop_with_grace,
)
from nodeagent.runtime.shim import proc_start_ticks

SHIM = Path(__file__).with_name("shim.py")
#: How long start() waits for the shim to report the worker's pid.
START_TIMEOUT_S = 15.0
_TAIL_BYTES = 64 * 1024


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except (OSError, ValueError):
        return None


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _alive(pid: int | None, start_ticks: int | None) -> bool:
    """The process exists, is not a zombie, and is the one we started (same start ticks)."""
    if not pid:
        return False
    ticks = proc_start_ticks(pid)
    if ticks is None or (start_ticks is not None and ticks != start_ticks):
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@dataclass(slots=True)
class _Worker:
    dir: Path
    labels: WorkerLabels
    log: Path
    shim: asyncio.subprocess.Process | None = None
    #: How it ended, once known: concurrent waiters (run + stop) all get it, even after remove().
    final: ExitInfo | None = None

    def child(self) -> dict[str, Any] | None:
        return _read_json(self.dir / "child.json")

    def exit_record(self) -> dict[str, Any] | None:
        return _read_json(self.dir / "exit.json")

    def meta(self) -> dict[str, Any] | None:
        return _read_json(self.dir / "meta.json")

    def running(self) -> bool:
        """No exit recorded, and the worker or its shim (spawning it, or about to record its exit) lives."""
        if self.exit_record() is not None:
            return False
        child = self.child()
        if child is not None and _alive(child.get("pid"), child.get("start_ticks")):
            return True
        meta = self.meta() or {}
        return _alive(meta.get("shim_pid"), meta.get("shim_start_ticks"))


class ProcessRuntime:
    """Runs each worker under the shim in its own process group; state survives agent restarts."""

    #: Workers run on this host: the agent gives them the job's workdir and its node_env (nodeagent/rank_env.py).
    on_host = True

    def __init__(
        self, state_dir: str | Path, *, node_id: str | None = None, inherit_env: bool = True, poll_s: float = 0.05
    ) -> None:
        """`node_id` scopes adopt() (simulated nodes share a machine); `inherit_env` puts this process's
        environment under each worker's own env (tests that run the runtime alone; an agent passes False
        and gives each worker its full env, nodeagent/rank_env.py: `node_env`)."""
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.node_id = node_id
        self.inherit_env = inherit_env
        self.poll_s = poll_s
        self._workers: dict[str, _Worker] = {}

    def _worker(self, handle: WorkerHandle) -> _Worker | None:
        """The worker, from memory or its state dir (a handle rebuilt after a restart); None if removed."""
        w = self._workers.get(handle.worker_id)
        if w is None:
            d = self.state_dir / handle.worker_id
            meta = _read_json(d / "meta.json")
            if meta is None:
                return None
            w = _Worker(d, handle.labels, Path(meta.get("log", d / "log")))
            self._workers[handle.worker_id] = w
        return w

    async def start(self, spec: WorkerSpec) -> WorkerHandle:
        if not spec.command:
            raise WorkerStartError("empty command")
        labels = spec.labels
        wid = labels.name
        wdir = self.state_dir / wid
        if wdir.exists():
            old = _Worker(wdir, labels, wdir / "log")
            if old.running():
                raise WorkerExists(f"worker {wid} is running")
            shutil.rmtree(wdir)
        wdir.mkdir(parents=True)
        log = Path(spec.log_dir) / f"{wid}.log" if spec.log_dir else wdir / "log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_bytes(b"")
        if spec.checkpoint_dir:
            Path(spec.checkpoint_dir).mkdir(parents=True, exist_ok=True)
        meta: dict[str, Any] = {
            "labels": {"node_id": labels.node_id, "job_id": labels.job_id, "attempt": labels.attempt,
                       "rank": labels.rank, "restarts": labels.restarts},
            "command": list(spec.command),
            "log": str(log),
            "created_at": time.time(),
        }  # fmt: skip
        _write_json(wdir / "meta.json", meta)  # before the spawn: an agent dying right after still finds it
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-S", str(SHIM), str(wdir), str(log), "--", *spec.command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            env={**os.environ, **spec.env} if self.inherit_env else dict(spec.env),
            cwd=spec.workdir,
            start_new_session=True,
        )  # fmt: skip
        _write_json(wdir / "meta.json", {**meta, "shim_pid": proc.pid, "shim_start_ticks": proc_start_ticks(proc.pid)})
        w = _Worker(wdir, labels, log, proc)
        self._workers[wid] = w

        deadline = time.monotonic() + START_TIMEOUT_S
        while w.child() is None:
            failed = w.exit_record()
            if failed is not None and "error" in failed:
                await proc.wait()
                shutil.rmtree(wdir, ignore_errors=True)
                self._workers.pop(wid, None)
                raise WorkerStartError(f"{spec.command[0]}: {failed['error']}")
            if proc.returncode is not None or time.monotonic() > deadline:
                raise WorkerStartError(f"the shim for {wid} did not start the worker (rc={proc.returncode})")
            await asyncio.sleep(0.005)
        return WorkerHandle(wid, labels)

    async def wait(self, handle: WorkerHandle) -> ExitInfo:
        w = self._worker(handle)
        if w is None:
            return ExitInfo.of(None, None)  # removed, or never ours: nothing is known
        if w.shim is not None:
            await w.shim.wait()
        while w.final is None:
            rec = w.exit_record()
            if rec is not None:
                w.final = ExitInfo.of(rec.get("exit_code"), rec.get("signal"), _tail(w.log))
            elif not w.running() and w.exit_record() is None:
                w.final = ExitInfo.of(None, None, _tail(w.log))  # shim and worker gone, no record: lost
            else:
                await asyncio.sleep(self.poll_s)
        return w.final

    async def signal(self, handle: WorkerHandle, sig: int) -> None:
        w = self._worker(handle)
        child = w.child() if w is not None else None
        if child is None or not _alive(child.get("pid"), child.get("start_ticks")):
            return
        try:
            os.killpg(child["pid"], sig)
        except ProcessLookupError:
            pass

    async def stop(self, handle: WorkerHandle, grace_s: float) -> ExitInfo:
        info = await stop_with_grace(self, handle, grace_s)
        w = self._worker(handle)
        child = w.child() if w is not None else None
        if child is not None:
            # Stragglers the worker forked into its group still hold GPUs: end them too.
            try:
                os.killpg(child["pid"], signals.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        return info

    async def adopt(self) -> list[FoundWorker]:
        found: list[FoundWorker] = []
        for d in sorted(p for p in self.state_dir.iterdir() if p.is_dir()):
            meta = _read_json(d / "meta.json")
            if meta is None:
                continue
            labels = WorkerLabels(**meta["labels"])
            if self.node_id is not None and labels.node_id != self.node_id:
                continue
            handle = WorkerHandle(d.name, labels)
            w = self._workers.setdefault(d.name, _Worker(d, labels, Path(meta.get("log", d / "log"))))
            if w.running():
                found.append(FoundWorker(handle, True))
            else:
                rec = w.exit_record() or {}
                info = ExitInfo.of(rec.get("exit_code"), rec.get("signal"), _tail(w.log))
                found.append(FoundWorker(handle, False, info))
        return found

    async def log_tail(self, handle: WorkerHandle, lines: int = 50) -> str:
        w = self._worker(handle)
        return _tail(w.log, lines) if w is not None else ""

    async def read_log(self, handle: WorkerHandle, offset: int, limit: int) -> tuple[bytes, int]:
        w = self._worker(handle)
        return read_file_range(w.log, offset, limit) if w is not None else (b"", 0)

    async def remove(self, handle: WorkerHandle) -> None:
        w = self._worker(handle)
        if w is None:
            return
        if w.running():
            raise WorkerExists(f"worker {handle.worker_id} is still running")
        if w.shim is not None and w.shim.returncode is None:
            await w.shim.wait()
        # A log kept in its own log_dir outlives the worker: it is what an operator reads afterwards.
        shutil.rmtree(w.dir, ignore_errors=True)
        self._workers.pop(handle.worker_id, None)


def _tail(log: Path, lines: int = 50) -> str:
    """The last `lines` lines of a log (reading at most its last 64 KiB)."""
    if lines <= 0:
        return ""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - _TAIL_BYTES))
            data = f.read()
    except OSError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


def read_file_range(path: Path, offset: int, limit: int) -> tuple[bytes, int]:
    """At most `limit` bytes of `path` from `offset`, and its size now; (b"", 0) if it cannot be read."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(min(max(offset, 0), size))
            return f.read(max(limit, 0)), size
    except OSError:
        return b"", 0
