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
