"""Which subcommands `corral` has: each module registers its own parsers."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from orchestrator.cli import jobs, services

    services.register(sub)
    jobs.register(sub)
