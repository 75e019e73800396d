#!/usr/bin/env python3
"""examples/worker.py plus a GPU ledger: when this worker held which (fake) GPUs.

The log says which gang owns a GPU; only the workers know when a process
really used one. Each worker appends a "start" line when it begins and an
"end" line when it exits (normally or on SIGTERM) to $FAULT_LEDGER, with a
system-wide monotonic timestamp, so a test can check that no two processes
ever held the same GPU of the same node at the same time, including a stale
worker that a partitioned or restarted agent stops late.

$FAULT_TERM_DELAY (seconds) makes SIGTERM slow, like a real trainer flushing
state before it exits: exactly the window in which a GPU could be handed to
the next worker too early.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import time
from pathlib import Path

WORKER = Path(__file__).resolve().parents[2] / "examples" / "worker.py"


def record(what: str, how: str = "") -> None:
    env = os.environ
    line = json.dumps({
        "what": what, "how": how, "t": time.monotonic(), "pid": os.getpid(), "job": env.get("CORRAL_JOB_ID"),
        "attempt": int(env.get("CORRAL_ATTEMPT", "0")), "rank": int(env.get("RANK", "0")),
        "gpus": env.get("CUDA_VISIBLE_DEVICES", ""),
    })  # fmt: skip
    fd = os.open(env["FAULT_LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())  # one write(2) with O_APPEND: lines never interleave
    finally:
        os.close(fd)


def on_term(signum: int, frame: object) -> None:
    time.sleep(float(os.environ.get("FAULT_TERM_DELAY", "0")))
    record("end", "signal")
    os._exit(128 + signum)


def main() -> int:
    spec = importlib.util.spec_from_file_location("corral_example_worker", WORKER)
    assert spec is not None and spec.loader is not None
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    record("start")
    signal.signal(signal.SIGTERM, on_term)
    try:
        return int(worker.main(sys.argv[1:]))
    finally:
        record("end", "exit")


if __name__ == "__main__":
    sys.exit(main())
