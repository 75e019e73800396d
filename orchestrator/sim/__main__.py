"""`python -m orchestrator.sim ...`: the `corral sim` command without the rest of the CLI."""

from __future__ import annotations

import argparse
import asyncio
import sys

from orchestrator.sim.cli import register


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.sim")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    register(sub)
    args = parser.parse_args(["sim", *(sys.argv[1:] if argv is None else argv)])
    code: int = asyncio.run(args.handler(args))
    return code


if __name__ == "__main__":
    sys.exit(main())
