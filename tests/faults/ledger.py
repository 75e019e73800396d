"""Reading the GPU ledger that tests/faults/ledger_worker.py writes, and checking it.

Physical double-booking: two worker processes holding the same GPU of the
same node at overlapping times. The log cannot show it (it only records
decisions and reports); the ledger can.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from schemas import AnyEvent, GangReserved, Unknown

WORKER = str(Path(__file__).with_name("ledger_worker.py"))


def ledger_command(steps: int, step_ms: float = 5, *extra: str) -> tuple[str, ...]:
    return (sys.executable, WORKER, "--steps", str(steps), "--step-ms", str(step_ms), *extra)


@dataclass(frozen=True)
class Use:
    job: str
    attempt: int
    rank: int
    pid: int
    gpus: tuple[int, ...]
    start: float
    end: float | None  # None: still running (or SIGKILLed, which our agents never do first)
    #: "exit" (ran to its end), "signal" (stopped by SIGTERM), "" while running
    how: str = ""


def read_ledger(path: Path) -> list[Use]:
    starts: dict[int, dict[str, object]] = {}
    ends: dict[int, tuple[float, str]] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        rec = json.loads(line)
        if rec["what"] == "start":
            starts[rec["pid"]] = rec
        else:
            ends.setdefault(rec["pid"], (rec["t"], rec.get("how", "")))
    return [
        Use(job=str(r["job"]), attempt=int(r["attempt"]), rank=int(r["rank"]), pid=pid,  # type: ignore[call-overload]
            gpus=tuple(int(g) for g in str(r["gpus"]).split(",") if g), start=float(r["t"]),  # type: ignore[arg-type]
            end=ends[pid][0] if pid in ends else None, how=ends[pid][1] if pid in ends else "")
        for pid, r in starts.items()
    ]


def placements(events: list[tuple[int, AnyEvent | Unknown]]) -> dict[tuple[str, int, int], str]:
    """(job, attempt, rank) -> node, from every reservation that took effect or not (a void one never ran)."""
    return {(e.job_id, e.attempt, p.rank): p.node_id for _, e in events if isinstance(e, GangReserved)
            for p in e.ranks}


def overlaps(uses: list[Use], nodes: dict[tuple[str, int, int], str]) -> list[str]:
    """Every pair of processes that held one GPU of one node at the same time."""
    found = []
    by_gpu: dict[tuple[str, int], list[Use]] = {}
    for u in uses:
        node = nodes.get((u.job, u.attempt, u.rank), "?")
        for g in u.gpus:
            by_gpu.setdefault((node, g), []).append(u)
    for (node, g), us in sorted(by_gpu.items()):
        us.sort(key=lambda u: u.start)
        holder: Use | None = None  # of the uses so far, the one that ends last
        for b in us:
            if holder is not None and b.start < _end(holder):
                found.append(f"{node}/GPU{g}: {holder.job} a{holder.attempt} r{holder.rank} (pid {holder.pid}) "
                             f"held it {_end(holder) - b.start:.2f}s into {b.job} a{b.attempt} r{b.rank} (pid {b.pid})")
            if holder is None or _end(b) > _end(holder):
                holder = b
    return found


def _end(u: Use) -> float:
    return u.end if u.end is not None else float("inf")
