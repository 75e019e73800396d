"""`corral top`: a live view of the cluster, redrawn from the live tail.

The frame is a pure function of (state, recent events, now): the live loop
only folds the tail into a state (the shared Follower) and redraws, and
`--once` prints one frame, which is how tests pin what it shows.

GPU cells carry a letter per job (legend below the grid) and the color of the
job's queue, so the grid reads in color and in plain text alike.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import string
import time
from collections import deque
from collections.abc import Sequence
from contextlib import aclosing

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from events.bus import Bus, Envelope
from events.follow import Follower
from orchestrator.cli.connect import add_connection_args, connected
from orchestrator.cli.errors import OK
from orchestrator.cli.render import line
from orchestrator.cli.state_view import load_state, log_now
from orchestrator.cli.views import (
    job_queue,
    job_shape,
    node_state,
    queue_summaries,
    readable,
    sorted_nodes,
    waiting_text,
)
from orchestrator.core.evolve import evolve
from orchestrator.core.gating import gate_reason
from orchestrator.core.model.state import FREE, ClusterState

PALETTE = ("cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta", "bright_green",
           "bright_yellow", "bright_blue", "bright_red")
LETTERS = string.ascii_uppercase + string.ascii_lowercase + string.digits
FREE_CELL = "·"
BAR_WIDTH = 30


def job_letters(state: ClusterState) -> dict[str, str]:
    """A letter per job holding GPUs, in reservation order ('#' once letters run out)."""
    return {jid: LETTERS[i] if i < len(LETTERS) else "#" for i, jid in enumerate(state.active)}


def queue_colors(state: ClusterState) -> dict[str, str]:
    names = list(dict.fromkeys([*state.queues, *state.usage, *(job_queue(state, j) for j in state.jobs.values())]))
    return {q: PALETTE[i % len(PALETTE)] for i, q in enumerate(names)}


def _header(state: ClusterState, now: float) -> Text:
    total = sum(len(o) for o in state.owners.values())
    used = sum(1 for o in state.owners.values() for g in o if g != FREE)
    running = sum(1 for j in state.active if state.jobs[j].status == "running")
    clock = time.strftime("%H:%M:%S", time.localtime(now))
    sched = f"epoch {state.epoch} {state.scheduler_id}" if state.scheduler_id else "no scheduler elected"
    t = Text.assemble(("corral top", "bold"), f"  #{state.seq}  {sched}  {clock}\n")
    t.append(f"GPUs {used}/{total} used   nodes {len(state.nodes)}   jobs: {running} running, "
             f"{len(state.active) - running} starting/stopping, {len(state.pending)} pending")
    return t


def _grid(state: ClusterState, letters: dict[str, str], colors: dict[str, str]) -> RenderableType:
    grid = Table.grid(padding=(0, 2))
    grid.add_column("node", no_wrap=True)
    grid.add_column("state", no_wrap=True)
    grid.add_column("gpus", no_wrap=True)
    for node in sorted_nodes(state):
        cells = Text()
        marks = state.earmarks.get(node.node_id, ())
        for i, owner in enumerate(state.owners.get(node.node_id, ())):
            if i:
                cells.append(" ")
            if owner == FREE:
                mark = marks[i] if i < len(marks) else FREE
                cells.append("+" if mark else FREE_CELL, style="dim")
                continue
            job = state.jobs.get(owner)
            color = colors.get(job_queue(state, job), "white") if job else "white"
            cells.append(letters.get(owner, "?"), style=f"bold black on {color}")
        st = node_state(node)
        grid.add_row(node.node_id, Text(st, style="" if st == "ready" else "bold red"), cells)
    legend = Text()
    for jid, letter in letters.items():
        job = state.jobs[jid]
        q = job_queue(state, job)
        legend.append(f"{letter}", style=f"bold black on {colors.get(q, 'white')}")
        legend.append(f" {jid} {job_shape(job)} {q} {job.status}\n")
    if not letters:
        legend.append("no job holds GPUs")
    legend.append(f"{FREE_CELL} free   + earmarked for a preemptor", style="dim")
    return Group(grid, Text(), legend)


def queue_bar(used: int, guarantee: int, limit: int | None, scale: int, width: int = BAR_WIDTH) -> Text:
    """`███████|░░░░░░┆` used GPUs (green up to the guarantee, yellow above), `|` guarantee, `┆` limit."""
    scale = max(scale, used, guarantee, limit or 0, 1)

    def pos(n: int) -> int:
        return min(width, round(n * width / scale))

    bar = Text()
    g, u, lim = pos(guarantee), pos(used), (pos(limit) if limit is not None else None)
    for i in range(width):
        if i < u:
            bar.append("█", style="green" if i < g or (guarantee == 0 and limit is None) else "yellow")
        elif i == g and guarantee:
            bar.append("|", style="bold")
        elif lim is not None and i == lim:
            bar.append("┆", style="bold red")
        else:
            bar.append("░", style="dim")
    return bar


def _queues(state: ClusterState, now: float, colors: dict[str, str]) -> RenderableType:
    """One line per queue; a narrow terminal cuts the numbers at the end, never the name or the bar."""
    total = sum(len(o) for o in state.owners.values())
    summaries = queue_summaries(state, now)
    if not summaries:
        return Text("no queues")
    width = max(len(q["queue"]) for q in summaries)
    out = Text(no_wrap=True, overflow="ellipsis")
    for i, q in enumerate(summaries):
        limit = "-" if q["limit_gpus"] is None else q["limit_gpus"]
        if i:
            out.append("\n")
        out.append(q["queue"].ljust(width), style=colors.get(q["queue"], ""))
        out.append("  ")
        out.append_text(queue_bar(q["gpus"], q["guaranteed_gpus"], q["limit_gpus"], total))
        out.append(f"  {q['gpus']} used / {q['guaranteed_gpus']} guaranteed / {limit} limit  w={q['weight']:g}  "
                   f"pending {q['pending']}")
    return out


def _pending(state: ClusterState, limit: int, now: float) -> RenderableType:
    if not state.pending:
        return Text("no pending jobs")
    t = Table(box=None, padding=(0, 1), show_edge=False)
    for h in ("JOB", "QUEUE", "PRIO", "GPUS", "REASON"):
        t.add_column(h, no_wrap=h != "REASON")
    for jid in list(state.pending)[:limit]:
        job = state.jobs[jid]
        w, gate = job.waiting, gate_reason(state, job)
        t.add_row(jid, job_queue(state, job), str(job.spec.priority), job_shape(job),
                  f"gated: {gate}" if gate is not None else readable(waiting_text(state, job), now) if w
                  else "not looked at yet")
    more = len(state.pending) - limit
    return Group(t, Text(f"... and {more} more", style="dim")) if more > 0 else t


def frame(state: ClusterState, recent: Sequence[Envelope], now: float, *, pending_rows: int = 10) -> RenderableType:
    """One screen of `corral top`: header, GPU grid, queue bars, pending jobs, recent events."""
    letters = job_letters(state)
    colors = queue_colors(state)
    events = Text("\n".join(line(env) for env in recent), no_wrap=True, overflow="ellipsis") if recent \
        else Text("no events yet")
    return Group(
        _header(state, now),
        Panel(_grid(state, letters, colors), title="GPUs", title_align="left"),
        Panel(_queues(state, now, colors), title="queues: used | guarantee ┆ limit", title_align="left"),
        Panel(_pending(state, pending_rows, now), title=f"pending ({len(state.pending)})", title_align="left"),
        Panel(events, title="recent events", title_align="left"),
    )


async def _recent(bus: Bus, seq: int, n: int) -> list[Envelope]:
    """The last `n` events up to `seq`."""
    if seq < 1 or n < 1:
        return []
    out: list[Envelope] = []
    async with aclosing(bus.replay(from_seq=max(1, seq - n + 1), to_seq=seq)) as batches:
        async for batch in batches:
            out.extend(batch)
    return out[-n:]


def _now(follower: Follower[ClusterState]) -> float:
    """The stream's time as what the view read proves it (events/streamclock.py), not this machine's clock (#30)."""
    now = follower.clock.now()
    return now if now is not None else time.time()


async def top(args: argparse.Namespace) -> int:
    console = Console()
    async with connected(args) as bus:
        state = await load_state(bus)
        recent: deque[Envelope] = deque(await _recent(bus, state.seq, args.events), maxlen=args.events)
        # Piped or redirected (`corral top | less`, a cron job, CI): one frame, as --once. A live view there
        # would draw nothing anyone sees and never end.
        if args.once or not console.is_terminal:
            console.print(frame(state, recent, await log_now(bus)))
            return OK
        follower = Follower(bus, evolve, state)
        server = await bus.server_time()
        if server is not None:
            follower.clock.saw(server)  # the server's time, read now: a bound as good as a live event's
        follower.on_event(recent.append)
        follow = asyncio.create_task(follower.follow(), name="top-follow")
        try:
            with Live(frame(state, recent, await log_now(bus)), console=console, screen=args.screen,
                      auto_refresh=False, transient=False) as live:
                while not follow.done():
                    live.update(frame(follower.state, recent, _now(follower)), refresh=True)
                    await follower.wait_changed(1.0)
                    follower.changed.clear()
                    await asyncio.sleep(args.interval)
                follow.result()  # the tail ended: surface why
        except asyncio.CancelledError:
            pass  # Ctrl-C: asyncio.run cancelled us; leaving quietly is the normal way out of top
        finally:
            follow.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await follow
    return OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("top", help="live view: GPU grid, queues, pending jobs, recent events",
                       description="A live terminal view folded from the log's tail. Ctrl-C quits. Without a "
                                   "terminal (output piped or redirected) it prints one frame, as --once.")
    add_connection_args(p)
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.add_argument("--events", type=int, default=8, metavar="N", help="recent events shown (default %(default)s)")
    p.add_argument("--interval", type=float, default=0.25, metavar="S",
                   help="least time between redraws (default %(default)s)")
    p.add_argument("--screen", action=argparse.BooleanOptionalAction, default=True,
                   help="use the terminal's alternate screen (default on)")
    p.set_defaults(handler=top)
