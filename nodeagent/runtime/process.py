"""Workers as local processes: the embedded default (`corral up`) and the tests.

Each worker lives in `state_dir/<labels.name>/`:
- meta.json  labels, command, log path, the shim's pid and start ticks;
- child.json the worker's pid (= its process group) and start ticks, from the shim;
- exit.json  exit code or signal, from the shim, written the moment the worker ends;
- log        stdout + stderr (unless WorkerSpec.log_dir puts it elsewhere).
Start ticks from /proc/<pid>/stat guard against pid reuse: a recycled pid
never matches, so a new runtime object (after an agent restart) neither
signals a stranger nor mistakes one for its worker.

Killing reaches every descendant, also one that left the worker's process
group (`setsid`): the shim keeps them in its process tree (it is a child
subreaper) and, where a cgroup v2 is writable, in a cgroup of their own
(runtime/shim.py). `kill_scope` says which this runtime uses; `child.json`
says which holds each worker. Signals other than SIGKILL (the checkpoint
signal, SIGTERM) go to the worker's process group, as before.

A worker's output is capped: the shim rotates its log at `log_max_bytes`
and keeps `log_files` files (default 64 MiB x 4 = 256 MiB per worker), the
older ones as segments named by their first byte's offset; `read_log_range`
reads them as one stream whose head may be gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import signal as signals
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

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
from nodeagent.runtime.shim import LOG_FILES, LOG_MAX_BYTES, kill_cgroup, kill_tree, proc_start_ticks, segments
from nodeagent.runtime.stdin_fifo import InputClosed, frames, taken, write_frames

_log = structlog.get_logger("corral.agent")

SHIM = Path(__file__).with_name("shim.py")
#: How long start() waits for the shim to report the worker's pid.
START_TIMEOUT_S = 15.0
_TAIL_BYTES = 64 * 1024
#: The FIFO in a worker's state dir that its shim relays to an interactive worker's stdin (runtime/stdin_fifo.py).
STDIN_FIFO = "stdin"


def _cgroup2_mount() -> Path | None:
    """Where the unified (v2) cgroup hierarchy is mounted, if it is."""
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                pre, _, post = line.partition(" - ")
                if post.split()[:1] == ["cgroup2"]:
                    return Path(pre.split()[4])
    except OSError:
        pass
    return None


def cgroup_base(name: str) -> Path | None:
    """A cgroup v2 directory under this process's own cgroup where worker cgroups can be made, or None.

    Usable only if it can be created and its `cgroup.procs` written (a root agent, or a delegated
    subtree); anything else (v1 only, read-only /sys/fs/cgroup, no delegation) -> None.
    """
    mount = _cgroup2_mount()
    if mount is None:
        return None
    try:
        with open("/proc/self/cgroup") as f:
            own = next((line[3:].strip() for line in f if line.startswith("0::")), None)
    except OSError:
        return None
    if own is None:
        return None
    base = mount / own.lstrip("/") / name
    try:
        base.mkdir(parents=True, exist_ok=True)
        probe = base / f"probe-{os.getpid()}"
        probe.mkdir(exist_ok=True)
        ok = os.access(probe / "cgroup.procs", os.W_OK)
        probe.rmdir()
    except OSError:
        return None
    with contextlib.suppress(OSError):
        base.rmdir()  # made again by the first worker's start; the shim removes both once empty
    return base if ok else None


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
        self, state_dir: str | Path, *, node_id: str | None = None, inherit_env: bool = True, poll_s: float = 0.05,
        cgroups: bool = True, log_max_bytes: int = LOG_MAX_BYTES, log_files: int = LOG_FILES,
    ) -> None:
        """`node_id` scopes adopt() (simulated nodes share a machine); `inherit_env` puts this process's
        environment under each worker's own env (tests that run the runtime alone; an agent passes False
        and gives each worker its full env, nodeagent/rank_env.py: `node_env`); `cgroups`: put each
        worker in a cgroup v2 where one is writable (False: the process tree only); `log_max_bytes` x
        `log_files`: the most of a worker's output kept on disk (module docstring)."""
        if log_max_bytes < 1 or log_files < 2:
            raise ValueError(f"worker logs need at least 1 byte x 2 files, not {log_max_bytes} x {log_files}")
        self.log_max_bytes = log_max_bytes
        self.log_files = log_files
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.node_id = node_id
        self.inherit_env = inherit_env
        self.poll_s = poll_s
        self._workers: dict[str, _Worker] = {}
        # Named after the state dir: the same across agent restarts (adopted workers), distinct per runtime.
        tag = hashlib.sha256(str(self.state_dir.resolve()).encode()).hexdigest()[:12]
        self.cgroups = cgroup_base(f"corral-{tag}") if cgroups else None
        #: What a kill reaches (module docstring): told once, so an operator knows which holds.
        self.kill_scope = (f"cgroup v2 under {self.cgroups}" if self.cgroups is not None
                           else "process tree (the shim is a subreaper)")
        _log.info("process_runtime", kill_scope=self.kill_scope, log_limit=f"{log_max_bytes} bytes x {log_files} files")

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
        for _, stale in segments(str(log)):  # a previous run's under the same name (its state dir was removed)
            with contextlib.suppress(OSError):
                os.unlink(stale)
        if spec.checkpoint_dir:
            Path(spec.checkpoint_dir).mkdir(parents=True, exist_ok=True)
        meta: dict[str, Any] = {
            "labels": {"node_id": labels.node_id, "job_id": labels.job_id, "attempt": labels.attempt,
                       "rank": labels.rank, "restarts": labels.restarts},
            "command": list(spec.command),
            "log": str(log),
            "created_at": time.time(),
        }  # fmt: skip
        cgroup: list[str] = []
        if self.cgroups is not None:
            with contextlib.suppress(OSError):
                (self.cgroups / wid).mkdir(parents=True, exist_ok=True)
                cgroup = ["--cgroup", str(self.cgroups / wid)]
                meta["cgroup"] = cgroup[1]
        stdin: list[str] = []
        if spec.stdin in ("pipe", "pty"):  # an interactive rank 0: its input comes through this FIFO (send_input)
            os.mkfifo(wdir / STDIN_FIFO, 0o600)
            stdin = ["--stdin", str(wdir / STDIN_FIFO), *(["--pty", "1"] if spec.stdin == "pty" else [])]
        _write_json(wdir / "meta.json", meta)  # before the spawn: an agent dying right after still finds it
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-S", str(SHIM), str(wdir), str(log), *cgroup,
            "--log-max", str(self.log_max_bytes), "--log-files", str(self.log_files), *stdin, "--", *spec.command,
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
        if sig == signals.SIGKILL and w is not None:
            await asyncio.to_thread(self._kill_everything, w)

    async def stop(self, handle: WorkerHandle, grace_s: float) -> ExitInfo:
        info = await stop_with_grace(self, handle, grace_s)
        w = self._worker(handle)
        if w is not None:
            # Stragglers the worker forked, in its group or out of it, still hold GPUs: end them too
            # (in a thread: without /proc children files, finding them reads every /proc/<pid>/stat).
            await asyncio.to_thread(self._kill_everything, w)
        return info

    def _kill_everything(self, w: _Worker) -> None:
        """SIGKILL the worker's group, every descendant of its shim, and its cgroup (module docstring)."""
        child = w.child() or {}
        with contextlib.suppress(ProcessLookupError, PermissionError, KeyError, TypeError):
            os.killpg(child["pid"], signals.SIGKILL)
        meta = w.meta() or {}
        if isinstance(meta.get("cgroup"), str):
            kill_cgroup(meta["cgroup"])
        shim = meta.get("shim_pid")
        if isinstance(shim, int) and _alive(shim, meta.get("shim_start_ticks")):
            kill_tree(shim)

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
        if w is None:
            return b"", 0
        data, size, _ = read_log_range(w.log, offset, limit)
        return data, size

    async def send_input(self, handle: WorkerHandle, data: bytes, *, eof: bool = False, rows: int = 0,
                         cols: int = 0) -> int:
        """Give the worker's stdin `data` (then its end, with `eof`; a pty's size first); how many bytes of
        `data` it took: fewer when it does not read (busy: send the rest later). InputClosed when it takes no
        input (not interactive) or ended. The end is written only after all of `data`."""
        w = self._worker(handle)
        if w is None or not w.running():
            raise InputClosed("the worker is not running")
        out = frames(data, eof=eof, rows=rows, cols=cols)
        return taken(out, await write_frames(w.dir / STDIN_FIFO, out))

    async def remove(self, handle: WorkerHandle) -> None:
        w = self._worker(handle)
        if w is None:
            return
        if w.running():
            raise WorkerExists(f"worker {handle.worker_id} is still running")
        if w.shim is not None and w.shim.returncode is None:
            await w.shim.wait()
        cgroup = (w.meta() or {}).get("cgroup")
        if isinstance(cgroup, str):
            with contextlib.suppress(OSError):
                os.rmdir(cgroup)  # empty once everything in it ended
                os.rmdir(os.path.dirname(cgroup))  # the runtime's own, once it holds no worker (start remakes it)
        # A log kept in its own log_dir outlives the worker: it is what an operator reads afterwards.
        shutil.rmtree(w.dir, ignore_errors=True)
        self._workers.pop(handle.worker_id, None)


def _tail(log: Path, lines: int = 50) -> str:
    """The last `lines` lines of a log (reading at most its last 64 KiB, across a rotation)."""
    if lines <= 0:
        return ""
    _, size, _ = read_log_range(log, 0, 0)
    data = b""
    at = max(0, size - _TAIL_BYTES)
    while at < size:
        chunk, size, got_at = read_log_range(log, at, size - at)
        if not chunk:
            break
        if got_at > at and data:  # the head moved while reading: start again from what is there
            data = b""
        data += chunk
        at = got_at + len(chunk)
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


def read_log_range(path: Path, offset: int, limit: int) -> tuple[bytes, int, int]:
    """At most `limit` bytes of a rotated log (shim.py) from `offset`: (data, the stream's size now, where
    the data starts). The stream is the kept segments, then `path`; `offset` before the oldest kept byte
    reads from there (the returned start says how much was dropped). (b"", 0, 0) if nothing can be read.

    A rotation between listing the files and reading them is seen (the newest segment changed) and read again.
    """
    for _ in range(5):
        segs = segments(str(path))
        pieces: list[tuple[int, str]] = []
        start = 0
        try:
            for seg_start, seg in segs:
                pieces.append((seg_start, seg))
                start = seg_start + os.path.getsize(seg)
            pieces.append((start, str(path)))
            with open(path, "rb") as f:
                current = f.seek(0, os.SEEK_END)
                size = start + current
                at = min(max(offset, pieces[0][0]), size)
                data = b""
                for i, (piece_start, piece) in enumerate(pieces):
                    end = pieces[i + 1][0] if i + 1 < len(pieces) else size
                    if piece_start <= at < end or (at == size and i == len(pieces) - 1):
                        if piece == str(path):
                            f.seek(at - piece_start)
                            data = f.read(max(0, min(limit, end - at)))
                        else:
                            with open(piece, "rb") as g:
                                g.seek(at - piece_start)
                                data = g.read(max(0, min(limit, end - at)))
                        break
        except FileNotFoundError:
            continue  # rotated (or a segment deleted) meanwhile
        except OSError:
            return b"", 0, 0
        if segments(str(path))[-1:] == segs[-1:]:
            return data, size, at
    return b"", 0, 0


def read_file_range(path: Path, offset: int, limit: int) -> tuple[bytes, int]:
    """At most `limit` bytes of `path` from `offset`, and its size now; (b"", 0) if it cannot be read."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(min(max(offset, 0), size))
            return f.read(max(limit, 0)), size
    except OSError:
        return b"", 0
