"""Reading what a child process wrote to a pseudo-terminal (tests of terminal-only output)."""

from __future__ import annotations

import os


def drain(master: int) -> bytes:
    """Everything written to the pty whose master end is `master`, until the child closes its end."""
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed its end
            break
        if not chunk:
            break
        out += chunk
    return out


def wait_exit(pid: int, master: int, what: str, timeout: float = 15) -> tuple[int, bytes]:
    """(exit code, what it wrote meanwhile) of the child `pid` on the pty `master`, read while it ends so a full
    pty never holds it up; AssertionError naming `what` after `timeout` seconds."""
    import select
    import time

    seen = b""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status), seen
        assert time.monotonic() < deadline, what
        if select.select([master], [], [], 0.2)[0]:
            try:
                seen += os.read(master, 65536)
            except OSError:
                pass


def kill_and_close(pid: int, master: int) -> None:
    """A pty child's teardown whatever state the test left it in."""
    import signal

    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
    os.close(master)
