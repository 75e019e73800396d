"""A cold reader's fold from NATS against the same fold from a file (#28 point 5: target >= 0.8x).

    python bench/coldread.py --log /path/events-corral.jsonl [--events 200000] [--rounds 3]
    python bench/coldread.py --jobs 300            # generates a log with `corral sim --generate`

Takes the first --events events of a `corral sim` log, loads them into a fresh
stream of its own nats-server (pipelined `Bus.append_many`, as bench/history.py
does), then times, in rounds alternating which goes first:
- file: `LogFile.replay` + `fold_batch` (what `corral jobs --log FILE` does);
- nats: `Follower.catch_up` from position 1 (what a reader with no snapshot does);
each folding every event with `orchestrator.core.evolve` into a fresh ClusterState,
and each read alone (no fold) to tell the read's cost from the fold's. For each:
wall seconds, this process's CPU seconds, and for NATS the server's CPU seconds
(on a machine with few cores the server competes with the reader).
`ratio` = NATS fold rate / file fold rate (medians of wall time), `cpu_ratio` the
same by this process's CPU seconds (what a loaded machine moves least). --profile prints cProfile's
top functions of one NATS catch-up. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from history import load  # noqa: E402

from events.bus import Bus  # noqa: E402
from events.follow import Follower, fold_batch  # noqa: E402
from events.logfile import LogFile  # noqa: E402
from events.server import NatsServer  # noqa: E402
from orchestrator.core.evolve import evolve  # noqa: E402
from orchestrator.core.model.state import ClusterState  # noqa: E402


def note(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cpu_of(pid: int | None) -> float:
    """User + system CPU seconds of process `pid` so far (Linux /proc), 0 where unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def head(src: Path, n: int, dst: Path) -> int:
    """The first `n` non-blank lines of `src` into `dst`; how many it wrote."""
    k = 0
    with src.open("rb") as f, dst.open("wb") as out:
        for raw in f:
            if not raw.strip():
                continue
            out.write(raw)
            k += 1
            if k >= n:
                break
    return k


def generate(jobs: int, out: Path) -> Path:
    note(f"generating a {jobs:,}-job log (corral sim --generate {jobs}) ...")
    r = subprocess.run([sys.executable, "-m", "orchestrator.cli", "sim", "--generate", str(jobs), "--no-figures",
                        "--json", "--out", str(out)], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    path = out / "events-corral.jsonl"
    if r.returncode != 0 or not path.exists():
        raise RuntimeError(f"corral sim --generate {jobs} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return path


async def fold_file(path: Path, n: int) -> int:
    state = ClusterState()
    async for batch in LogFile(path).replay():
        state = fold_batch(state, batch, evolve, contiguous=False)
    assert state.seq == n, f"file folded to {state.seq}, expected {n}"
    return len(state.jobs)


async def read_file(path: Path, n: int) -> int:
    k = 0
    async for batch in LogFile(path).replay():
        k += len(batch)
    assert k == n
    return 0


async def fold_nats(bus: Bus, n: int) -> int:
    follower = Follower(bus, evolve, ClusterState())
    await follower.catch_up()
    assert follower.state.seq == n, f"NATS folded to {follower.state.seq}, expected {n}"
    return len(follower.state.jobs)


async def read_nats(bus: Bus, n: int) -> int:
    k = 0
    async for batch in bus.replay():
        k += len(batch)
    assert k == n
    return 0


async def timed(what: Callable[[], Awaitable[int]], server_pid: int | None) -> dict[str, float]:
    gc.collect()
    s0, c0, t0 = cpu_of(server_pid), time.process_time(), time.perf_counter()
    jobs = await what()
    wall = time.perf_counter() - t0
    return {"s": wall, "cpu_s": time.process_time() - c0, "server_cpu_s": cpu_of(server_pid) - s0, "jobs": jobs}


async def profile(bus: Bus, n: int, top: int) -> None:
    prof = cProfile.Profile()
    prof.enable()
    await fold_nats(bus, n)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    note(out.getvalue())


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="corral-coldread-") as tmp:
        tmpdir = Path(tmp)
        src = args.log if args.log is not None else generate(args.jobs, tmpdir / "sim")
        path = tmpdir / "events.jsonl"
        n = head(src, args.events, path)
        async with NatsServer(tmpdir / "nats") as server:
            note(f"loading {n:,} events into a fresh stream ...")
            _, load_s = await load(server.url, path, 50_000)
            bus = await Bus.connect(server.url)
            try:
                runs: dict[str, list[dict[str, float]]] = {"file": [], "nats": [], "file_read": [], "nats_read": []}
                for r in range(args.rounds):
                    order = ["file", "nats"] if r % 2 == 0 else ["nats", "file"]
                    for what in order:
                        fold = (lambda: fold_file(path, n)) if what == "file" else (lambda: fold_nats(bus, n))
                        read = (lambda: read_file(path, n)) if what == "file" else (lambda: read_nats(bus, n))
                        runs[what].append(await timed(fold, server.pid))
                        runs[f"{what}_read"].append(await timed(read, server.pid))
                    f, b = runs["file"][-1], runs["nats"][-1]
                    note(f"  round {r + 1}: fold from file {n / f['s']:,.0f}/s, from NATS {n / b['s']:,.0f}/s "
                         f"(ratio {f['s'] / b['s']:.2f}; reader CPU {b['cpu_s']:.2f}s vs {f['cpu_s']:.2f}s, "
                         f"server CPU {b['server_cpu_s']:.2f}s)")
                assert runs["file"][0]["jobs"] == runs["nats"][0]["jobs"], "the two folds hold different jobs"
                if args.profile:
                    await profile(bus, n, args.profile)
            finally:
                await bus.close()

    def med(key: str, field: str = "s") -> float:
        return statistics.median(x[field] for x in runs[key])

    figures: dict[str, Any] = {
        "events": n, "load_s": round(load_s, 2), "rounds": args.rounds,
        "file_fold_per_s": round(n / med("file")), "nats_fold_per_s": round(n / med("nats")),
        "file_read_per_s": round(n / med("file_read")), "nats_read_per_s": round(n / med("nats_read")),
        "file_fold_cpu_s": round(med("file", "cpu_s"), 2), "nats_fold_cpu_s": round(med("nats", "cpu_s"), 2),
        "nats_fold_server_cpu_s": round(med("nats", "server_cpu_s"), 2),
        "ratio": round(med("file") / med("nats"), 3),
        # This process's CPU per fold, file / NATS: the ratio a reader with a core of its own (and the server
        # another) would see; on a loaded machine the wall ratio moves with whoever else takes the cores.
        "cpu_ratio": round(med("file", "cpu_s") / med("nats", "cpu_s"), 3),
        "target": 0.8, "loadavg": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count(),
    }
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--log", type=Path, help="a corral sim event log (events-<policy>.jsonl)")
    src.add_argument("--jobs", type=int, default=300, help="without --log: generate a log of this many jobs")
    ap.add_argument("--events", type=int, default=200_000, help="fold the log's first N events")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", type=int, default=0, metavar="TOP",
                    help="then profile one NATS catch-up and print its TOP functions by own time")
    args = ap.parse_args()
    figures = asyncio.run(run(args))
    f = figures
    print(f"{f['events']:,} events: fold from file {f['file_fold_per_s']:,}/s, from NATS {f['nats_fold_per_s']:,}/s "
          f"-> ratio {f['ratio']} (target >= {f['target']}; by the reader's CPU {f['cpu_ratio']}); read alone: file {f['file_read_per_s']:,}/s, "
          f"NATS {f['nats_read_per_s']:,}/s; load average {f['loadavg']}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
