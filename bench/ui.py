"""What the web UI (#43) costs: first-byte latency, CPU per live browser on a long history, and the scheduler.

    python bench/ui.py [--jobs 50000 | --log events-corral.jsonl] [--seconds 20] [--clients 50]

Acceptance 2 of #43, in two parts, each with real processes:

1. A long history: a `corral sim` log of --jobs jobs (or --log) loaded into a fresh stream
   (bench/history.py's loader: its clock moved so it ends now), then `corral ui` started on it.
   Reported: the UI's start (process start to listening: the fold of the whole log, no snapshot
   exists), the time to first byte of `/` and of `/api/overview` (the full live view; --requests
   each, p50/p99), and the UI process's CPU (its /proc counters over --seconds) while a job is
   submitted every 1/--rate s, with 0, 1 and --clients browsers on the live stream (raw
   server-sent-event readers), and how long a submitted job took to appear in a browser's stream.
2. The scheduler beside the UI: `corral up --runtime simulated` (UI inside, the embedded default),
   --up-jobs short jobs (`sleep 0.5`) submitted at --up-rate per second, with 0 then --clients then
   0 browsers open: decide p99 (from the scheduler's corral_decide_seconds histogram: a bucket's
   upper bound) and submit-to-reserved latency p50/p99 (from the log's stream times).

Progress goes to stderr; the figures are one JSON object on the last stdout line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import aclosing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.history import Children, child_env, corral_argv, free_port, generate, load, note, process_cpu_s  # noqa: E402
from events.bus import Bus  # noqa: E402
from events.sdk import Client  # noqa: E402
from events.server import NatsServer  # noqa: E402
from schemas import GangReserved, JobSubmitted  # noqa: E402


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))]


def ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1000, 2)


def first_byte(host: str, port: int, path: str) -> float:
    """Seconds from sending the request (connected) to the response's first byte."""
    with socket.create_connection((host, port), timeout=30) as s:
        t = time.perf_counter()
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
        s.recv(1)
        took = time.perf_counter() - t
        while s.recv(65536):
            pass
    return took


class Browsers:
    """`n` raw readers of /api/live; one of them notes when each job id first appears in the stream."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.tasks: list[asyncio.Task[None]] = []
        self.seen: dict[str, float] = {}
        self.watch: set[str] = set()
        self.bytes = 0

    async def _read(self, probe: bool) -> None:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        writer.write(f"GET /api/live HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n\r\n".encode())
        await writer.drain()
        try:
            while True:
                chunk = await reader.read(1 << 16)
                if not chunk:
                    return
                self.bytes += len(chunk)
                if probe and self.watch:
                    now = time.perf_counter()
                    for jid in [j for j in self.watch if f'"id":"{j}"'.encode() in chunk]:
                        self.seen[jid] = now
                        self.watch.discard(jid)
        finally:
            writer.close()

    async def open(self, n: int) -> None:
        for i in range(n):
            self.tasks.append(asyncio.create_task(self._read(probe=i == 0)))
        await asyncio.sleep(1.0)  # connected, full views read

    async def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks = []


async def trickle(url: str, rate: float, seconds: float, browsers: Browsers | None, tag: str) -> dict[str, float]:
    """Submit a job every 1/rate s for `seconds`; when each appeared in the probe's stream (seconds after)."""
    bus = await Bus.connect(url, name="bench-ui")
    submitted: dict[str, float] = {}
    try:
        client = Client(bus)
        end = time.perf_counter() + seconds
        i = 0
        while time.perf_counter() < end:
            jid = f"ui-{tag}-{i}"
            if browsers is not None:
                browsers.watch.add(jid)
            submitted[jid] = time.perf_counter()
            await client.submit({"name": "bench-ui", "command": ["sleep", "1000"]}, job_id=jid)
            i += 1
            await asyncio.sleep(1 / rate)
        await asyncio.sleep(1.0)
    finally:
        await bus.close()
    if browsers is None:
        return {}
    return {j: browsers.seen[j] - t for j, t in submitted.items() if j in browsers.seen}


async def live_cpu(url: str, pid: int, host: str, port: int, clients: int, a: argparse.Namespace,
                   tag: str) -> dict[str, Any]:
    browsers = Browsers(host, port)
    await browsers.open(clients)
    cpu0, t0 = process_cpu_s(pid), time.perf_counter()
    seen = await trickle(url, a.rate, a.seconds, browsers if clients else None, tag)
    cpu1, t1 = process_cpu_s(pid), time.perf_counter()
    received = browsers.bytes
    await browsers.close()
    assert cpu0 is not None and cpu1 is not None
    out: dict[str, Any] = {"clients": clients, "cpu_pct": round(100 * (cpu1 - cpu0) / (t1 - t0), 2),
                           "stream_kb": round(received / 1024, 1)}
    if clients:
        lat = list(seen.values())
        out["appear_ms"] = {"p50": ms(pct(lat, 50)), "max": ms(max(lat) if lat else None), "jobs": len(lat)}
    return out


def history_part(a: argparse.Namespace, tmp: Path, children: Children) -> dict[str, Any]:
    server = NatsServer(tmp / "nats", port=None)
    server.start()
    try:
        log = Path(a.log) if a.log else generate(a.jobs, tmp / "sim", children, a.timeout)
        note(f"loading {log} ...")
        facts, load_s = asyncio.run(load(server.url, log, 2000))
        note(f"loaded {facts.events:,} events ({facts.jobs:,} jobs) in {load_s:.1f} s; starting corral ui")
        port = free_port()
        t = time.perf_counter()
        ui = children.popen(corral_argv("ui", "--nats", server.url, "--port", str(port)), stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, cwd=ROOT, env=child_env())
        assert ui.stdout is not None
        line = ui.stdout.readline().decode()
        if "corral ui: http" not in line:
            raise RuntimeError(f"corral ui did not start: {line!r}")
        start_s = time.perf_counter() - t
        start_cpu = process_cpu_s(ui.pid)
        note(f"corral ui listening after {start_s:.1f} s; first bytes ...")
        fb: dict[str, Any] = {}
        for path in ("/", "/api/overview"):
            times = [first_byte("127.0.0.1", port, path) for _ in range(a.requests)]
            fb[path] = {"p50_ms": ms(statistics.median(times)), "p99_ms": ms(pct(times, 99))}
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/overview", timeout=30) as r:
            overview_kb = round(len(r.read()) / 1024, 1)
        live = []
        for n in (0, 1, a.clients):
            note(f"live view with {n} browser(s), {a.seconds:g} s ...")
            live.append(asyncio.run(live_cpu(server.url, ui.pid, "127.0.0.1", port, n, a, f"c{n}")))
        children.kill(ui)
        base = live[0]["cpu_pct"]
        return {"events": facts.events, "jobs": facts.jobs, "ui_start_s": round(start_s, 2),
                "ui_start_cpu_s": start_cpu, "first_byte": fb, "overview_kb": overview_kb, "live": live,
                "per_client_cpu_pct": round(live[1]["cpu_pct"] - base, 2),
                "per_client_cpu_pct_at_n": round((live[2]["cpu_pct"] - base) / max(1, a.clients), 3)}
    finally:
        server.stop()


def decide_buckets(metrics_port: int) -> dict[float, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith("corral_decide_seconds_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[float("inf") if le == "+Inf" else float(le)] = float(line.rsplit(" ", 1)[1])
    return out


def p99_of(before: dict[float, float], after: dict[float, float]) -> tuple[float | None, int]:
    """The upper bound of the bucket holding the 99th percentile of the decisions between two scrapes."""
    delta = {le: after.get(le, 0.0) - before.get(le, 0.0) for le in sorted(after)}
    total = delta.get(float("inf"), 0.0)
    if total <= 0:
        return None, 0
    for le, count in delta.items():
        if count >= 0.99 * total:
            return le, int(total)
    return None, int(total)


async def reserve_latencies(url: str, prefix: str) -> list[float]:
    bus = await Bus.connect(url, name="bench-ui-read")
    submitted: dict[str, float] = {}
    reserved: dict[str, float] = {}
    try:
        last = await bus.last_seq()
        async with aclosing(bus.replay(to_seq=last)) as batches:
            async for batch in batches:
                for env in batch:
                    ev = env.event
                    if isinstance(ev, JobSubmitted) and ev.job_id.startswith(prefix):
                        submitted[ev.job_id] = env.stream_time
                    elif isinstance(ev, GangReserved) and ev.job_id in submitted and ev.job_id not in reserved:
                        reserved[ev.job_id] = env.stream_time
    finally:
        await bus.close()
    return [reserved[j] - submitted[j] for j in reserved]


async def sched_phase(url: str, host: str, port: int, clients: int, a: argparse.Namespace, tag: str) -> None:
    browsers = Browsers(host, port)
    await browsers.open(clients)
    bus = await Bus.connect(url, name="bench-ui-sched")
    try:
        client = Client(bus)
        for i in range(a.up_jobs):
            await client.submit({"name": "short", "command": ["sleep", "0.5"]}, job_id=f"{tag}-{i}")
            await asyncio.sleep(1 / a.up_rate)
        await asyncio.sleep(3.0)
    finally:
        await bus.close()
        await browsers.close()


def scheduler_part(a: argparse.Namespace, tmp: Path, children: Children) -> dict[str, Any]:
    mport = free_port()
    up = children.popen(corral_argv("up", "--runtime", "simulated", "--nodes", "8", "--gpus-per-node", "8",
                                    "--port", "0", "--ui-port", "0", "--metrics-port", str(mport), "--data-dir",
                                    str(tmp / "up")), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT,
                        env={**child_env(), "CORRAL_LOG_LEVEL": "warning"})
    assert up.stdout is not None
    url = ui = ""
    while not (url and ui):
        line = up.stdout.readline().decode()
        if not line:
            raise RuntimeError("corral up exited")
        if "NATS at " in line:
            url = line.split("NATS at ", 1)[1].split()[0]
        if "web UI at " in line:
            ui = line.split("web UI at ", 1)[1].split()[0]
    host, port = ui.split("//", 1)[1].rstrip("/").rsplit(":", 1)
    time.sleep(3.0)  # nodes registered, a leader elected
    out = []
    for i, n in enumerate((0, a.clients, 0)):
        note(f"scheduler with {n} browser(s): {a.up_jobs} jobs at {a.up_rate:g}/s ...")
        before = decide_buckets(mport)
        tag = f"s{i}c{n}"
        asyncio.run(sched_phase(url, host, int(port), n, a, tag))
        p99, decisions = p99_of(before, decide_buckets(mport))
        lat = asyncio.run(reserve_latencies(url, tag))
        out.append({"clients": n, "decisions": decisions, "decide_p99_ms_bucket": ms(p99),
                    "reserve_p50_ms": ms(pct(lat, 50)), "reserve_p99_ms": ms(pct(lat, 99)), "jobs": len(lat)})
    children.kill(up)
    return {"phases": out}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=50_000, help="jobs of the generated history (default %(default)s)")
    p.add_argument("--log", help="a `corral sim` log to load instead of generating one")
    p.add_argument("--seconds", type=float, default=20.0, help="each live-view measurement (default %(default)s)")
    p.add_argument("--rate", type=float, default=2.0, help="jobs submitted per second meanwhile (default %(default)s)")
    p.add_argument("--clients", type=int, default=50, help="browsers of the crowded runs (default %(default)s)")
    p.add_argument("--requests", type=int, default=30, help="first-byte requests per page (default %(default)s)")
    p.add_argument("--up-jobs", type=int, default=200, help="jobs per scheduler phase (default %(default)s)")
    p.add_argument("--up-rate", type=float, default=20.0, help="their submissions per second (default %(default)s)")
    p.add_argument("--timeout", type=float, default=1800.0, help="generating the history (default %(default)s)")
    a = p.parse_args()
    children = Children()
    try:
        with tempfile.TemporaryDirectory(prefix="corral-bench-ui-") as d:
            tmp = Path(d)
            result: dict[str, Any] = {"history": history_part(a, tmp, children)}
            result["scheduler"] = scheduler_part(a, tmp, children)
    finally:
        children.kill_all()
    result["args"] = {k: v for k, v in vars(a).items() if v is not None}
    result["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
