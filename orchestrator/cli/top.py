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
import os
import string
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import aclosing

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.segment import Segment, Segments
from rich.table import Table
from rich.text import Text

from events.bus import Bus, Envelope
from events.follow import Follower
from orchestrator.cli.connect import add_connection_args, connected
from orchestrator.cli.errors import OK
from orchestrator.cli.render import line
from orchestrator.cli.state_view import load_state, log_now
from orchestrator.cli.timespec import seconds_arg
from orchestrator.cli.top_scroll import Scroll, keys, visible
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


#: Pending jobs the live view lists (scrolling reaches each); `corral jobs --state pending` lists them all.
LIVE_PENDING_ROWS = 1000


def _lines(console: Console, renderable: RenderableType) -> list[list[Segment]]:
    """The frame as the terminal's width lays it out, however tall."""
    return console.render_lines(renderable, console.options.update(height=None), pad=False)


def scrolled(console: Console, renderable: RenderableType, scroll: Scroll) -> RenderableType:
    """The lines of `renderable` the window shows (orchestrator/cli/top_scroll.py), and the status line."""
    lines = _lines(console, renderable)
    height = console.size.height
    if scroll.at_end:
        scroll.offset = len(lines)
    scroll.clamp(len(lines), height)
    window: list[Segment] = []
    for line_ in lines[scroll.offset:scroll.offset + visible(height)]:
        window.extend(line_)
        window.append(Segment.line())
    status = Text(scroll.status(len(lines), height), style="reverse", no_wrap=True, overflow="ellipsis")
    return Group(Segments(window), status)


def scroll_size(console: Console, state: ClusterState, recent: Sequence[Envelope], now: float,
                scroll: Scroll) -> tuple[int, int]:
    """(lines of the live frame as drawn now, terminal height): what a key scrolls over."""
    height = console.size.height
    return len(_lines(console, frame(state, recent, now, pending_rows=scroll.rows(height, LIVE_PENDING_ROWS)))), \
        height


@contextlib.contextmanager
def _keyboard(on_keys: Callable[[bytes], None]) -> Iterator[None]:
    """Keys as they are pressed (cbreak: no Enter needed, Ctrl-C still interrupts), when stdin is a terminal."""
    fd = sys.stdin.fileno() if sys.stdin is not None else -1
    if fd < 0 or not os.isatty(fd):
        yield
        return
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    loop = asyncio.get_running_loop()
    tty.setcbreak(fd)

    def ready() -> None:
        try:
            data = os.read(fd, 1024)
        except OSError:
            data = b""
        if not data:  # the terminal went away: no more keys (Ctrl-C and SIGTERM still stop top)
            loop.remove_reader(fd)
            return
        on_keys(data)

    loop.add_reader(fd, ready)
    try:
        yield
    finally:
        loop.remove_reader(fd)
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


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
        scroll, pressed = Scroll(), asyncio.Event()

        def view() -> RenderableType:
            rows = scroll.rows(console.size.height, LIVE_PENDING_ROWS)
            return scrolled(console, frame(follower.state, recent, _now(follower), pending_rows=rows), scroll)

        def on_keys(data: bytes) -> None:
            total, height = scroll_size(console, follower.state, recent, _now(follower), scroll)
            for key in keys(data):
                scroll.press(key, total, height)
            pressed.set()
            follower.changed.set()  # redraw now

        try:
            with _keyboard(on_keys), Live(view(), console=console, screen=args.screen, auto_refresh=False,
                                          transient=False) as live:
                while not follow.done() and not scroll.quit:
                    live.update(view(), refresh=True)
                    await follower.wait_changed(1.0)
                    follower.changed.clear()
                    if pressed.is_set():
                        pressed.clear()
                        continue
                    with contextlib.suppress(TimeoutError):  # redraws at most every --interval, keys at once
                        async with asyncio.timeout(args.interval):
                            await pressed.wait()
                if not scroll.quit:
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
                       description="A live terminal view folded from the log's tail. q (or Ctrl-C) quits; Up/Down "
                                   "or j/k scroll a line, PgUp/PgDn (b/space) a page, g/G to the top/end, so "
                                   "every pending job is reachable on a small terminal. Without a terminal "
                                   "(output piped or redirected) it prints one frame, as --once.")
    add_connection_args(p)
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.add_argument("--events", type=int, default=8, metavar="N", help="recent events shown (default %(default)s)")
    p.add_argument("--interval", type=seconds_arg, default=0.25, metavar="S",
                   help="least time between redraws (default %(default)s)")
    p.add_argument("--screen", action=argparse.BooleanOptionalAction, default=True,
                   help="use the terminal's alternate screen (default on)")
    p.set_defaults(handler=top)
