"""Forensics: `corral replay --at` (the cluster as it was) and `corral explain` (a job's story).

Both answer from the log alone, by folding it with the same `evolve` the
scheduler used, so what they show is what the scheduler knew at that point.
"""

from __future__ import annotations

import argparse
from contextlib import aclosing
from typing import Any

from events.subjects import job_filter
from orchestrator.cli.connect import add_connection_args
from orchestrator.cli.errors import NOT_FOUND, OK, USAGE, CliError
from orchestrator.cli.listing import checked_id
from orchestrator.cli.output import human_duration, print_json, table
from orchestrator.cli.state_view import (
    LogSource,
    add_log_arg,
    envelope_at,
    load_state,
    log_now,
    log_source,
    seq_at_time,
)
from orchestrator.cli.timeline import Run, Story, pending_by_reason, runs, story_summary
from orchestrator.cli.timespec import format_instant, parse_instant
from orchestrator.cli.views import cluster_summary, gpu_map, queues_rows

# --- replay --at -------------------------------------------------------------------------


async def resolve_at(bus: LogSource, text: str | None, now: float) -> int:
    """A log position from `--at`: a sequence number, a time (ISO or `10m` ago), or the end."""
    if text is None:
        return await bus.last_seq()
    t = text.strip().lstrip("#")
    if t.isdigit():
        return int(t)
    return await seq_at_time(bus, parse_instant(t, now))


def cluster_lines(view: dict[str, Any], at_time: float) -> list[str]:
    """`replay --at` for humans: GPU map per node, queues, pending jobs with reasons."""
    sched = f", epoch {view['epoch']} ({view['scheduler_id']})" if view["scheduler_id"] else ""
    out = [f"cluster at #{view['seq']} ({format_instant(at_time)}){sched}", "", "GPUs"]
    node_rows = []
    for n in view["nodes"]:
        owners = tuple(o or "" for o in n["owners"])
        marks = [f"{i}>{m}" for i, m in enumerate(n["earmarks"]) if m]
        note = f"  earmarked {' '.join(marks)}" if marks else ""
        node_rows.append([n["node_id"], n["state"], f"{n['used']}/{n['gpus']}", gpu_map(owners) + note])
    out.append(table(("NODE", "STATE", "USED", "GPU MAP (index=job)"), node_rows) if node_rows else "(no nodes)")
    out += ["", "QUEUES"]
    rows = queues_rows(view["queues"])
    out.append(table(("QUEUE", "USED", "GUARANTEE", "LIMIT", "WEIGHT", "PENDING", "ACTIVE", "PARENT"), rows)
               if rows else "(no queues)")
    out += ["", "PENDING"]
    pend = [[p["job_id"], p["queue"], p["priority"], p["gpus"], p["attempt"],
             f"{p['code']}: {p['message']}" if p["code"] else "not looked at yet"] for p in view["pending"]]
    out.append(table(("JOB", "QUEUE", "PRIO", "GPUS", "ATTEMPT", "REASON"), pend) if pend else "(none)")
    counts = ", ".join(f"{v} {k}" for k, v in view["jobs"].items() if v)
    out += ["", f"jobs: {counts or 'none'}"]
    return out


async def replay(args: argparse.Namespace) -> int:
    async with log_source(args) as bus:
        end = await bus.last_seq()
        now = await log_now(bus)
        seq = await resolve_at(bus, args.at, now)
        if seq > end:
            raise CliError(f"the log ends at #{end}; --at #{seq} is in the future", USAGE)
        state = await load_state(bus, to_seq=seq, use_snapshot=not args.no_snapshot)
        env = await envelope_at(bus, state.seq)
    at_time = env.stream_time if env is not None else 0.0
    view = cluster_summary(state, at_time or now)
    if args.json:
        print_json({"at": {"seq": state.seq, "time": at_time or None}, **view})
    else:
        print("\n".join(cluster_lines(view, at_time)))
    return OK


# --- explain -----------------------------------------------------------------------------


async def _job_known(bus: LogSource, job_id: str) -> bool:
    async with aclosing(bus.replay(subjects=[job_filter(job_id)], batch=1)) as batches:
        async for batch in batches:
            if batch:
                return True
    return False


async def _read_story(bus: LogSource, job_id: str) -> Story:
    """Fold the whole log (streamed, never held in memory) into the job's story."""
    story = Story(job_id)
    async with aclosing(bus.replay()) as batches:
        async for batch in batches:
            for env in batch:
                story.add(env)
    return story


async def explain(args: argparse.Namespace) -> int:
    job_id = checked_id(args.job, "job id")
    async with log_source(args) as bus:
        if not await _job_known(bus, job_id):
            raise CliError(f"unknown job {job_id!r}: the log has no event about it", NOT_FOUND)
        story = await _read_story(bus, job_id)
    job, entries = story.job, story.entries
    summary = story_summary(job, job_id, entries)
    pending = pending_by_reason(entries, story.end)
    if args.json:
        print_json({"job_id": job_id, "status": job.status if job else None, "attempt": job.attempt if job else None,
                    "summary": summary, "pending_s": pending, "timeline": [e.to_dict() for e in entries]})
        return OK
    print(summary)
    if pending:
        reasons = ", ".join(f"{human_duration(t)} {code}" for code, t in pending.items())
        print(f"  pending {human_duration(sum(pending.values()))} in all: {reasons}")
    t0 = entries[0].time if entries else 0.0
    collapsed = False
    for run in runs(entries) if not args.all else [Run(e, e, 1) for e in entries]:
        e, last = run.first, run.last
        print(f"  {_clock(e.time)} +{e.time - t0:8.3f}s #{e.seq:<6} {e.text}")
        if run.count > 1:
            collapsed = True
            newest = f", newest: {last.event.message}" if last.text != e.text else ""
            print(f"  {'':>12} {'':>10} {'':>7} ... told {run.count} times, the last at "
                  f"{_clock(last.time)} #{last.seq} ({human_duration(last.time - e.time)} later){newest}")
    if collapsed:
        print("  (a reason told again in a row is shown once; --all prints every step)")
    return OK


def _clock(ts: float) -> str:
    """The time of day (the log's day is in the summary's timestamps); a log starting at 0 has no clock."""
    return f"{format_instant(ts)[11:] if ts > 0 else '-':>12}"



def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "replay", help="the cluster as it was at a past log position",
        description="Fold the log up to --at and print what the scheduler knew then: the GPU map per node with "
                    "owner jobs, queues with usage and guarantees, pending jobs with their reasons.",
    )
    add_connection_args(p)
    add_log_arg(p)
    p.add_argument("--at", metavar="SEQ|TIME", help="a sequence number (123 or #123), an ISO time, or a duration "
                   "ago such as 10m (default: the end of the log)")
    p.add_argument("--no-snapshot", action="store_true", help="fold from the first event, ignoring snapshots")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=replay)

    p = sub.add_parser(
        "explain", help="a job's story from the log",
        description="Every step of a job from the log alone: submitted, each pending reason, where and why it was "
                    "reserved, started, preempted by whom and why, checkpoints, requeues, resumes, the end.",
    )
    add_connection_args(p)
    add_log_arg(p)
    p.add_argument("job", help="job id")
    p.add_argument("--all", action="store_true", help="print every step: a pending reason told again in a row is "
                   "otherwise shown once, with how often and until when (--json always has every step)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=explain)
