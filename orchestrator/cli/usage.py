"""`corral usage`: GPU-hours per queue, user or state from the whole log, like Slurm's sacct/sreport.

Not the fold's retained jobs (the newest FINISHED_KEPT finished ones): the
index service answers from its tables (orchestrator/index/, kept by the same
rules), or, when none answers, one streaming pass over every event
(orchestrator/core/accounting.py); either way a report of last month is
exact however many jobs ran since.
"""

from __future__ import annotations

import argparse
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

from orchestrator.cli.connect import add_connection_args
from orchestrator.cli.errors import OK, USAGE, CliError
from orchestrator.cli.indexed import add_index_arg, asked, freshness, wants_index
from orchestrator.cli.output import print_json, print_table
from orchestrator.cli.position import log_clock
from orchestrator.cli.state_view import LogSource, add_log_arg, log_now, log_source
from orchestrator.cli.timespec import LogClock
from orchestrator.index import api

if TYPE_CHECKING:  # (imported when the command runs: `corral usage --help` needs neither the log nor the fold)
    from orchestrator.core.accounting import Account, GpuTime
    from orchestrator.core.model.state import ClusterState

_WHEN = ("a duration before the log's end (30d, 12h), one after its first event (+3d), an ISO time, or on a "
         "simulated log a day and time (d3, 'd3 12:00')")


async def gpu_time(source: LogSource, meter: GpuTime) -> tuple[ClusterState, int]:
    """Fold the whole log through `meter`; the final state and how many events were read.

    From the stream alone, a head that retention or a purge removed is refused, naming the range
    (`require_from`): a total over part of the log is not the usage asked for.
    """
    from orchestrator.cli.archive import check_contiguous, require_from
    from orchestrator.core.model.state import ClusterState

    await require_from(source, 1, "usage counts the whole log")
    state = ClusterState()
    events = 0
    async with aclosing(source.replay()) as batches:
        async for batch in batches:
            for env in batch:
                if env.seq > state.seq:  # (a log file may repeat or skip positions: fold what it holds)
                    if env.seq != state.seq + 1:
                        await check_contiguous(source, state.seq + 1, env.seq)
                    state = meter.fold(state, env.event, env.seq)
                    events += 1
    return state, events


async def usage(args: argparse.Namespace) -> int:
    from events.logfile import LogFile
    from orchestrator.core.accounting import Account, GpuTime

    async with log_source(args) as source:
        clock = await log_clock(source)
        now = await log_now(source)
        since = clock.parse(args.since, now) if args.since is not None else None
        until = clock.parse(args.until, now) if args.until is not None else None
        if since is not None and until is not None and until < since:
            raise CliError(f"--until {args.until} is before --since {args.since}", USAGE)
        end = now if until is None else min(now, until)
        if wants_index(args) and not isinstance(source, LogFile):
            reply = await asked(source, api.USAGE, api.UsageRequest(by=args.by, since=since, until=until, end=end),
                                api.UsageReply)
            if reply is not None:
                accounts = {r.key: Account(r.gpu_seconds, r.reservations, r.finished) for r in reply.rows}
                where = f"{reply.events:,} events up to #{reply.as_of_seq}, {freshness(reply, await source.last_seq())}"
                return report(args, clock, accounts, since, until, end, reply.as_of_seq, reply.events, where)
        meter = GpuTime(by=args.by, since=since, until=until)
        state, events = await gpu_time(source, meter)
    meter.held_until(state, end)
    return report(args, clock, meter.accounts, since, until, end, state.seq, events,
                  f"{events:,} events up to #{state.seq}")


def report(args: argparse.Namespace, clock: LogClock, accounts: dict[str, Account], since: float | None,
           until: float | None, end: float, seq: int, events: int, where: str) -> int:
    """Print the accounts: the same table and JSON whether the index or a pass over the log counted them."""
    total = sum(a.gpu_seconds for a in accounts.values())
    rows: list[dict[str, Any]] = []
    for key, acct in sorted(accounts.items(), key=lambda kv: (-kv[1].gpu_seconds, kv[0])):
        rows.append({
            args.by: key,
            "gpu_hours": acct.gpu_seconds / 3600.0,
            "share": acct.gpu_seconds / total if total > 0 else 0.0,
            "reservations": acct.reservations,
            "finished": dict(sorted(acct.finished.items())),
        })
    if args.json:
        print_json({"by": args.by, "since": since, "until": until, "end": end, "seq": seq,
                    "events": events, "gpu_hours": total / 3600.0, "rows": rows})
        return OK
    window = f"{clock.instant(since) if since is not None else 'the first event'} to {clock.instant(end)}"
    print(f"GPU-hours by {args.by}, {window} ({where})")
    print_table(
        (args.by.upper(), "GPU-HOURS", "SHARE", "RESERVATIONS", "FINISHED"),
        [[r[args.by], f"{r['gpu_hours']:.2f}", f"{100 * r['share']:.1f}%", r["reservations"],
          " ".join(f"{k}={v}" for k, v in r["finished"].items()) or "-"] for r in rows],
        empty="(no GPU time in this window)",
    )
    if rows:
        print(f"total {total / 3600.0:.2f} GPU-hours")
    return OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("usage", help="GPU-hours per queue, user or state from the whole log (like sacct)",
                       description="GPU-hours each queue (or submitter) held, from the index service (`corral "
                                   "index`) or else one pass over the whole log: "
                                   "a reservation counts from its GangReserved to the event that released it "
                                   "(completed, failed, cancelled, preempted, requeued); one still running counts "
                                   "up to now (or --until). Not limited to the jobs `corral jobs --all` retains.")
    add_connection_args(p)
    add_log_arg(p)
    p.add_argument("--since", metavar="WHEN", help=f"start of the window: {_WHEN} (default: the log's start)")
    p.add_argument("--until", metavar="WHEN", help="end of the window, same forms (default: now, or a log "
                   "file's last event)")
    p.add_argument("--by", choices=("queue", "user", "state"), default="queue", help="group by the queue "
                   "charged, the submitter, or how each reservation ended (completed, failed, cancelled; pending: "
                   "preempted or requeued; running/reserved/preempting: still held) (default queue)")
    add_index_arg(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=usage)
