"""Day-two flags of `corral submit` and `corral run` (issue #41): the reservation a job runs in, and where
the notifier tells that it ended (README, "Day-two controls")."""

from __future__ import annotations

import argparse
import time

import msgspec

from events.bus import Bus
from orchestrator.cli.errors import USAGE, CliError
from orchestrator.cli.state_view import load_state
from orchestrator.core.model.reserved import unusable_reason
from schemas.jobspec import InvalidJobSpec, JobSpec, jobspec_problems


def add_spec_extras(p: argparse.ArgumentParser) -> None:
    p.add_argument("--reservation", metavar="NAME",
                   help="run in this node reservation: only on its nodes, only over its window (`corral reservation`)")
    p.add_argument("--notify-url", metavar="URL",
                   help="when the job ends, the notifier POSTs a JSON note (id, name, user, state, exit code, times) "
                        "to this http(s) URL")


def with_spec_extras(spec: JobSpec, args: argparse.Namespace) -> JobSpec:
    """`spec` with the flags' reservation and notify URL (validated as a spec's fields are: exit 2 when bad)."""
    extra = {k: v for k, v in (("reservation", getattr(args, "reservation", None)),
                               ("notify_url", getattr(args, "notify_url", None))) if v is not None}
    if not extra:
        return spec
    problems = jobspec_problems({"name": spec.name, **extra})
    if problems:
        raise CliError(str(InvalidJobSpec(problems)), USAGE)
    return msgspec.structs.replace(spec, **extra)


async def check_reservation(bus: Bus, spec: JobSpec, user: str) -> None:
    """Refuse (exit 2) a job naming a reservation it could never run in (unknown, over, not its users' or
    queue's): the scheduler would reject it (core/reserved_nodes.py)."""
    if spec.reservation_name is None:
        return
    state = await load_state(bus)
    why = unusable_reason(state.reservations, spec, user, time.time())
    if why is not None:
        raise CliError(why, USAGE)
