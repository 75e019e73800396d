"""A flooding worker cannot fill the node's disk, and `corral logs` still shows its tail (issue #30 point 6).

Worker logs had no cap: 1.5 GB written unrotated. The process runtime's shim now rotates each worker's
log at a size and keeps a number of files (default 64 MiB x 4). The checks read the files on disk
themselves (sizes by os.stat while the worker floods, and after), independently of the runtime's reader.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from events.server import NatsServer
from nodeagent.runtime.process import ProcessRuntime, read_log_range
from tests.agent.runtime_helpers import spec
from tests.integration.harness import CORRAL

MAX = 64 * 1024
FILES = 3
LINES = 60_000  # ~1.2 MB of numbered lines: many rotations
FLOOD = (f"import sys\nfor i in range({LINES}):\n    sys.stdout.write(f'line {{i:08d}} ' + 'x' * 4 + '\\n')\n"
         "sys.stdout.flush()\nprint('THE END', flush=True)\n")
LINE_BYTES = len("line 00000000 xxxx\n")
TOTAL = LINES * LINE_BYTES + len("THE END\n")


def _on_disk(directory: Path, stem: str) -> int:
    """Bytes of every file of that log (the current one and its rotated segments)."""
    total = 0
    for name in os.listdir(directory):
        if name == stem or name.startswith(stem + "."):
            try:
                total += (directory / name).stat().st_size
            except FileNotFoundError:
                pass  # rotated away between listing and stat
    return total


async def test_a_flooding_worker_stays_within_its_log_limit(tmp_path: Path) -> None:
    rt = ProcessRuntime(tmp_path / "state", node_id="n1", log_max_bytes=MAX, log_files=FILES)
    h = await rt.start(spec([sys.executable, "-c", FLOOD], log_dir=str(tmp_path / "logs")))
    log_dir, stem = tmp_path / "logs", f"{h.labels.name}.log"
    peak = 0
    waiter = asyncio.ensure_future(rt.wait(h))
    while not waiter.done():
        peak = max(peak, _on_disk(log_dir, stem))
        await asyncio.sleep(0.005)
    info = await waiter
    peak = max(peak, _on_disk(log_dir, stem))
    assert info.exit_code == 0
    assert 0 < peak <= MAX * FILES, f"{peak} bytes on disk, limit {MAX * FILES}"
    assert len(os.listdir(log_dir)) <= FILES
    assert info.log_tail.splitlines()[-1] == "THE END"
    assert info.log_tail.splitlines()[-2] == f"line {LINES - 1:08d} xxxx"

    # Read as one stream: its size is everything written, the head is gone, the rest is intact.
    data, size, start = read_log_range(log_dir / stem, 0, 10 * MAX)
    assert size == TOTAL and start > 0 and size - start <= MAX * FILES
    kept = b""
    at = start
    while at < size:
        data, size, got = read_log_range(log_dir / stem, at, MAX)
        assert got == at and data
        kept += data
        at += len(data)
    first = start // LINE_BYTES + (start % LINE_BYTES > 0)
    expected = "".join(f"line {i:08d} xxxx\n" for i in range(first, LINES)) + "THE END\n"
    assert kept.decode().endswith(expected) and len(kept) == size - start


@pytest.fixture
def services(nats_server: NatsServer, tmp_path: Path) -> Iterator[str]:
    """A scheduler and an agent whose workers' logs are capped at 64 KiB x 3 files."""
    url = nats_server.url
    procs = []
    for args, name in ((["scheduler", "--nats", url], "scheduler"),
                       (["agent", "--nats", url, "--node-id", "n1", "--fake-gpus", "2", "--data-dir",
                         str(tmp_path / "agent"), "--worker-log-max-mb", str(MAX / 2**20), "--worker-log-files",
                         str(FILES)], "agent")):
        with (tmp_path / f"{name}.log").open("ab") as out:
            procs.append(subprocess.Popen([CORRAL, *args], stdout=out, stderr=subprocess.STDOUT))
    try:
        yield url
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def test_corral_logs_shows_the_tail_of_a_capped_log(services: str, tmp_path: Path) -> None:
    url = services
    script = tmp_path / "flood.py"
    script.write_text(FLOOD)
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"name": "flood", "command": [sys.executable, str(script)]}))
    env = {**os.environ, "CORRAL_NATS_URL": url}
    subprocess.run([CORRAL, "submit", str(job), "--id", "j-flood"], env=env, check=True, capture_output=True)
    deadline = time.monotonic() + 90
    while '"completed"' not in subprocess.run([CORRAL, "job", "j-flood", "--json"], env=env, capture_output=True,
                                              text=True).stdout:
        assert time.monotonic() < deadline, "j-flood did not complete"
        time.sleep(0.3)
    out = subprocess.run([CORRAL, "logs", "j-flood"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[-2:] == [f"line {LINES - 1:08d} xxxx", "THE END"]
    assert len(out.stdout) <= MAX * FILES
    assert "dropped by the node's log size limit" in out.stderr
    logs = tmp_path / "agent" / "n1" / "logs"
    assert sum(p.stat().st_size for p in logs.iterdir()) <= MAX * FILES
