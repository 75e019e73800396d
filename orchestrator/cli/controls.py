"""`corral update`, `corral requeue`, `corral reservation`: day-two controls (issue #41, README "Day-two controls").

Each appends a request event (events/controls.py) and the scheduler acts on it
in its pure core: an update is answered by a JobUpdated (old -> new, or why
refused), which `update` waits for; a requeue stops a running job and puts it
back in line; a reservation keeps its nodes free of other work over its window.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import re
import sys
import time
from typing import Any

from events.controls import create_reservation, delete_reservation, request_requeue, request_update, update_answer
from orchestrator.cli.connect import add_connection_args, connected
from orchestrator.cli.errors import FAILURE, NOT_FOUND, OK, TIMEOUT, USAGE, CliError
from orchestrator.cli.jobs import current_user, queue_refusal
from orchestrator.cli.listing import checked_id
from orchestrator.cli.output import human_duration, print_json
from orchestrator.cli.render import limit_text
from orchestrator.cli.state_view import load_state
from orchestrator.cli.timespec import parse_duration, parse_span, seconds_arg
from orchestrator.core.model.reserved import Reservation
from orchestrator.core.model.state import HOLDING, ClusterState, Job
from orchestrator.core.requeues import REOPENED

#: `--time-limit` values that ask for no limit (Slurm's UNLIMITED).
_NO_LIMIT = ("unlimited", "infinite", "none")
_RELATIVE = re.compile(r"(?:now)?\s*\+\s*(.+)", re.IGNORECASE)


def time_limit_arg(text: str) -> float:
    """Seconds of a `--time-limit` (Slurm's forms, a plain number in minutes); 0 for UNLIMITED/none."""
    if text.strip().lower() in _NO_LIMIT:
        return 0.0
    try:
        seconds = parse_span(text, bare_s=60)  # Slurm's: `scontrol update timelimit=60` is an hour
    except ValueError as e:
        raise CliError(f"bad time limit {text!r}: {e}", USAGE) from None
    if seconds <= 0:
        raise CliError(f"bad time limit {text!r}: must be positive (or UNLIMITED)", USAGE)
    return seconds


def moment_arg(text: str, now: float, what: str) -> float:
    """Unix time of `now`, `now+1h` / `+1h` (a duration after now), or an ISO timestamp (local if no zone)."""
    t = text.strip()
    if t.lower() == "now":
        return now
    m = _RELATIVE.fullmatch(t)
    if m is not None:
        return now + parse_duration(m.group(1))
    try:
        when = dt.datetime.fromisoformat(t.replace("Z", "+00:00") if t.endswith("Z") else t)
    except ValueError:
        raise CliError(f"bad {what} {text!r}: use now, now+DURATION (now+2h), or an ISO time "
                       "(2026-12-24T08:00)", USAGE) from None
    return when.timestamp()


def _job(state: ClusterState, job_id: str) -> Job:
    job = state.jobs.get(job_id)
    if job is None:
        raise CliError(f"unknown job {job_id!r} (see `corral jobs`)", NOT_FOUND)
    return job


# --- update ---------------------------------------------------------------------


async def update(args: argparse.Namespace) -> int:
    job_id = checked_id(args.job, "job id")
    limit = time_limit_arg(args.time_limit) if args.time_limit is not None else None
    queue = checked_id(args.queue, "queue") if args.queue is not None else None
    if args.priority is None and limit is None and queue is None:
        raise CliError("nothing to update: give --priority, --time-limit or --queue", USAGE)
    async with connected(args) as bus:
        state = await load_state(bus)
        _job(state, job_id)
        if queue is not None and (refused := queue_refusal(state, queue)) is not None:
            raise CliError(refused, USAGE)
        seq, request_id = await request_update(bus, job_id, user=current_user(args), priority=args.priority,
                                               time_limit_s=limit, queue=queue, operator=args.operator,
                                               reason=args.reason)
        answer = await update_answer(bus, job_id, request_id, seq, args.timeout) if args.timeout > 0 else None
    row: dict[str, Any] = {"job_id": job_id, "request_id": request_id, "seq": seq, "answered": answer is not None}
    if answer is None:
        if args.json:
            print_json(row)
        else:
            print(f"update of {job_id} requested (#{seq}); the scheduler has not answered "
                  f"{'yet' if args.timeout <= 0 else f'in {args.timeout:g}s'} (`corral job {job_id}` tells when it does)")
        return OK if args.timeout <= 0 else TIMEOUT
    row.update(changes=[{"field": c.field, "old": c.old, "new": c.new} for c in answer.changes],
               refused=answer.refused or None)
    if args.json:
        print_json(row)
    elif answer.refused:
        print(f"corral: error: update of {job_id} refused: {answer.refused}", file=sys.stderr)
    else:
        for c in answer.changes:
            print(f"{job_id}: {c.field} {limit_text(c.old)} -> {limit_text(c.new)}")
    return FAILURE if answer.refused else OK


# --- requeue --------------------------------------------------------------------


def _requeue_refusal(job: Job) -> str | None:
    if job.status in HOLDING:
        if job.status == "preempting":
            return f"{job.job_id} is being preempted: it goes back to the queue by itself"
        if job.stop is not None:
            return f"{job.job_id} is already stopping ({job.stop.reason or 'cancel requested'})"
        return None
    if job.status == "pending":
        return f"{job.job_id} is pending already"
    if job.status not in REOPENED:
        return f"{job.job_id} is {job.status}: it can never run (submit it again, fixed)"
    if job.spec.gating.array is not None:
        return f"{job.job_id} is an element of array {job.spec.gating.array.array_id}, which counted its end: submit it again"
    return None


async def requeue(args: argparse.Namespace) -> int:
    ids = [checked_id(j, "job id") for j in args.jobs]
    rows: list[dict[str, Any]] = []
    code = OK
    async with connected(args) as bus:
        state = await load_state(bus)
        for jid in ids:
            job = state.jobs.get(jid)
            if job is None:
                print(f"corral: error: unknown job {jid!r} (see `corral jobs --all`)", file=sys.stderr)
                code = NOT_FOUND
                continue
            refused = _requeue_refusal(job)
            if refused is not None:
                print(f"corral: error: cannot requeue: {refused}", file=sys.stderr)
                code = code if code == NOT_FOUND else FAILURE
                continue
            seq = await request_requeue(bus, jid, user=current_user(args), reason=args.reason)
            rows.append({"job_id": jid, "seq": seq, "was": job.status, "resumes_from": job.newest_checkpoint})
    if args.json:
        print_json(rows)
    else:
        for r in rows:
            how = "its workers stop, then it waits again" if r["was"] in HOLDING else "pending again"
            frm = f", resuming from {r['resumes_from']}" if r["resumes_from"] else ""
            print(f"requeue requested for {r['job_id']} ({r['was']}): {how}{frm}")
    return code


# --- reservations ---------------------------------------------------------------


def _csv(text: str | None) -> tuple[str, ...]:
    return tuple(dict.fromkeys(p.strip() for p in (text or "").split(",") if p.strip()))


def reservation_state(r: Reservation, now: float) -> str:
    return "ended" if now >= r.end else "active" if now >= r.start else "upcoming"


def _overlapping(state: ClusterState, nodes: tuple[str, ...], start: float) -> list[str]:
    """Jobs holding GPUs on `nodes` that may still run at `start` (their time limit, or none, says so)."""
    found: list[str] = []
    for jid in state.active:
        job = state.jobs[jid]
        limit = job.spec.time_limit_s
        ends = job.reserved_at + limit if limit is not None else math.inf
        if ends > start and any(rp.node_id in nodes for rp in job.placement):
            found.append(f"{jid} (on {', '.join(sorted({rp.node_id for rp in job.placement} & set(nodes)))}, "
                         + ("no time limit)" if limit is None else f"ends by t={ends:.0f})"))
    return found


def _free_for(state: ClusterState, count: int, start: float, end: float) -> tuple[str, ...]:
    """`count` schedulable nodes, in registration order, no work on them reaching `start`, not reserved
    over an overlapping window: `--count`'s choice."""
    taken = {n for r in state.reservations.values() if r.start < end and start < r.end for n in r.nodes}
    chosen: list[str] = []
    for nid, node in state.nodes.items():
        if node.schedulable and nid not in taken and not _overlapping(state, (nid,), start):
            chosen.append(nid)
            if len(chosen) == count:
                return tuple(chosen)
    raise CliError(f"only {len(chosen)} node(s) are free of work and other reservations from the window's start; "
                   f"asked for {count} (name them with --nodes and --ignore-jobs to reserve busy ones)", FAILURE)


async def reservation_create(args: argparse.Namespace) -> int:
    name = checked_id(args.name, "reservation name")
    now = time.time()
    start = moment_arg(args.start, now, "--start")
    if args.end is not None and args.duration is not None:
        raise CliError("give --end or --duration, not both", USAGE)
    if args.end is None and args.duration is None:
        raise CliError("give --end TIME or --duration DURATION", USAGE)
    end = moment_arg(args.end, now, "--end") if args.end is not None else start + parse_duration(args.duration)
    if end <= start:
        raise CliError("the reservation must end after it starts", USAGE)
    if end <= now:
        raise CliError("the reservation's window is over already", USAGE)
    nodes, users = _csv(args.nodes), _csv(args.users)
    if bool(nodes) == (args.count is not None):
        raise CliError("give --nodes n1,n2 or --count K", USAGE)
    for n in (*nodes, *users):
        checked_id(n, "node or user")
    queue = checked_id(args.queue, "queue") if args.queue is not None else None
    async with connected(args) as bus:
        state = await load_state(bus)
        if name in state.reservations:
            raise CliError(f"reservation {name} exists already (`corral reservation delete {name}` first)", FAILURE)
        unknown = [n for n in nodes if n not in state.nodes]
        if unknown:
            raise CliError(f"unknown node(s) {', '.join(unknown)} (see `corral nodes`)", NOT_FOUND)
        if args.count is not None:
            nodes = _free_for(state, args.count, start, end)
        busy = _overlapping(state, nodes, start)
        if busy and not args.ignore_jobs:
            raise CliError(f"work on the nodes may still run when the window opens: {'; '.join(busy)} "
                           "(--ignore-jobs reserves them anyway: that work keeps running)", FAILURE)
        seq = await create_reservation(bus, name, nodes, start, end, user=current_user(args), users=users,
                                       queue=queue, reason=args.reason)
    row = {"name": name, "seq": seq, "nodes": list(nodes), "start": start, "end": end, "users": list(users),
           "queue": queue}
    if args.json:
        print_json(row)
    else:
        print(f"reservation {name}: {', '.join(nodes)} from {_when(start)} to {_when(end)} "
              f"({human_duration(end - start)}) for {', '.join(users) or 'jobs naming it'}")
    return OK


def _when(t: float) -> str:
    return dt.datetime.fromtimestamp(t).isoformat(timespec="seconds")


async def reservation_list(args: argparse.Namespace) -> int:
    async with connected(args) as bus:
        state = await load_state(bus)
    now = time.time()
    found = sorted(state.reservations.values(), key=lambda r: (r.start, r.name))
    if args.json:
        print_json([{"name": r.name, "nodes": list(r.nodes), "start": r.start, "end": r.end, "users": list(r.users),
                     "queue": r.queue, "created_by": r.created_by, "reason": r.reason,
                     "state": reservation_state(r, now)} for r in found])
        return OK
    if not found:
        print("(no reservations)")
        return OK
    rows = [("NAME", "STATE", "START", "END", "NODES", "USERS", "QUEUE")]
    rows += [(r.name, reservation_state(r, now), _when(r.start), _when(r.end), ",".join(r.nodes),
              ",".join(r.users) or "-", r.queue or "-") for r in found]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return OK


async def reservation_delete(args: argparse.Namespace) -> int:
    name = checked_id(args.name, "reservation name")
    async with connected(args) as bus:
        state = await load_state(bus)
        if name not in state.reservations:
            raise CliError(f"unknown reservation {name!r} (see `corral reservation list`)", NOT_FOUND)
        seq = await delete_reservation(bus, name, user=current_user(args))
    if args.json:
        print_json({"name": name, "seq": seq})
    else:
        print(f"reservation {name} deleted: its nodes take any work again")
    return OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("update", help="change a job's priority, time limit or queue (like scontrol update)",
                       description="Append JobUpdateRequested and wait for the scheduler's answer (JobUpdated: "
                                   "old -> new, or why refused; exit 1 when refused). A pending job may change its "
                                   "priority, time limit and queue; a running one its time limit, lower only, "
                                   "unless --operator (admin credentials) raises it.")
    add_connection_args(p)
    p.add_argument("job", metavar="JOB", help="job id")
    p.add_argument("--priority", type=int, metavar="N", help="new priority (higher goes first in its queue)")
    p.add_argument("--time-limit", metavar="T", help="new time limit, in Slurm's forms (a plain number is minutes, as scontrol's; 2:00:00, 90m, 1d) or UNLIMITED")
    p.add_argument("--queue", metavar="Q", help="move a pending job to queue Q")
    p.add_argument("--operator", action="store_true",
                   help="ask as an operator (JobUpdateByOperator, which only the admin role may append): may raise "
                        "a running job's time limit")
    p.add_argument("--reason", default="", help="recorded in the log")
    p.add_argument("--timeout", type=seconds_arg, default=15.0, metavar="S",
                   help="wait at most S seconds for the scheduler's answer (0: do not wait); exit 5 when it ran out")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=update)

    p = sub.add_parser("requeue", help="put jobs back in the queue (like scontrol requeue)",
                       description="Append RequeueRequested: a running job's workers stop (signal, grace) and it "
                                   "waits again as its next attempt, from its newest checkpoint, its restarts unspent; "
                                   "a completed, failed or cancelled job is pending again at once.")
    add_connection_args(p)
    p.add_argument("jobs", nargs="+", metavar="JOB", help="job ids")
    p.add_argument("--reason", default="", help="recorded in the log")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=requeue)

    p = sub.add_parser("reservation", help="reserve nodes for a window (maintenance, an event)",
                       description="Node reservations: over its window a reserved node takes no new work, nor work "
                                   "whose time limit would reach into the window, except jobs that name the "
                                   "reservation (`submit --reservation NAME`) from its users.")
    add_connection_args(p)
    rsub = p.add_subparsers(dest="reservation_command", metavar="{create,list,delete}", required=True)
    c = rsub.add_parser("create", help="reserve nodes over a window",
                        description="Append ReservationCreated. Refused (exit 1) when work on the nodes may still run "
                                    "at the window's start, unless --ignore-jobs.")
    add_connection_args(c)
    c.add_argument("name", help="the reservation's name (jobs name it with --reservation)")
    c.add_argument("--nodes", metavar="N1,N2", help="the nodes to reserve")
    c.add_argument("--count", type=int, metavar="K", help="reserve K nodes free of work at the window's start")
    c.add_argument("--start", default="now", metavar="WHEN", help="now (default), now+DURATION, or an ISO time")
    c.add_argument("--end", metavar="WHEN", help="now+DURATION or an ISO time")
    c.add_argument("--duration", metavar="DURATION", help="instead of --end: how long (4h, 2d)")
    c.add_argument("--users", metavar="U1,U2", help="only their jobs may use it (default: any job naming it)")
    c.add_argument("--queue", metavar="Q", help="only jobs of queue Q may use it")
    c.add_argument("--ignore-jobs", action="store_true",
                   help="reserve nodes whose running work may reach into the window (it keeps running)")
    c.add_argument("--reason", default="", help="recorded in the log")
    c.add_argument("--json", action="store_true", help="machine-readable output")
    c.set_defaults(handler=reservation_create)
    ls = rsub.add_parser("list", help="list reservations", description="Every reservation the log holds.")
    add_connection_args(ls)
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(handler=reservation_list)
    d = rsub.add_parser("delete", help="delete a reservation",
                        description="Append ReservationDeleted: its nodes take any work again; jobs naming it are "
                                    "rejected.")
    add_connection_args(d)
    d.add_argument("name", help="the reservation's name")
    d.add_argument("--json", action="store_true", help="machine-readable output")
    d.set_defaults(handler=reservation_delete)
