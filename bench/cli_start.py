"""CLI start time: how long `corral --help` takes before anything happens.

Runs `python -m orchestrator.cli --help` in fresh interpreters `--runs` times
and reports the best wall time (the machine is shared: the best run is the one
least disturbed), next to a bare `python -c pass` for the interpreter's own
start, the best CPU time, and the import time of the CLI as `python -X importtime` measures it
(the best run's sum of top-level imports), with the heavy modules it loaded.
Prints human lines, then one JSON object as the last line.

    .venv/bin/python bench/cli_start.py [--runs N]
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

ROOT = Path(__file__).resolve().parent.parent
#: Modules whose import the CLI's start should not pay for (extras, or heavy and unused by --help).
HEAVY = ("matplotlib", "numpy", "docker")
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


def import_profile(runs: int) -> tuple[float, list[str]]:
    """Best total import time of `-m orchestrator.cli --help` (s), and which HEAVY modules it imported."""
    best, heavy = float("inf"), set[str]()
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-X", "importtime", "-m", "orchestrator.cli", "--help"], cwd=ROOT,
                             check=True, capture_output=True, text=True).stderr
        total = 0
        for line in out.splitlines():
            m = _LINE.match(line)
            if not m:
                continue
            if not m.group(3):  # top level: its cumulative time includes everything it imported
                total += int(m.group(2))
            if m.group(4).split(".")[0] in HEAVY:
                heavy.add(m.group(4).split(".")[0])
        best = min(best, total / 1e6)
    return best, sorted(heavy)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=10, help="fresh interpreters per figure (default 10)")
    a = ap.parse_args()
    runs = max(1, a.runs)
    bare, _ = best_times_s([sys.executable, "-c", "pass"], runs)
    help_s, help_cpu = best_times_s([sys.executable, "-m", "orchestrator.cli", "--help"], runs)
    import_s, heavy = import_profile(runs)
    print(f"corral --help: {help_s * 1000:.0f} ms, {help_cpu * 1000:.0f} ms CPU (bare python {bare * 1000:.0f} ms), CLI imports "
          f"{import_s * 1000:.0f} ms, heavy modules imported: {', '.join(heavy) or 'none'} (best of {runs})", flush=True)
    print(json.dumps({"mode": "cli_start", "runs": runs, "help_ms": round(help_s * 1000, 1),
                      "help_cpu_ms": round(help_cpu * 1000, 1),
                      "bare_python_ms": round(bare * 1000, 1), "import_ms": round(import_s * 1000, 1),
                      "heavy_imported": heavy, "machine": platform.machine(), "cpus": os.cpu_count(),
                      "load_avg_1m": round(os.getloadavg()[0], 2), "python": platform.python_version()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
