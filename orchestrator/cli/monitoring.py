"""`corral monitoring [--out DIR]`: write the Grafana dashboard and the Prometheus alert rules.

They ship inside the package (`orchestrator/monitoring`, a link to the checkout's
deploy/monitoring/ that the wheel stores as files), so a `pip install`ed corral
can hand them to Grafana and Prometheus without a checkout.
"""

from __future__ import annotations

import argparse
import importlib.resources
import sys
from pathlib import Path

from orchestrator.cli.errors import OK, CliError
from orchestrator.cli.examples import write_files

#: The files, and what each one is for (printed after writing).
FILES = {
    "prometheus-rules.yaml": "alert rules: Prometheus `rule_files:` (or a PrometheusRule's spec)",
    "grafana-dashboard.json": "dashboard: Grafana, Dashboards > Import",
}


def monitoring_files() -> dict[str, bytes]:
    """Name -> bytes of each monitoring file the package holds."""
    root = importlib.resources.files("orchestrator") / "monitoring"
    out: dict[str, bytes] = {}
    for name in FILES:
        node = root / name
        if not node.is_file():
            raise CliError(f"this corral has no {name} (orchestrator/monitoring is missing from the install)")
        out[name] = node.read_bytes()
    return out


def write_monitoring(dest: Path, *, force: bool = False) -> list[Path]:
    """Write the files into `dest`; refuses (exit 2) to overwrite a file that differs unless `force`."""
    return write_files(dest, monitoring_files(), force=force)


async def monitoring(args: argparse.Namespace) -> int:
    written = write_monitoring(Path(args.out), force=args.force)
    print(f"wrote {len(written)} files to {args.out}/: " + "; ".join(f"{p.name} ({FILES[p.name]})" for p in written),
          file=sys.stderr)
    for path in written:
        print(path)
    return OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("monitoring", help="write the Grafana dashboard and Prometheus alert rules into a directory",
                       description="Write corral's Prometheus alert rules (prometheus-rules.yaml) and Grafana "
                                   "dashboard (grafana-dashboard.json) into DIR. They read the metrics of "
                                   "`--metrics-port` (scheduler, agents, `corral up`) under any scrape job name; "
                                   "prints the paths written.")
    p.add_argument("--out", default="monitoring", metavar="DIR", help="where (default: ./monitoring)")
    p.add_argument("--force", action="store_true", help="overwrite files that differ")
    p.set_defaults(handler=monitoring)
