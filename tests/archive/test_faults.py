"""#28 acceptance 3: the archiver under faults, checked by tests/archive/segcheck.py (which does not import
events/archive.py) against the stream as nats-py alone reads it.

- killed -9 at 10 random points while it writes: after every restart the archive is the stream's prefix,
  no gap, no duplicate;
- its disk full (a tiny tmpfs): nothing more leaves the stream, corral_archive_write_failing is 1; once
  space is back it resumes, and archive + stream still hold every position once;
- a flipped byte in a segment: readers name the file and refuse it, folding nothing of it;
- paused (SIGSTOP) past its read watchdog and segment timer, then resumed: nothing lost.

The archiver is a real `corral archive` process on a real nats-server; the log is appended to meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import re
import signal
import subprocess
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from events.bus import Bus
from events.server import NatsServer
from tests.archive.segcheck import Rec, check_prefix, read_archive, read_stream
from tests.archive.workload import append, appending, archived_and_purged, first_seq, snapshot_at_end
from tests.cli.conftest import corral, free_port
from tests.faults.services import Proc, kill
from tests.integration.harness import log_tail, start_corral, stop


def archiver(url: str, path: Path, logs: Path, *extra: str) -> Proc:
    return start_corral("--nats", url, "archive", "--path", str(path), "--segment-events", "40",
                        "--segment-seconds", "0.2", "--log-level", "info", *extra, log=logs / "archiver.log")


async def caught_up(bus: Bus, path: Path, proc: Proc, timeout: float = 30) -> list[Rec]:
    """The archive once it holds the stream's last position (the archiver still running)."""
    last = await bus.last_seq()
    async with asyncio.timeout(timeout):
        while True:
            recs = await asyncio.to_thread(read_archive, path)
            if recs and recs[-1][0] >= last:
                return recs
            assert proc.poll() is None, f"the archiver died:\n{log_tail(proc)}"
            await asyncio.sleep(0.1)


@pytest.mark.timeout(120)
async def test_killed_at_random_points_it_resumes_with_no_gap_and_no_duplicate(
        nats_server: NatsServer, bus: Bus, tmp_path: Path) -> None:
    rng = random.Random(2828)
    path = tmp_path / "archive"
    await append(bus, 0, 500)
    seen: list[list[Rec]] = []
    async with appending(bus, 500) as nxt:
        for round_ in range(1, 11):
            proc = archiver(nats_server.url, path, tmp_path)
            async with asyncio.timeout(30):  # started (an interpreter start on a busy machine takes a while) ...
                while (tmp_path / "archiver.log").read_text().count('"archiver_started"') < round_:
                    assert proc.poll() is None, f"the archiver died:\n{log_tail(proc)}"
                    await asyncio.sleep(0.02)
            await asyncio.sleep(rng.uniform(0.05, 0.8))  # ... then killed at a random point while it writes
            assert proc.poll() is None, f"the archiver died:\n{log_tail(proc)}"
            kill(proc)
            seen.append(await asyncio.to_thread(read_archive, path))
        proc = archiver(nats_server.url, path, tmp_path)
    try:
        final = await caught_up(bus, path, proc)
    finally:
        stop(proc)
    stream = await read_stream(nats_server.url)
    assert len(stream) == nxt[0], "every appended event is in the stream (nothing was purged)"
    for recs in [*seen, final]:
        check_prefix(recs, stream)
    assert len(final) == len(stream)
    assert sum(1 for a, b in itertools.pairwise(seen) if len(b) > len(a)) >= 5, \
        f"the kills landed while it was writing: {[len(r) for r in seen]}"


def _metric(port: int, name: str) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return None


@contextlib.contextmanager
def tiny_disk(where: Path, size: str = "256k") -> AsyncIterator[Path]:  # type: ignore[misc]
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        why = f"cannot mount a tmpfs for the full-disk test: {done.stderr.strip() or done.returncode}"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path) -> Path:
    """Fill `disk` to the last byte; the filler file (delete it to free the space)."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:  # unbuffered: a write that does not fit fails now, not at close
        for chunk in (b"\0" * 4096, b"\0"):
            with contextlib.suppress(OSError):
                while True:
                    f.write(chunk)
    return filler


def assert_rules_name_what_the_archiver_exposes(port: int) -> None:
    """The alert rules' corral_archive_* metrics are ones the archiver serves (the scheduler's are checked in
    tests/cli/test_metrics.py)."""
    rules = yaml.safe_load((Path(__file__).resolve().parents[2] / "deploy" / "monitoring" /
                            "prometheus-rules.yaml").read_text())
    named = {m for g in rules["groups"] for r in g["rules"] for m in re.findall(r"\bcorral_archive_[a-z_]+", r["expr"])}
    assert "corral_archive_write_failing" in named
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        exposed = {line.split()[0].split("{")[0] for line in r.read().decode().splitlines() if line[:1] != "#"}
    assert named <= exposed, f"named but not exposed by the archiver: {sorted(named - exposed)}"


@pytest.mark.timeout(90)
async def test_a_full_archive_disk_stops_retention_and_raises_the_alert(
        nats_server: NatsServer, bus: Bus, tmp_path: Path) -> None:
    port = free_port()
    with tiny_disk(tmp_path / "disk") as disk:
        path = disk / "archive"
        await append(bus, 0, 300)
        before = await read_stream(nats_server.url)
        await snapshot_at_end(bus)
        proc = archiver(nats_server.url, path, tmp_path, "--max-bytes", "1B", "--purge-every", "0.2",
                        "--metrics-port", str(port), "--metrics-host", "127.0.0.1")
        try:
            async with asyncio.timeout(30):  # archived and purged up to the snapshot
                while await first_seq(bus) <= 300:
                    assert proc.poll() is None, log_tail(proc)
                    await asyncio.sleep(0.1)
            assert await asyncio.to_thread(_metric, port, "corral_archive_write_failing") == 0
            filler = fill(disk)
            await append(bus, 300, 300)
            during = await read_stream(nats_server.url)
            await snapshot_at_end(bus)
            async with asyncio.timeout(30):
                while await asyncio.to_thread(_metric, port, "corral_archive_write_failing") != 1:
                    await asyncio.sleep(0.1)
            first = await first_seq(bus)
            await asyncio.sleep(2.0)  # ten purge rounds at least, on a stream far over its one-byte limit
            assert await first_seq(bus) == first, "retention dropped events the archive could not hold"
            assert set(during) == set(range(first, 601))
            assert (await asyncio.to_thread(_metric, port, "corral_archive_write_errors_total") or 0) >= 1
            assert "archive_write_failed" in (tmp_path / "archiver.log").read_text()
            assert_rules_name_what_the_archiver_exposes(port)

            filler.unlink()  # space is back: it writes, clears the alert and purges again
            async with asyncio.timeout(30):
                while await first_seq(bus) <= first or \
                        await asyncio.to_thread(_metric, port, "corral_archive_write_failing") != 0:
                    assert proc.poll() is None, log_tail(proc)
                    await asyncio.sleep(0.1)
            recs = await caught_up(bus, path, proc)
        finally:
            stop(proc)
        check_prefix(recs, {**before, **during})
        assert len(recs) == 600


@pytest.mark.timeout(60)
def test_a_flipped_byte_is_named_and_refused_never_folded(nats_server: NatsServer, tmp_path: Path) -> None:
    url, path = nats_server.url, tmp_path / "archive"
    asyncio.run(archived_and_purged(url, path))
    seg = path / "000000000051-000000000100.seg"
    blob = bytearray(seg.read_bytes())
    blob[len(blob) // 2] ^= 0x20
    seg.write_bytes(bytes(blob))
    arch = ("--archive", str(path))

    out = corral(*arch, "tail", "--from-seq", "1", "--no-follow", "--json", url=url, check=1)
    assert f"segment {seg}: checksum mismatch" in out.stderr, out.stderr
    printed = [int(line.split(",")[0].split(":")[1]) for line in out.stdout.splitlines()]
    assert printed == list(range(1, 51)), "the sound segment before it is read; nothing of the refused one"
    fold = corral(*arch, "replay", "--at", "#120", "--no-snapshot", "--json", url=url, check=1)
    assert f"segment {seg}: checksum mismatch" in fold.stderr and not fold.stdout
    # Positions the refused segment does not hold still read.
    assert '"seq":30' in corral(*arch, "replay", "--at", "#30", "--json", url=url).stdout.replace(" ", "")


@pytest.mark.timeout(90)
async def test_a_paused_archiver_loses_nothing(nats_server: NatsServer, bus: Bus, tmp_path: Path) -> None:
    path = tmp_path / "archive"
    await append(bus, 0, 200)
    proc = archiver(nats_server.url, path, tmp_path)
    try:
        async with appending(bus, 200, every=0.1):
            await caught_up(bus, path, proc)
            proc.send_signal(signal.SIGSTOP)
            try:
                # Past its reader's watchdog (3 missed 2 s heartbeats) and many segment timers.
                await asyncio.sleep(8.0)
            finally:
                proc.send_signal(signal.SIGCONT)
            await asyncio.sleep(1.0)
        recs = await caught_up(bus, path, proc)
    finally:
        stop(proc)
    stream = await read_stream(nats_server.url)
    check_prefix(recs, stream)
    assert len(recs) == len(stream)
