"""Job commands: submit (arrays, dependencies, held), cancel (many, by filter), hold and release."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import Iterator
from contextlib import aclosing

import msgspec
from msgspec.structs import replace

from events.bus import Bus
from events.fingerprint import with_fingerprints
from events.sdk import FINAL, AdmissionRefused, Client, default_user, new_job_id
from events.subjects import type_filters
from orchestrator.cli.arrays import ArraySpecError, parse_array
from orchestrator.cli.connect import add_connection_args, connected
from orchestrator.cli.errors import DENIED, FAILURE, NOT_FOUND, OK, TIMEOUT, UNREACHABLE, USAGE, CliError
from orchestrator.cli.jobflags import add_job_args, dependencies, spec_with_flags
from orchestrator.cli.listing import checked_id, parse_states
from orchestrator.cli.output import print_json
from orchestrator.cli.render import line
from orchestrator.cli.spec_extras import add_spec_extras, check_reservation, with_spec_extras
from orchestrator.cli.specfile import load_jobspec
from orchestrator.cli.state_view import load_state
from orchestrator.cli.submitter import add_submitter_args, with_submitter
from orchestrator.cli.timespec import seconds_arg
from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import TERMINAL, ClusterState, Job
from schemas import ArrayElement, JobSpec, tag_of


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


def queue_refusal(state: ClusterState, queue: str) -> str | None:
    """Why `corral submit` refuses a job for `queue` (None: it does not): the front door's rule.

    Once any queue is defined, a name that is not one is refused, except the spec's default name when the
    cluster's default queue is defined (a spec that names no queue runs there). Without any queue every name
    runs (implicit queues).

    Stricter than the scheduler's rule, on purpose (tests/cli/test_queue_rule.py pins the difference): the
    scheduler sends a name it does not know to the default queue (orchestrator/core/model/usage.py:
    `resolve_queue`) and rejects it only when there is no default queue either (policies/reject.py). The
    scheduler's rule reads the log, which must fold the same forever: jobs already in it, a queue deleted
    after its jobs were submitted, other clients' appends. This one reads a person's `-q`: a typo sent to the
    default queue would run under another queue's share, guarantee and limit, so it is refused before
    anything is in the log. Whatever the scheduler would reject for its queue, this refuses too.
    """
    defined = state.queues
    if not defined or queue in defined:
        return None
    if queue == _SPEC_QUEUE and state.config.default_queue in defined:
        return None
    if queue == _SPEC_QUEUE:  # the job named no queue (or the spec default's name): say how to get one
        default = state.config.default_queue
        return (f"unknown queue {queue!r}: a job that names no queue runs in the default queue {default!r}, which "
                f"is not defined; defined queues: {', '.join(sorted(defined))}: name one (-q QUEUE, or `queue:` in "
                f"the spec) or define it (`corral queue set {default}`)")
    return (f"unknown queue {queue!r}; defined queues: {', '.join(sorted(defined))} "
            "(`corral queues` lists them; `corral queue set` or `queue apply` defines one)")


async def check_queue(bus: Bus, spec: JobSpec) -> None:
    """Refuse (exit 2, naming the defined queues) a job for a queue `queue_refusal` refuses.

    Only the queue and settings events are read, not the whole log.
    """
    state = ClusterState()
    async with aclosing(bus.replay(subjects=_QUEUE_EVENTS)) as batches:
        async for batch in batches:
            for env in batch:
                state = evolve(state, env.event, env.seq)
    refused = queue_refusal(state, spec.queue)
    if refused is not None:
        raise CliError(refused, USAGE)


async def check_fits(bus: Bus, spec: JobSpec) -> None:
    """Refuse (exit 2, with every reason) a job no set of the registered nodes could ever hold: the rule the
    scheduler rejects by (orchestrator/core/reject.py: `never_fits`), on the state folded from the newest
    snapshot. A spec with `allow_future_nodes` passes: it waits for nodes to join."""
    from orchestrator.core.reject import never_fits

    state = await load_state(bus)
    reasons = never_fits(state, spec)
    if reasons:
        nodes = f"{len(state.nodes)} registered node{'' if len(state.nodes) == 1 else 's'}"
        raise CliError(f"job {spec.name!r} can never run on this cluster ({nodes}): {'; '.join(reasons)} "
                       "(--allow-future-nodes queues it anyway, to wait for nodes that will join)", USAGE)


async def submit(args: argparse.Namespace) -> int:
    # the file's fields, those the flags override, then its workdir and exports (orchestrator/cli/submitter.py)
    told: list[str] = []  # what the export left out, said once the job is in
    spec = with_submitter(spec_with_flags(load_jobspec(args.file), args, args.file), args, notice=told.append)
    spec = with_spec_extras(spec, args)  # --reservation, --notify-url (orchestrator/cli/spec_extras.py)
    spec, notes = with_fingerprints(spec)  # local datasets as they are now: an edit is a new cache entry (#41)
    for note in notes:
        print(f"corral: note: {note}", file=sys.stderr)
    try:
        array = parse_array(args.array) if args.array is not None else None
    except ArraySpecError as e:
        raise CliError(str(e), USAGE) from None
    base = checked_id(args.id, "job id") if args.id else new_job_id()
    if array is not None:  # ID_INDEX must be an id too (128 characters at most)
        checked_id(f"{base}_{array.indexes[-1]}", f"job id of the array's last element ({base}_{array.indexes[-1]})")
    ok_ids, any_ids = checked_dependencies(args)  # (bad ids refused before connecting)
    async with connected(args) as bus:
        await check_queue(bus, spec)
        await check_fits(bus, spec)
        await check_reservation(bus, spec, _client(bus, args).user)
        spec = await gated(bus, spec, ok_ids, any_ids, hold=args.hold)
        client = _client(bus, args)
        with _refusals():
            if array is None:
                job_ids = [await client.submit(spec, job_id=base)]
            else:
                gates = spec.gating
                job_ids = await client.submit_many(
                    (f"{base}_{i}", replace(spec, gates=replace(gates, array=ArrayElement(
                        array_id=base, index=i, limit=array.limit, indexes=array.text, count=len(array.indexes)))))
                    for i in array.indexes)
        job_id = job_ids[0] if array is None else base
        for text in told:
            print(f"corral: {text}", file=sys.stderr)
        if args.json and not args.wait:
            print_json({"job_id": job_id, **({"jobs": job_ids} if array is not None else {})})
        elif not args.json:
            print(job_id if array is None else f"{base} (array of {len(job_ids)}: {job_ids[0]} .. {job_ids[-1]})")
        if not args.wait and not args.follow:
            return OK
        results = []
        for jid in job_ids:
            try:
                if args.follow:  # every rank's output as it is written, then the end (orchestrator/cli/attach.py)
                    from orchestrator.cli.attach import JobStream, follow_job

                    async with asyncio.timeout(args.timeout):
                        seen = await follow_job(bus, jid, JobStream(bus))
                    assert seen.final is not None
                    env = seen.final
                else:
                    env = await client.wait(jid, until=FINAL, timeout=args.timeout)
            except TimeoutError:
                raise CliError(f"{jid} not finished after {args.timeout:g}s", TIMEOUT) from None
            results.append((jid, env))
            if not args.json:
                print(line(env))
        if args.json:
            rows = [{"job_id": jid, "result": tag_of(env.event), "seq": env.seq} for jid, env in results]
            print_json(rows[0] if array is None else {"job_id": base, "jobs": rows})
        return OK if all(tag_of(env.event) == "JobCompleted" for _, env in results) else FAILURE


def checked_dependencies(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The after-ok and after-any job ids of the command line (`--after-ok j-1,j-2 --after-ok j-3`,
    `--dependency afterok:j-1:j-2`), each a valid id (exit 2 otherwise)."""
    ok, any_ = dependencies(args)
    return [checked_id(j, "job id") for j in ok], [checked_id(j, "job id") for j in any_]


async def gated(bus: Bus, spec: JobSpec, ok_ids: list[str], any_ids: list[str], *, hold: bool) -> JobSpec:
    """`spec` with the gates of the command line added (an array id is one dependency on the whole array);
    refused (exit 2) naming what to fix: a dependency the log does not know, a limit exceeded."""
    from orchestrator.cli.dependencies import with_gates

    if not (ok_ids or any_ids or hold):
        return spec
    state = await load_state(bus) if ok_ids or any_ids else None
    return with_gates(state, spec, ok_ids, any_ids, hold=hold)


def _array_elements(state: ClusterState) -> dict[str, list[str]]:
    """Array id -> its elements' job ids, by index."""
    found: dict[str, list[tuple[int, str]]] = {}
    for job in state.jobs.values():
        arr = job.spec.gating.array
        if arr is not None:
            found.setdefault(arr.array_id, []).append((arr.index, job.job_id))
    return {a: [j for _, j in sorted(els)] for a, els in found.items()}


def _chosen(state: ClusterState, ids: list[str]) -> tuple[list[Job], list[str]]:
    """The jobs `ids` name (an array id: its elements), and the ids naming no job."""
    elements = _array_elements(state) if any(j not in state.jobs for j in ids) else {}
    jobs: dict[str, Job] = {}
    unknown: list[str] = []
    for jid in ids:
        named = [jid] if jid in state.jobs else elements.get(jid, [])
        if not named:
            unknown.append(jid)
        jobs.update((j, state.jobs[j]) for j in named)
    return list(jobs.values()), unknown


def _filtered(jobs: list[Job], args: argparse.Namespace) -> list[Job]:
    return [j for j in jobs
            if (args.by_user is None or j.submitted_by == args.by_user)
            and (args.queue is None or args.queue in (j.spec.queue, j.queue))
            and (args.name is None or j.spec.name == args.name)
            and (args.state is None or j.status in args.state)]


#: What `cancel --state` may name: the states of a job not finished.
CANCELLABLE = ("pending", "reserved", "running", "preempting")


def cancel_states(text: str | None) -> frozenset[str] | None:
    """`--state pending,running` (as `jobs --state` reads it, `active` too) -> the statuses; exit 2 for one a
    cancel cannot choose (a final state: nothing to cancel there)."""
    if text is None:
        return None
    states = parse_states(text)
    final = sorted(states.difference(CANCELLABLE))
    if final or not states:
        raise CliError(f"cancel --state {text}: {', '.join(final) or 'no state'}: choose among "
                       f"{', '.join(CANCELLABLE)} (or active), comma-separated", USAGE)
    return states


async def cancel(args: argparse.Namespace) -> int:
    ids = [checked_id(j, "job id") for j in args.jobs]
    args.state = cancel_states(args.state)
    filters = any(v is not None for v in (args.by_user, args.queue, args.name, args.state))
    if not ids and not filters:
        raise CliError("name the jobs to cancel, or choose them with --by-user, --queue, --name or --state", USAGE)
    async with connected(args) as bus:
        state = await load_state(bus)
        if ids:
            named, unknown = _chosen(state, ids)
        else:
            named, unknown = [j for j in state.jobs.values() if j.status not in TERMINAL], []
        chosen = _filtered(named, args)
        over = [j for j in chosen if j.status in TERMINAL]
        live = [j for j in chosen if j.status not in TERMINAL]
        with _refusals():
            seqs = await _client(bus, args).cancel_many([j.job_id for j in live], reason=args.reason)
    rows = ([{"job_id": j.job_id, "status": j.status, "seq": None} for j in over]
            + [{"job_id": j.job_id, "seq": seq} for j, seq in zip(live, seqs, strict=True)])
    for jid in unknown:
        print(f"corral: error: unknown job {jid!r} (see `corral jobs`)", file=sys.stderr)
    if args.json:
        single = len(ids) == 1 and not filters and not unknown and len(rows) == 1
        if rows or not unknown:
            print_json(rows[0] if single else rows)
    else:
        for j in over:
            print(f"{j.job_id} is already {j.status}: nothing to cancel")
        for j in live:
            print(f"cancel requested for {j.job_id}")
        if not rows and not unknown:
            print("(no job matches)")
    return NOT_FOUND if unknown else OK


async def hold(args: argparse.Namespace) -> int:
    return await _hold_or_release(args, hold=True)


async def release(args: argparse.Namespace) -> int:
    return await _hold_or_release(args, hold=False)


async def _hold_or_release(args: argparse.Namespace, *, hold: bool) -> int:
    """Hold (or release) each named pending job; an array id names its elements."""
    ids = [checked_id(j, "job id") for j in args.jobs]
    async with connected(args) as bus:
        state = await load_state(bus)
        jobs, unknown = _chosen(state, ids)
        client = _client(bus, args)
        done: list[tuple[str, int | None, str]] = []
        refused = 0
        for job in jobs:
            if job.status != "pending":
                note = f"{job.job_id} is {job.status}: only a pending job can be {'held' if hold else 'released'}"
                if len(jobs) == 1 or job.status not in TERMINAL:
                    refused += 1
                    print(f"corral: error: {note}", file=sys.stderr)
                continue
            if job.held == hold:
                done.append((job.job_id, None, "already held" if hold else "not held"))
                continue
            seq = await (client.hold(job.job_id, reason=args.reason) if hold else client.release(job.job_id))
            done.append((job.job_id, seq, "held" if hold else "released"))
    for jid in unknown:
        print(f"corral: error: unknown job {jid!r} (see `corral jobs`)", file=sys.stderr)
    if args.json:
        print_json([{"job_id": jid, "seq": seq, "result": what} for jid, seq, what in done])
    else:
        for jid, _, what in done:
            print(f"{jid}: {what}")
    return NOT_FOUND if unknown else FAILURE if refused else OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("submit", help="submit a job spec (YAML or JSON file, - for stdin)",
                       description="Validate a JobSpec and append JobSubmitted. The job flags are `corral run`'s; "
                                   "one given overrides that field of the file (as sbatch's flags override #SBATCH "
                                   "lines). Invalid specs list every problem and exit 2.")
    add_connection_args(p)
    p.add_argument("file", help="job spec file (.yaml/.yml/.json) or - for stdin")
    add_job_args(p, run=False)
    p.add_argument("--id", help="job id (makes a retried submit a no-op); default generated")
    p.add_argument("--wait", action="store_true", help="wait until the job is final; exit 0 only if it completed")
    p.add_argument("--timeout", type=seconds_arg, default=None, metavar="S", help="with --wait: give up after S seconds")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--array", metavar="INDEXES", help="a job array: one job per index, e.g. 0-99, 1,3,5-9, 0-20:5; "
                   "%%N runs at most N at once (0-99%%8). Each element is job ID_INDEX with CORRAL_ARRAY_INDEX set; "
                   "the array's id names them all (cancel, hold, release, --after-ok)")
    _via_admission(p)
    p.add_argument("--follow", "-f", action="store_true", help="wait, printing every rank's output as it is "
                   "written ('R: ' before each line), like `corral run`")
    add_submitter_args(p)
    add_spec_extras(p)
    p.set_defaults(handler=submit)

    p = sub.add_parser("cancel", help="cancel jobs", description="Append CancelRequested for each job named or "
                       "chosen by the filters (an array id names all its elements); running workers get SIGTERM "
                       "and their grace period. With job ids, the filters narrow them.")
    add_connection_args(p)
    p.add_argument("jobs", nargs="*", metavar="JOB", help="job ids (or job array ids)")
    # `--user` is the NATS user of the connection options: the submitter filter is `--by-user`/`-u`, as for `jobs`.
    p.add_argument("--by-user", "-u", dest="by_user", metavar="USER", help="only jobs this user submitted")
    p.add_argument("--queue", "-q", "-p", "--partition", dest="queue", help="only jobs of this queue (Slurm's partition)")
    p.add_argument("--name", "-n", "--jobname", dest="name", help="only jobs of this name")
    p.add_argument("--state", "-t", "-s", metavar="STATE[,STATE]", help="only jobs in these states: pending, reserved, "
                   "running, preempting, active (the three holding GPUs); comma-separated, as `jobs --state`")
    p.add_argument("--reason", default="", help="recorded in the log")
    p.add_argument("--json", action="store_true")
    _via_admission(p)
    p.set_defaults(handler=cancel)

    for name, handler, what in (("hold", hold, "keep pending jobs from starting until `corral release`"),
                                ("release", release, "let held jobs start again")):
        p = sub.add_parser(name, help=what, description=f"{what[0].upper()}{what[1:]} (JobHeld / JobReleased in "
                           "the log); only a pending job can be held. An array id names all its elements.")
        add_connection_args(p)
        p.add_argument("jobs", nargs="+", metavar="JOB", help="job ids (or job array ids)")
        if name == "hold":
            p.add_argument("--reason", default="", help="recorded in the log")
        else:
            p.set_defaults(reason="")
        p.add_argument("--json", action="store_true")
        p.set_defaults(handler=handler, via_admission=False)


def _via_admission(p: argparse.ArgumentParser) -> None:
    env = os.environ.get("CORRAL_VIA_ADMISSION", "").lower() in ("1", "true", "yes")
    p.add_argument("--via-admission", action="store_true", default=env,
                   help="ask the admission service (`corral admission`) instead of appending: how users of a team "
                        "account (client-<team>) submit and cancel; it checks the team owns the queue "
                        "(env CORRAL_VIA_ADMISSION=1)")
