"""Runs one worker and records how it ended, even when the agent is not there to see it.

Started by the process runtime as `python -I -S shim.py WORKER_DIR LOG_PATH -- cmd...`
(stdlib only, run by path, so the worker's own PYTHONPATH cannot break it).
The worker gets its own session, hence its own process group: the agent
signals that group, never the shim, so the shim survives even SIGKILL of the
worker and writes `exit.json`. Files are written via tmp + rename so a reader
never sees half a record.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


def _write(path: str, data: dict[str, object]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def proc_start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (start time since boot): tells a pid from its reuse."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # comm (field 2) may hold spaces and parens: split after the last ')'
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: shim.py WORKER_DIR LOG_PATH -- COMMAND...", file=sys.stderr)
        return 2
    wdir, log_path, cmd = argv[0], argv[1], argv[3:]
    with open(log_path, "ab", buffering=0) as log:
        try:
            child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        except OSError as e:
            log.write(f"corral: cannot start {cmd[0]!r}: {e}\n".encode())
            _write(os.path.join(wdir, "exit.json"), {"exit_code": 127, "signal": None, "error": str(e)})
            return 127
        _write(os.path.join(wdir, "child.json"), {"pid": child.pid, "start_ticks": proc_start_ticks(child.pid)})
        rc = child.wait()
    sig = -rc if rc < 0 else None
    _write(os.path.join(wdir, "exit.json"), {"exit_code": None if sig else rc, "signal": sig})
    return 128 + sig if sig else rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
