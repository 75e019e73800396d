"""CLI start time: how long `corral --help`, `--version` and a query command take before anything happens.

Runs `python -m orchestrator.cli --help` (and `--version`, `usage --help`) in
fresh interpreters `--runs` times and reports the best wall time (the machine
is shared: the best run is the one least disturbed), next to a bare `python -c
pass` for the interpreter's own start, the best CPU time, and the import time
of the CLI as `python -X importtime` measures it (the best run's sum of
top-level imports), with the heavy modules it loaded.

With `--nats URL` (a server whose log a running `corral index` answers for,
e.g. the one bench/history.py loads), it also times the index's query commands
end to end (`usage`, `jobs --all --by-user U --since D`, `job J`, `explain J`)
and splits one `usage` into its steps, each the time since the process was
started (the same machine's monotonic clock): interpreter up, parsed (the
command's module imported), logging set up, the NATS client and the bus
imported, connected (`Bus.connect`: NATS and the stream's info), the log's
end (`last_seq`), the log's clock (its first event, read as `usage` does),
the index's reply, and the connection closed.
Prints human lines, then one JSON object as the last line.

    .venv/bin/python bench/cli_start.py [--runs N] [--nats URL --job J --by-user U --since D]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: Modules whose import the CLI's start should not pay for (extras; the agent; the live view's terminal library,
#: which structlog imports too; the metrics): unused by --help and the query commands.
HEAVY = ("matplotlib", "numpy", "docker", "nodeagent", "rich", "prometheus_client")
_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \| ( *)(\S+)$")


def best_times_s(argv: list[str], runs: int) -> tuple[float, float]:
    """Best wall time and best CPU time (user + system, which other load on the machine moves less) of argv."""
    wall, cpu = float("inf"), float("inf")
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        subprocess.run(argv, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall = min(wall, time.perf_counter() - t)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = min(cpu, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return wall, cpu


def import_profile(runs: int, *args: str) -> tuple[float, list[str]]:
    """Best total import time of `-m orchestrator.cli ARGS` (s), and which HEAVY modules it imported."""
    best, heavy = float("inf"), set[str]()
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-X", "importtime", "-m", "orchestrator.cli", *(args or ["--help"])],
                             cwd=ROOT,
                             check=True, capture_output=True, text=True).stderr
        total = 0
        for line in out.splitlines():
            m = _LINE.match(line)
            if not m:
                continue
            if not m.group(3):  # top level: its cumulative time includes everything it imported
                total += int(m.group(2))
            # (a package whose import was refused -- the CLI hides rich from structlog -- is listed too, at a few us)
            if m.group(4).split(".")[0] in HEAVY and ("." in m.group(4) or int(m.group(1)) >= 100):
                heavy.add(m.group(4).split(".")[0])
        best = min(best, total / 1e6)
    return best, sorted(heavy)


#: One `corral usage` split into its steps (run in a fresh interpreter; URL filled in): each step's
#: `time.perf_counter()` (CLOCK_MONOTONIC, the parent's clock too) as the last line, JSON.
_STEPS = """
import time
t = {"interpreter": time.perf_counter()}
import json, sys
import orchestrator.cli.commands
from orchestrator.cli import build_parser
try:
    parser = build_parser(lazy=True)
except TypeError:  # a tree from before the lazy parser
    parser = build_parser()
args = parser.parse_args(["--nats", sys.argv[1], "usage"])
t["parsed"] = time.perf_counter()
getattr(orchestrator.cli.commands, "import_structlog_without_rich", lambda: None)()  # (as main does)
import asyncio
from orchestrator.logging import configure_logging
configure_logging("warning", json=False)
t["logging"] = time.perf_counter()
import nats
import events.bus
import events.security
from orchestrator.cli.connect import connected
from orchestrator.cli.position import log_clock
from orchestrator.index import api
from orchestrator.index.client import ask
t["client_imported"] = time.perf_counter()

async def steps():
    async with connected(args) as bus:
        t["connected"] = time.perf_counter()
        last = await bus.last_seq()
        t["last_seq"] = time.perf_counter()
        await log_clock(bus)
        t["log_clock"] = time.perf_counter()
        await ask(bus.nc, api.USAGE, api.UsageRequest(by="queue", at_least=last), api.UsageReply)
        t["index_reply"] = time.perf_counter()
    t["closed"] = time.perf_counter()

asyncio.run(steps())
print(json.dumps(t))
"""


def usage_steps(url: str, runs: int) -> dict[str, float]:
    """The best run's steps of one `corral usage`, ms since the process was started (see _STEPS)."""
    best: dict[str, float] = {}
    for _ in range(runs):
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", _STEPS, url], cwd=ROOT, check=True, capture_output=True,
                             text=True).stdout
        steps = {k: round((v - t0) * 1000, 1) for k, v in json.loads(out.splitlines()[-1]).items()}
        if not best or steps["closed"] < best["closed"]:
            best = steps
    return best


def queries(a: argparse.Namespace, runs: int) -> dict[str, dict[str, float]]:
    """Best wall and CPU ms of each query the index answers, end to end (`corral ...` in a fresh interpreter)."""
    cli = [sys.executable, "-m", "orchestrator.cli", "--nats", a.nats]
    asked = {"usage": ["usage"]}
    if a.by_user:
        asked["jobs_all_user_since"] = ["jobs", "--all", "--by-user", a.by_user, *(["--since", a.since] if a.since
                                                                                  else [])]
    if a.job:
        asked |= {"job": ["job", a.job], "explain": ["explain", a.job]}
    out = {}
    for name, args in asked.items():
        wall, cpu = best_times_s([*cli, *args], runs)
        out[name] = {"ms": round(wall * 1000, 1), "cpu_ms": round(cpu * 1000, 1)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=10, help="fresh interpreters per figure (default 10)")
    ap.add_argument("--nats", metavar="URL", help="also time the query commands on this server (a running "
                    "`corral index` answers them)")
    ap.add_argument("--job", metavar="J", help="the job `job` and `explain` ask about (with --nats)")
    ap.add_argument("--by-user", metavar="U", help="the submitter `jobs --all --by-user` asks about (with --nats)")
    ap.add_argument("--since", metavar="D", help="`jobs --all --since D` (with --by-user)")
    a = ap.parse_args()
    runs = max(1, a.runs)
    bare, _ = best_times_s([sys.executable, "-c", "pass"], runs)
    help_s, help_cpu = best_times_s([sys.executable, "-m", "orchestrator.cli", "--help"], runs)
    version_s, version_cpu = best_times_s([sys.executable, "-m", "orchestrator.cli", "--version"], runs)
    usage_help_s, usage_help_cpu = best_times_s([sys.executable, "-m", "orchestrator.cli", "usage", "--help"], runs)
    import_s, heavy = import_profile(runs)
    usage_import_s, usage_heavy = import_profile(runs, "usage", "--help")
    print(f"corral --help: {help_s * 1000:.0f} ms, {help_cpu * 1000:.0f} ms CPU (bare python {bare * 1000:.0f} ms), CLI imports "
          f"{import_s * 1000:.0f} ms, heavy modules imported: {', '.join(heavy) or 'none'} (best of {runs})", flush=True)
    print(f"corral --version: {version_s * 1000:.0f} ms, {version_cpu * 1000:.0f} ms CPU; corral usage --help: "
          f"{usage_help_s * 1000:.0f} ms, {usage_help_cpu * 1000:.0f} ms CPU, imports {usage_import_s * 1000:.0f} ms, "
          f"heavy: {', '.join(usage_heavy) or 'none'}", flush=True)
    result: dict[str, Any] = {
        "mode": "cli_start", "runs": runs, "help_ms": round(help_s * 1000, 1), "help_cpu_ms": round(help_cpu * 1000, 1),
        "version_ms": round(version_s * 1000, 1), "version_cpu_ms": round(version_cpu * 1000, 1),
        "usage_help_ms": round(usage_help_s * 1000, 1), "usage_help_cpu_ms": round(usage_help_cpu * 1000, 1),
        "bare_python_ms": round(bare * 1000, 1), "import_ms": round(import_s * 1000, 1),
        "usage_import_ms": round(usage_import_s * 1000, 1), "heavy_imported": sorted({*heavy, *usage_heavy}),
    }
    if a.nats:
        result["queries"] = queries(a, runs)
        for name, q in result["queries"].items():
            print(f"corral {name}: {q['ms']:.0f} ms, {q['cpu_ms']:.0f} ms CPU (best of {runs})", flush=True)
        result["usage_steps_ms"] = usage_steps(a.nats, runs)
        print("corral usage, ms since the process started: " + ", ".join(
            f"{k} {v:.0f}" for k, v in result["usage_steps_ms"].items()), flush=True)
    result |= {"machine": platform.machine(), "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2),
               "python": platform.python_version()}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
