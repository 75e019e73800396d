"""Job commands: submit and cancel."""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from contextlib import aclosing

import msgspec

from events.bus import Bus
from events.sdk import FINAL, AdmissionRefused, Client, default_user
from events.subjects import type_filters
from orchestrator.cli.connect import add_connection_args, connected
from orchestrator.cli.errors import DENIED, FAILURE, NOT_FOUND, OK, TIMEOUT, UNREACHABLE, USAGE, CliError
from orchestrator.cli.listing import checked_id
from orchestrator.cli.output import print_json
from orchestrator.cli.render import line
from orchestrator.cli.specfile import load_jobspec
from orchestrator.cli.state_view import load_state
from orchestrator.core.evolve import evolve
from orchestrator.core.state import TERMINAL, ClusterState
from schemas import JobSpec, tag_of


def current_user(args: argparse.Namespace | None = None) -> str:
    """Who submits or cancels, as recorded in the log (`explain`, `jobs --by-user` show it): the NATS user
    of the connection (--user), else $USER; "" if unknown."""
    return default_user(nats_user=getattr(args, "user", None))


#: Exit code for each refusal of the admission service (events.sdk.AdmissionRefused.code).
_REFUSAL_EXIT = {"forbidden": DENIED, "invalid": USAGE, "bad_request": USAGE, "not_found": NOT_FOUND,
                 "unavailable": UNREACHABLE}


@contextlib.contextmanager
def _refusals() -> Iterator[None]:
    try:
        yield
    except AdmissionRefused as e:
        raise CliError(f"admission refused {e.job_id}: {e} ({e.code})" if e.code != "unavailable" else str(e),
                       _REFUSAL_EXIT.get(e.code, FAILURE)) from None


def _client(bus: Bus, args: argparse.Namespace) -> Client:
    return Client(bus, user=current_user(args), via_admission=args.via_admission)


#: The queue a spec that names none asks for.
_SPEC_QUEUE: str = next(f.default for f in msgspec.structs.fields(JobSpec) if f.name == "queue")

#: The events that say which queues are defined and which is the default (read at submit, nothing else).
_QUEUE_EVENTS = type_filters("QueueDefined", "QueueDeleted", "ClusterConfigured", "SchedulerElected")


async def check_queue(bus: Bus, spec: JobSpec) -> None:
    """Refuse (exit 2, naming the defined queues) a job for an undefined queue once any queue is defined.

    Without any queue every name runs (implicit queues); a spec that names no queue (`default`) runs in the
    cluster's default queue. Only the queue and settings events are read, not the whole log.
    """
    state = ClusterState()
    async with aclosing(bus.replay(subjects=_QUEUE_EVENTS)) as batches:
        async for batch in batches:
            for env in batch:
                state = evolve(state, env.event, env.seq)
    defined = state.queues
    if not defined or spec.queue in defined:
        return
    if spec.queue == _SPEC_QUEUE and state.config.default_queue in defined:
        return
    raise CliError(f"unknown queue {spec.queue!r}; defined queues: {', '.join(sorted(defined))} "
                   "(`corral queues` lists them; `corral queue set` or `queue apply` defines one)", USAGE)


async def submit(args: argparse.Namespace) -> int:
    spec = load_jobspec(args.file)
    async with connected(args) as bus:
        await check_queue(bus, spec)
        client = _client(bus, args)
        with _refusals():
            job_id = await client.submit(spec, job_id=args.id)
        if args.json and not args.wait:
            print_json({"job_id": job_id})
        elif not args.json:
            print(job_id)
        if not args.wait:
            return OK
        try:
            env = await client.wait(job_id, until=FINAL, timeout=args.timeout)
        except TimeoutError:
            raise CliError(f"{job_id} not finished after {args.timeout:g}s", TIMEOUT) from None
        tag = tag_of(env.event)
        if args.json:
            print_json({"job_id": job_id, "result": tag, "seq": env.seq})
        else:
            print(line(env))
        return OK if tag == "JobCompleted" else FAILURE


async def cancel(args: argparse.Namespace) -> int:
    job_id = checked_id(args.job, "job id")
    async with connected(args) as bus:
        job = (await load_state(bus)).jobs.get(job_id)
        if job is None:
            raise CliError(f"unknown job {job_id!r} (see `corral jobs`)", NOT_FOUND)
        if job.status in TERMINAL:
            if args.json:
                print_json({"job_id": job_id, "status": job.status, "seq": None})
            else:
                print(f"{job_id} is already {job.status}: nothing to cancel")
            return OK
        with _refusals():
            seq = await _client(bus, args).cancel(job_id, reason=args.reason)
    print_json({"job_id": job_id, "seq": seq}) if args.json else print(f"cancel requested for {job_id}")
    return OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("submit", help="submit a job spec (YAML or JSON file, - for stdin)",
                       description="Validate a JobSpec and append JobSubmitted. Invalid specs list every problem "
                                   "and exit 2.")
    add_connection_args(p)
    p.add_argument("file", help="job spec file (.yaml/.yml/.json) or - for stdin")
    p.add_argument("--id", help="job id (makes a retried submit a no-op); default generated")
    p.add_argument("--wait", action="store_true", help="wait until the job is final; exit 0 only if it completed")
    p.add_argument("--timeout", type=float, default=None, metavar="S", help="with --wait: give up after S seconds")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _via_admission(p)
    p.set_defaults(handler=submit)

    p = sub.add_parser("cancel", help="cancel a job", description="Append CancelRequested; running workers get "
                       "SIGTERM and their grace period.")
    add_connection_args(p)
    p.add_argument("job", help="job id")
    p.add_argument("--reason", default="", help="recorded in the log")
    p.add_argument("--json", action="store_true")
    _via_admission(p)
    p.set_defaults(handler=cancel)


def _via_admission(p: argparse.ArgumentParser) -> None:
    env = os.environ.get("CORRAL_VIA_ADMISSION", "").lower() in ("1", "true", "yes")
    p.add_argument("--via-admission", action="store_true", default=env,
                   help="ask the admission service (`corral admission`) instead of appending: how users of a team "
                        "account (client-<team>) submit and cancel; it checks the team owns the queue "
                        "(env CORRAL_VIA_ADMISSION=1)")
