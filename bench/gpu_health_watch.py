"""The agent's GPU health watch on this machine's GPUs for a while: its counters and any findings (issue #32).

Runs `nodeagent.gpu_health.GpuHealthWatch` exactly as `corral agent` does --
discovery's GPUs, the default Xid lists, one poll per `--poll` seconds waiting
that long for Xid events -- for `--seconds`, and reports how many polls and
Xid events it saw, the findings by severity (a healthy GPU: 0 fatal), the
queries this GPU does not support, the counters it reads at the start and the
end, and the poll latency. `--fake-gpus N` watches N fake GPUs through
nodeagent/fake_nvml.py instead (a machine without a driver; `--scenario FILE`
to inject faults).

    .venv/bin/python bench/gpu_health_watch.py --seconds 60            # on a GPU machine
    .venv/bin/python bench/gpu_health_watch.py --seconds 5 --fake-gpus 8

Prints human lines, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nodeagent.discovery import node_inventory
from nodeagent.gpu_health import GpuHealthWatch


def counters(watch: GpuHealthWatch) -> list[dict[str, Any]]:
    """What the watch reads of each GPU now (None: not supported or failed)."""
    nv = watch.nvml
    out = []
    for g in watch.gpus:
        row: dict[str, Any] = {"index": g.index, "uuid": g.uuid}
        for name, fn, args in (
            ("ecc_uncorrected_volatile", "nvmlDeviceGetTotalEccErrors",
             (nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)),
            ("remapped_rows", "nvmlDeviceGetRemappedRows", ()),
            ("retired_pages_pending", "nvmlDeviceGetRetiredPagesPendingStatus", ()),
            ("clocks_event_reasons", "nvmlDeviceGetCurrentClocksEventReasons", ()),
        ):
            try:
                v = getattr(nv, fn)(g.handle, *args)
                row[name] = list(v) if isinstance(v, tuple) else int(v)
            except Exception as e:
                row[name] = f"{type(e).__name__}"
        out.append(row)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--poll", type=float, default=1.0, help="seconds one poll waits for Xid events")
    ap.add_argument("--fake-gpus", type=int, help="watch N fake GPUs (nodeagent/fake_nvml.py) instead of NVML")
    ap.add_argument("--scenario", help="with --fake-gpus: the fake NVML's scenario file")
    args = ap.parse_args()

    found = node_inventory("bench", fake_gpus=args.fake_gpus)
    nvml: Any
    if args.fake_gpus is not None:
        from nodeagent.fake_nvml import FakeNvml

        nvml = FakeNvml(args.fake_gpus, node_id="bench", scenario=args.scenario)
    else:
        import pynvml

        nvml = pynvml
    gpus = found.inventory.gpus
    watch = GpuHealthWatch(nvml, [g.uuid for g in gpus])
    watch.start()
    first = counters(watch)
    findings: list[dict[str, Any]] = []
    latencies: list[float] = []
    wait_ms = int(args.poll * 1000)
    end = time.monotonic() + args.seconds
    try:
        while time.monotonic() < end:
            t0 = time.perf_counter()
            for f in watch.poll(min(wait_ms, max(0, int((end - time.monotonic()) * 1000)))):
                findings.append({"gpu": f.index, "severity": "healthy" if f.healthy else f.severity,
                                 "reason": f.reason})
                print(f"finding: GPU {f.index} {findings[-1]['severity']}: {f.reason}", flush=True)
            latencies.append(time.perf_counter() - t0)
        last = counters(watch)
    finally:
        watch.close()
    latencies.sort()
    fatal = sum(1 for f in findings if f["severity"] == "fatal")
    figures = {
        "gpus": len(gpus), "models": sorted({g.model for g in gpus}), "driver": found.driver_version,
        "seconds": args.seconds, "polls": watch.polls, "xid_events_seen": watch.xids_seen,
        "findings_fatal": fatal, "findings_warning": sum(1 for f in findings if f["severity"] == "warning"),
        "findings": findings, "unsupported": sorted(watch.unsupported),
        "poll_s_p50": latencies[len(latencies) // 2] if latencies else None,
        "poll_s_max": latencies[-1] if latencies else None,
        "counters_first": first, "counters_last": last,
    }
    print(f"{len(gpus)} GPU(s) {', '.join(figures['models'])} (driver {found.driver_version}): {watch.polls} polls in "
          f"{args.seconds:g}s, {watch.xids_seen} Xid events, {fatal} fatal findings, "
          f"{figures['findings_warning']} warnings; unsupported: {', '.join(figures['unsupported']) or 'none'}")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
