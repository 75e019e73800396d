"""Runs one worker and records how it ended, even when the agent is not there to see it.

Started by the process runtime as
`python -I -S shim.py WORKER_DIR LOG_PATH [--cgroup DIR] [--log-max BYTES] [--log-files N] [--stdin FIFO
[--pty 1]] -- cmd...`
(stdlib only, run by path, so the worker's own PYTHONPATH cannot break it).
The worker gets its own session, hence its own process group: the agent
signals that group, never the shim, so the shim survives even SIGKILL of the
worker and writes `exit.json`. Files are written via tmp + rename so a reader
never sees half a record.

A worker's descendant may leave that group (`setsid`, a daemon's double fork),
so killing the group does not reach every descendant. Two scopes reach them:
- the process tree: the shim is a child subreaper (prctl), so an orphaned
  descendant is re-parented to the shim instead of init and stays in its tree;
  `kill_tree` kills every live descendant of the shim. Works on any Linux.
- a cgroup v2 (`--cgroup DIR`, where the runtime found one writable): the worker
  is moved into it before it runs, and `cgroup.kill` (or SIGKILL to each member)
  ends everything in it, even a process that escaped the tree some other way.
`child.json` says which one holds the worker (`kill_scope`). When the worker
ends, the shim kills what it left behind (a container's semantics: GPUs are free
once its exit is recorded), reaps it, and only then writes `exit.json`.

The worker's stdout and stderr go through a pipe to the shim, which appends
them to LOG_PATH and rotates it at `--log-max` bytes: the full file becomes a
segment `LOG_PATH.seg-<offset of its first byte, 16 digits>` and at most
`--log-files` files are kept (the oldest segment is deleted), so one worker's
output never takes more than BYTES x N on disk however much it writes. The
segment names keep absolute offsets, so a reader (`corral logs`, which reads
from an offset) sees one stream whose head may have been dropped
(process.py, `read_log_range`).

A worker of an interactive job's rank 0 (`--stdin FIFO`) reads what the agent
writes into FIFO (runtime/stdin_frames.py: frames of data, end of input, window
size): the shim holds the FIFO open for reading and writing, so neither an agent
that is not there yet nor one that restarts ends the input, and relays the
frames to the worker's stdin -- a pipe closed at the end-of-input frame, or
with `--pty 1` a pseudo-terminal that is also its stdout, stderr and
controlling terminal (its output reaches the log as above; a window-size
frame resizes it, and the kernel sends the worker SIGWINCH).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import struct
import subprocess
import sys
import termios
import threading
import time

#: prctl(2) option: orphaned descendants are re-parented to this process, not init.
PR_SET_CHILD_SUBREAPER = 36
#: Rounds of "list the descendants, SIGKILL them" before giving up (each round catches what forked meanwhile).
KILL_ROUNDS = 50
#: Defaults of the log limit: 64 MiB per file, 4 files (the current one and 3 segments): 256 MiB per worker.
LOG_MAX_BYTES = 64 * 1024 * 1024
LOG_FILES = 4
SEGMENT = ".seg-"
_READ = 64 * 1024


def segment_name(log_path: str, start: int) -> str:
    return f"{log_path}{SEGMENT}{start:016d}"


def segments(log_path: str) -> list[tuple[int, str]]:
    """(start offset, path) of the closed segments of `log_path`, oldest first."""
    d, base = os.path.split(log_path)
    prefix = base + SEGMENT
    out = []
    try:
        names = os.listdir(d or ".")
    except OSError:
        return []
    for name in names:
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            out.append((int(name[len(prefix):]), os.path.join(d, name)))
    return sorted(out)


class RotatingLog:
    """Appends to `path`; at `max_bytes` it closes the file as a segment and starts a new one, keeping `files`."""

    def __init__(self, path: str, max_bytes: int, files: int) -> None:
        self.path = path
        self.max_bytes = max(1, max_bytes)
        self.files = max(2, files)  # the newest segment tells where the current file starts
        segs = segments(path)
        self.start = segs[-1][0] + os.path.getsize(segs[-1][1]) if segs else 0
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.size = os.fstat(self.fd).st_size

    def write(self, data: bytes) -> None:
        while data:
            room = self.max_bytes - self.size
            if room <= 0:
                self._rotate()
                continue
            n = os.write(self.fd, data[:room])
            self.size += n
            data = data[n:]

    def _rotate(self) -> None:
        os.close(self.fd)
        os.rename(self.path, segment_name(self.path, self.start))
        self.start += self.size
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC, 0o644)
        self.size = 0
        for _, old in segments(self.path)[: -(self.files - 1)]:
            try:
                os.unlink(old)
            except OSError:
                pass

    def close(self) -> None:
        os.close(self.fd)


def _copy(src: int, log: RotatingLog) -> None:
    """Worker output -> the rotating log, until every writer closed the pipe."""
    try:
        while True:
            try:
                data = os.read(src, _READ)
            except InterruptedError:
                continue
            except OSError as e:
                if e.errno == errno.EIO:  # a pty whose every slave end closed: its EOF
                    return
                raise
            if not data:
                return
            try:
                log.write(data)
            except OSError:
                pass  # a full disk: drop output rather than block the worker on a full pipe
    finally:
        os.close(src)


def _write(path: str, data: dict[str, object]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the comm field (field 3 onwards), None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # comm (field 2) may hold spaces and parens: split after the last ')'
    return stat[stat.rindex(")") + 2 :].split()


def proc_start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (start time since boot): tells a pid from its reuse."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields is not None else None


def _children(pid: int) -> list[int] | None:
    """Live children of `pid` from /proc/<pid>/task/*/children; None where the kernel lacks that file."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
        except FileNotFoundError:
            return None
        except OSError:
            continue
    return out


def descendants(root: int) -> list[int]:
    """Every live (not zombie) descendant of `root`, `root` excluded."""
    parents: dict[int, list[int]] | None = None
    found: list[int] = []
    todo = [root]
    while todo:
        pid = todo.pop()
        kids = _children(pid)
        if kids is None:  # no children files (CONFIG_PROC_CHILDREN off): one scan of /proc for parent links
            if parents is None:
                parents = _parent_map()
            kids = parents.get(pid, [])
        for kid in kids:
            fields = _stat_fields(kid)
            if fields is None:
                continue
            todo.append(kid)
            if fields[0] != "Z":
                found.append(kid)
    return found


def _parent_map() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat_fields(int(name))
            if fields is not None:
                out.setdefault(int(fields[1]), []).append(int(name))
    return out


def kill_tree(root: int) -> int:
    """SIGKILL every descendant of `root` (not `root`) until none is left; how many were signalled."""
    killed = 0
    for _ in range(KILL_ROUNDS):
        pids = descendants(root)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)
    return killed


def kill_cgroup(cgroup: str) -> None:
    """Kill everything in a cgroup v2: `cgroup.kill` (Linux 5.14+), else SIGKILL each member until it is empty."""
    try:
        with open(os.path.join(cgroup, "cgroup.kill"), "w") as f:
            f.write("1")
        return
    except OSError:
        pass
    for _ in range(KILL_ROUNDS):
        try:
            with open(os.path.join(cgroup, "cgroup.procs")) as f:
                pids = [int(p) for p in f.read().split()]
        except OSError:
            return
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)


def _become_subreaper() -> bool:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _in_cgroup(pid: int, cgroup: str) -> bool:
    """Whether `pid`'s cgroup v2 path is the one `cgroup` (a directory of the cgroup2 mount) names."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            line = next((x for x in f.read().splitlines() if x.startswith("0::")), "")
    except OSError:
        return False
    path = line[3:]
    return bool(path) and path != "/" and cgroup.rstrip("/").endswith(path.rstrip("/"))


def _reap_rest(deadline_s: float = 5.0) -> None:
    """Reap every child left (killed descendants re-parented to us) so none lingers as a zombie."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.01)


def _remove_cgroup(cgroup: str | None) -> None:
    """The worker's cgroup, then the runtime's if no other worker uses it: both empty once everything ended."""
    if cgroup is not None:
        for empty in (cgroup, os.path.dirname(cgroup)):
            try:
                os.rmdir(empty)
            except OSError:
                break


def _parse(argv: list[str]) -> tuple[str, str, dict[str, str], list[str]] | None:
    if len(argv) < 4 or "--" not in argv[2:]:
        return None
    sep = argv.index("--", 2)
    opts, cmd = argv[2:sep], argv[sep + 1 :]
    if len(opts) % 2 or not cmd:
        return None
    named = dict(zip(opts[::2], opts[1::2], strict=True))
    if not set(named) <= {"--cgroup", "--log-max", "--log-files", "--stdin", "--pty"}:
        return None
    return argv[0], argv[1], named, cmd


#: Frame kinds in the stdin FIFO (runtime/stdin_frames.py writes them): a 1-byte kind, a 4-byte big-endian length.
DATA, EOF, WINSIZE = b"D", b"E", b"W"
HEADER = 5


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def _relay_input(fifo: int, target: int, pty: bool) -> None:
    """Frames from the agent -> the worker's stdin (a pipe, or the pty's master side), until the shim ends."""
    buf = b""
    open_ = True
    while True:
        try:
            data = os.read(fifo, _READ)
        except InterruptedError:
            continue
        except OSError:
            return
        if not data:
            return
        buf += data
        while len(buf) >= HEADER:
            kind, size = buf[:1], int.from_bytes(buf[1:HEADER], "big")
            if len(buf) < HEADER + size:
                break
            payload, buf = buf[HEADER:HEADER + size], buf[HEADER + size:]
            try:
                if kind == DATA and open_:
                    _write_all(target, payload)
                elif kind == EOF and open_:
                    if pty:
                        _write_all(target, b"\x04")  # ^D: the terminal's end of input
                    else:
                        os.close(target)
                        open_ = False
                elif kind == WINSIZE and pty and size == 4:
                    rows, cols = struct.unpack(">HH", payload)
                    fcntl.ioctl(target, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
            except OSError:  # the worker closed its stdin, or exited: drop what it will never read
                if not pty and open_:
                    try:
                        os.close(target)
                    except OSError:
                        pass
                open_ = False


def main(argv: list[str]) -> int:
    parsed = _parse(argv)
    if parsed is None:
        print("usage: shim.py WORKER_DIR LOG_PATH [--cgroup DIR] [--log-max BYTES] [--log-files N] -- COMMAND...",
              file=sys.stderr)
        return 2
    wdir, log_path, opts, cmd = parsed
    cgroup = opts.get("--cgroup")
    subreaper = _become_subreaper()

    def into_cgroup() -> None:  # in the child, before exec: nothing it starts is outside the cgroup
        if cgroup is not None:
            try:
                with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                    f.write(str(os.getpid()))
            except OSError:
                pass  # not moved: child.json then says the process tree is the scope

    pty = opts.get("--pty") == "1"

    def prepare() -> None:  # in the child, before exec
        into_cgroup()
        if pty:  # its own session (start_new_session) gets the pty as its controlling terminal
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    log = RotatingLog(log_path, int(opts.get("--log-max", LOG_MAX_BYTES)), int(opts.get("--log-files", LOG_FILES)))
    fifo = os.open(opts["--stdin"], os.O_RDWR) if "--stdin" in opts else None  # RDWR: no writer is no EOF
    stdin_target: int | None = None
    stdin: int = subprocess.DEVNULL
    if pty:
        read_end, write_end = os.openpty()  # (master, slave): the worker's terminal, and ours to read and write
        stdin = write_end
        stdin_target = os.dup(read_end)
    else:
        read_end, write_end = os.pipe()
        if fifo is not None:
            stdin, stdin_target = os.pipe()
    try:
        try:
            child = subprocess.Popen(cmd, stdin=stdin, stdout=write_end, stderr=write_end, start_new_session=True,
                                     preexec_fn=prepare if cgroup is not None or pty else None)
        except (OSError, subprocess.SubprocessError) as e:
            log.write(f"corral: cannot start {cmd[0]!r}: {e}\n".encode())
            _remove_cgroup(cgroup)
            _write(os.path.join(wdir, "exit.json"), {"exit_code": 127, "signal": None, "error": str(e)})
            return 127
        finally:
            os.close(write_end)  # the worker (and what it starts) holds the only write end now
            if stdin != subprocess.DEVNULL and not pty:
                os.close(stdin)
        copier = threading.Thread(target=_copy, args=(read_end, log), daemon=True)
        copier.start()
        if fifo is not None and stdin_target is not None:
            threading.Thread(target=_relay_input, args=(fifo, stdin_target, pty), daemon=True).start()
        in_cgroup = cgroup is not None and _in_cgroup(child.pid, cgroup)
        scope = f"cgroup {cgroup}" if in_cgroup else "process tree" + (" (subreaper)" if subreaper else "")
        _write(os.path.join(wdir, "child.json"),
               {"pid": child.pid, "start_ticks": proc_start_ticks(child.pid), "kill_scope": scope})  # fmt: skip
        status = 0
        while True:  # reap everything re-parented to us meanwhile; stop when the worker itself ends
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:  # cannot happen while the worker lives; be safe
                status = 0
                break
            if pid == child.pid:
                break
        child.returncode = os.waitstatus_to_exitcode(status)
        # The worker ended: what it left behind goes too, before its exit is recorded.
        if in_cgroup and cgroup is not None:
            kill_cgroup(cgroup)
        kill_tree(os.getpid())
        _reap_rest()
        copier.join(10.0)  # every writer is gone: the pipe drains to EOF
    finally:
        log.close()
    _remove_cgroup(cgroup)
    rc = child.returncode
    sig = -rc if rc < 0 else None
    _write(os.path.join(wdir, "exit.json"), {"exit_code": None if sig else rc, "signal": sig})
    return 128 + sig if sig else rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
