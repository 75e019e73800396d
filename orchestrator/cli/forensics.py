"""Forensics: `corral replay --at` (the cluster as it was) and `corral explain` (a job's story).

Both answer from the log alone, by folding it with the same `evolve` the
scheduler used, so what they show is what the scheduler knew at that point.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import aclosing
from typing import Any

import msgspec

from events.authorship import read_event
from events.bus import Bus, Envelope
from events.subjects import job_filter
from orchestrator.cli.connect import add_connection_args
from orchestrator.cli.errors import NOT_FOUND, OK, CliError
from orchestrator.cli.indexed import add_index_arg, asked, wants_index
from orchestrator.cli.listing import checked_id
from orchestrator.cli.output import human_duration, print_json, table
from orchestrator.cli.position import add_at_arg, log_clock, resolve_at
from orchestrator.cli.state_view import LogSource, add_log_arg, envelope_at, load_state, log_source
from orchestrator.cli.timeline import Entry, Run, Story, pending_by_reason, runs, story_summary
from orchestrator.cli.timespec import LogClock
from orchestrator.cli.views import (
    cluster_summary,
    estimate_lines,
    gpu_map,
    job_estimate,
    job_line,
    job_start,
    line_lines,
    queues_rows,
    running_policies,
    start_lines,
)
from orchestrator.core.gating import gate_reason, has_gates
from orchestrator.core.model.state import TERMINAL, ClusterState
from orchestrator.index import api
from orchestrator.index.client import IndexRefused

# --- replay --at -------------------------------------------------------------------------


def cluster_lines(view: dict[str, Any], at_time: float | None, clock: LogClock) -> list[str]:
    """`replay --at` for humans: GPU map per node, queues, pending jobs with reasons."""
    sched = f", epoch {view['epoch']} ({view['scheduler_id']})" if view["scheduler_id"] else ""
    when = "-" if at_time is None else clock.instant(at_time)
    out = [f"cluster at #{view['seq']} ({when}){sched}", "", "GPUs"]
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
        clock = await log_clock(bus)
        at = await resolve_at(bus, args.at, clock)
        state = await load_state(bus, to_seq=at.seq, use_snapshot=not args.no_snapshot)
        env = await envelope_at(bus, state.seq)
    at_time = env.stream_time if env is not None else None  # 0.0 is a time: a simulated log starts there
    view = cluster_summary(state, at.time if at_time is None else at_time)
    if args.json:
        print_json({"at": {"seq": state.seq, "time": at_time}, **view, "unreadable_events": state.unknown_events,
                    "refused_events": state.refused_events})
    else:
        print("\n".join(cluster_lines(view, at_time, clock)))
        if state.unknown_events:
            print(unreadable_summary(state.unknown_events, state.seq))
        if state.refused_events:
            print(f"refused: {state.refused_events} event(s) up to #{state.seq} whose subject, type and entity "
                  "disagree, folded as no change (`corral tail --no-follow` shows each as 'refused at position N: "
                  "why'; README, 'Who may write to the log')")
    return OK


def unreadable_summary(count: int, seq: int) -> str:
    """One line for the unreadable messages the fold skipped: the cluster above is what the rest of the log says."""
    return (f"unreadable: {count} message(s) up to #{seq}, folded as no change "
            "(`corral tail --no-follow` shows each as 'unreadable at position N: why')")


# --- explain -----------------------------------------------------------------------------


async def _job_known(bus: LogSource, job_id: str) -> bool:
    async with aclosing(bus.replay(subjects=[job_filter(job_id)], batch=1)) as batches:
        async for batch in batches:
            if batch:
                return True
    return False


async def _read_story(bus: LogSource, job_id: str, to_seq: int) -> Story:
    """Fold the log up to `to_seq` (streamed, never held in memory) into the job's story."""
    from orchestrator.cli.archive import check_contiguous

    story = Story(job_id)
    nxt = 1
    async with aclosing(bus.replay(to_seq=to_seq)) as batches:
        async for batch in batches:
            for env in batch:
                if env.seq != nxt:
                    await check_contiguous(bus, nxt, env.seq)
                nxt = env.seq + 1
                story.add(env)
    return story


async def _indexed_story(bus: Bus, job_id: str) -> Story | None:
    """The job's story from the index service: its events and their context, fetched by their positions,
    folded in order (void where the whole log's fold said so). None: no index answers, or it cannot tell."""
    story = Story(job_id)
    request = api.EventsRequest(job_id=job_id, limit=api.MAX_LIMIT)
    while True:
        try:
            reply = await asked(bus, api.EVENTS, request, api.EventsReply, fresh=request.after == 0)
        except IndexRefused as e:
            if e.error != "not_found":  # (not found: maybe not indexed yet; the log says for sure)
                print(f"corral: the index cannot tell this story ({e}); reading the whole log instead",
                      file=sys.stderr)
            return None
        if reply is None:
            return None
        for ev in reply.events:
            env = Envelope(ev.seq, ev.subject, ev.time, read_event(ev.subject, ev.data))
            if ev.own and ev.void is not None:
                story.add_void(env, ev.void)
                continue
            told = len(story.entries)
            story.add(env)
            if ev.own and len(story.entries) > told and story.entries[-1].void:
                # The job's events and their context judged a step void that the whole log's fold took:
                # this story would be wrong from here. Never print it; the whole log tells it right.
                print(f"corral: the index's context for {job_id} does not suffice at #{ev.seq}; reading the "
                      "whole log instead", file=sys.stderr)
                return None
        if reply.next_after is None:
            story.end = max(story.end, reply.as_of_time)  # the log's newest event the index has seen
            return story
        request = msgspec.structs.replace(request, after=reply.next_after)


async def job_story(bus: LogSource, job_id: str, *, use_index: bool, at: str | None = None,
                    clock: LogClock | None = None, state: ClusterState | None = None) -> Story:
    """The job's story (what `explain` prints, and the web UI's job page): from the index when asked and it
    can tell it, else folded from the whole log up to `at`. `state`: the fold at the log's end if the caller
    holds one (the UI's live view), for a job not over, instead of loading it. Raises CliError (NOT_FOUND)
    for a job the log does not know."""
    story = await _indexed_story(bus, job_id) if use_index and isinstance(bus, Bus) else None
    if story is not None and story.job is not None and has_gates(story.job.spec.gating):
        # Its gates turn on other jobs' events (those it depends on, its array's other elements), which are
        # no context the index keeps: the whole log tells its story.
        story = None
    if story is not None and story.job is not None and story.job.status not in TERMINAL:
        # A job not over gets its run-time estimate, learned from every job's history: the fold's.
        story.state = state if state is not None else await load_state(bus)
    if story is None:
        # A story folds the log from its start: from what retention left, a job would seem unknown.
        from orchestrator.cli.archive import require_from

        await require_from(bus, 1, f"explain {job_id} reads the whole log")
        if not await _job_known(bus, job_id):
            raise CliError(f"unknown job {job_id!r}: the log has no event about it", NOT_FOUND)
        position = await resolve_at(bus, at, clock)
        story = await _read_story(bus, job_id, position.seq)
        if not story.entries:
            raise CliError(f"job {job_id!r} has no event up to #{position.seq} (--at {at})", NOT_FOUND)
    return story


async def explain(args: argparse.Namespace) -> int:
    job_id = checked_id(args.job, "job id")
    async with log_source(args) as bus:
        clock = await log_clock(bus)
        story = await job_story(bus, job_id, use_index=wants_index(args), at=args.at, clock=clock)
        # The present `corral job` counts from (the server's clock, or --at's moment), not the log's newest event:
        # on a quiet log that is minutes old, and the two commands told one job's end or start differently.
        now = (await resolve_at(bus, args.at, clock)).time
    job, entries = story.job, story.entries
    summary = story_summary(job, job_id, entries)
    pending = pending_by_reason(entries, story.end)
    # A job's first reason names its estimate only if it queued behind others; say it for any job not over,
    # with the functions `corral job` tells it by, on the fold's record of the job.
    live = story.state.jobs.get(job_id, job)
    estimate = job_estimate(story.state, live, now) if live is not None else None
    start = job_start(story.state, live, now) if live is not None else None
    # Held, waiting for the jobs it depends on, or for a slot of its array (core/gating.py).
    gate = gate_reason(story.state, story.state.jobs[job_id]) if job_id in story.state.gated else None
    line = job_line(live, now, running_policies(story.state)) if live is not None else None
    if args.json:
        print_json({"job_id": job_id, "status": job.status if job else None, "attempt": job.attempt if job else None,
                    "summary": summary, "pending_s": pending, "estimate": estimate, "expected_start": start,
                    "gate": gate, "line": line, "timeline": [e.to_dict() for e in entries]})
        return OK if job is not None else NOT_FOUND
    print(summary)
    if gate is not None:
        print(f"  gated: {gate}")
    if pending:
        reasons = ", ".join(f"{human_duration(t)} {code}" for code, t in pending.items())
        print(f"  pending {human_duration(sum(pending.values()))} in all: {reasons}")
    if live is not None:
        for key, value in start_lines(start, now):
            print(f"  {key}: {value}")
    if live is not None and estimate is not None:  # not known: the story has nothing to add
        for key, value in estimate_lines(estimate, live, now):
            print(f"  {key}: {value}")
    if live is not None:
        for key, value in line_lines(line, live, now):
            print(f"  {key}: {value}")
    print("\n".join(story_lines(entries, clock, every=args.all)))
    return OK if job is not None else NOT_FOUND  # a story without its submission is not the job's story


def story_lines(entries: list[Entry], clock: LogClock, *, every: bool) -> list[str]:
    """One line per step: when (on the log's clock), how long after submit, position, what happened.

    A simulated log's steps may be days apart: its clock prints the day, its offsets read as durations.
    """
    t0 = entries[0].time if entries else 0.0
    tw = max((len(clock.time_of_day(e.time)) for e in entries), default=0)
    ow = max((len(clock.offset(e.time - t0)) for e in entries), default=0)
    out: list[str] = []
    collapsed = False
    for run in [Run(e, e, 1) for e in entries] if every else runs(entries):
        e, last = run.first, run.last
        out.append(f"  {clock.time_of_day(e.time):>{tw}} {clock.offset(e.time - t0):>{ow}} #{e.seq:<6} "
                   f"{clock.moments(e.text)}")
        if run.told > 1:
            collapsed = True
            newest = f", newest: {clock.moments(last.event.message)}" if last.text != e.text else ""
            out.append(f"  {'':>{tw}} {'':>{ow}} {'':>7} ... told {run.told} times, the last at "
                       f"{clock.time_of_day(last.time)} #{last.seq} ({human_duration(last.time - e.time)} later)"
                       f"{newest}")
    if collapsed:
        out.append("  (a reason told again in a row is shown once; --all prints every step)")
    return out


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "replay", help="the cluster as it was at a past log position",
        description="Fold the log up to --at and print what the scheduler knew then: the GPU map per node with "
                    "owner jobs, queues with usage and guarantees, pending jobs with their reasons.",
    )
    add_connection_args(p)
    add_log_arg(p)
    add_at_arg(p, "the cluster")
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
    add_at_arg(p, "the story")
    p.add_argument("--all", action="store_true", help="print every step: a pending reason told again in a row is "
                   "otherwise shown once, with how often and until when (--json always has every step)")
    p.add_argument("--json", action="store_true")
    add_index_arg(p)
    p.set_defaults(handler=explain)
