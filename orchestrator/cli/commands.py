"""Which subcommands `corral` has: each module registers its own parsers."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from orchestrator.cli import (
        admin,
        archive,
        completion,
        forensics,
        jobs,
        listing,
        logs,
        services,
        sim,
        tail,
        top,
        usage,
    )

    services.register(sub)
    archive.register(sub)
    jobs.register(sub)
    listing.register(sub)
    usage.register(sub)
    logs.register(sub)
    completion.register(sub)
    admin.register(sub)
    tail.register(sub)
    forensics.register(sub)
    top.register(sub)
    sim.register(sub)
