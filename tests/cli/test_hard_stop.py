"""A service whose stop hangs still ends: it logs where it was stuck and exits (orchestrator/cli/hard_stop.py).

A real process runs `until_signalled` on a service that swallows its cancellation;
SIGTERM must end it (exit 0) with a `stop_stuck` line naming the stuck task and the
threads' stacks. Without the hard stop it runs on and the wait below times out.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SERVICE = """
import asyncio, sys, threading
from orchestrator.cli import hard_stop
from orchestrator.cli.services import until_signalled
from orchestrator.logging import configure_logging

hard_stop.STOP_GRACE_S = 1.0
configure_logging("info")

async def stubborn_service():
    print("ready", flush=True)
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass  # a stop swallowed somewhere inside (nats-py's waits did, on 3.11)

asyncio.run(until_signalled(stubborn_service()))
"""


def test_a_stop_that_hangs_ends_within_the_grace_and_says_where() -> None:
    proc = subprocess.Popen([sys.executable, "-c", SERVICE], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = proc.stdout.read()
    assert code == 0, out
    assert "stop_stuck" in out and "stubborn_service" in out and "MainThread" in out, out


UP = """
import asyncio, sys
from orchestrator.cli import hard_stop, main, services

hard_stop.STOP_GRACE_S = 1.0

async def stubborn_cluster(args, bus, data, url, stop):
    print("ready", flush=True)
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass

services._run_cluster = stubborn_cluster
sys.exit(main(["up", "--port", "0", "--data-dir", sys.argv[1], "--log-level", "info"]))
"""


def test_corral_up_whose_stop_hangs_ends_too(tmp_path: Path) -> None:
    """`corral up` (its own signal handling, Ctrl-C as in tests/cli/conftest.py) has the same hard stop.

    Its first Ctrl-C asks for a graceful stop (workers checkpoint first, cli/stop_signals.py), which a
    cluster that hangs never runs; the second, which forces the stop, says so and ends it within the grace."""
    proc = subprocess.Popen([sys.executable, "-c", UP, str(tmp_path / "up")], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(2)]
        assert lines[-1].strip() == "ready", lines
        proc.send_signal(signal.SIGINT)
        lines.append(proc.stdout.readline())
        assert "stopping: jobs checkpoint" in lines[-1] and "Ctrl-C again to stop now" in lines[-1], lines
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = proc.stdout.read()
    assert code == 0, out
    assert "corral up: stopping now (second Ctrl-C)" in out, out
    assert "stop_stuck" in out and "run_up" in out and '"grace_s": 1.0' in out, out
