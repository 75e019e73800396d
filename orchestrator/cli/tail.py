"""`corral tail`: the log as it happens, one readable line (or JSON object) per event.

Filters run server-side where the subject says enough (DESIGN.md: subjects
name the entity), and a client-side predicate makes the result exact:

- `--job J`: the job's own subjects, `corral.job.J.>`.
- `--node N`: the node's subjects, plus the job events that name the node
  (GangReserved with a rank there, WorkerStarted/WorkerExited on it). Those
  live under their job's subject, so they are fetched by type and filtered here.
- `--queue Q`: QueueDefined of Q, plus every event of the jobs in Q. A job's
  queue is in its JobSubmitted only, not in its subjects, so job events are
  fetched for all jobs and filtered here: jobs that existed at start come
  from the folded state, newer ones from the JobSubmitted events that pass by.
- `--type T,...`: narrows all of the above (AND); entity filters are OR'ed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field

import msgspec

from events.bus import Bus, Envelope, LogGap
from events.follow import Rereads
from events.history import History
from events.subjects import ALL, ROOT, normalize_filters, tag_patterns, type_filters
from orchestrator.cli.archive import ARCHIVE_HINT, require_from, with_archive
from orchestrator.cli.connect import add_connection_args, connected
from orchestrator.cli.errors import FAILURE, OK, USAGE, CliError
from orchestrator.cli.listing import checked_id
from orchestrator.cli.render import line, unreadable
from orchestrator.cli.state_view import load_state
from orchestrator.cli.timespec import parse_instant
from orchestrator.core.model.usage import resolve_queue
from schemas import EVENT_TAGS, GangReserved, JobSubmitted, Unknown, tag_of

#: Job events that name a node: what `--node` shows besides the node's own events.
NODE_JOB_TAGS = ("GangReserved", "WorkerStarted", "WorkerExited")


def _split(values: list[str] | None) -> list[str]:
    """`--type A,B --type C` -> [A, B, C]."""
    return [v.strip() for raw in values or () for v in raw.split(",") if v.strip()]


def parse_types(values: list[str] | None) -> frozenset[str]:
    tags = _split(values)
    for tag in tags:
        if tag not in EVENT_TAGS:
            raise CliError(f"unknown event type {tag!r}; known: {', '.join(sorted(EVENT_TAGS))}", USAGE)
    return frozenset(tags)


def _overlap(a: str, b: str) -> bool:
    """Whether some subject matches both patterns (JetStream refuses overlapping filters)."""
    ta, tb = a.split("."), b.split(".")
    for i in range(max(len(ta), len(tb))):
        x = ta[i] if i < len(ta) else None
        y = tb[i] if i < len(tb) else None
        if x == ">" or y == ">":
            return x is not None and y is not None
        if x is None or y is None:
            return False
        if x != y and "*" not in (x, y):
            return False
    return True


@dataclass
class TailFilter:
    jobs: frozenset[str] = frozenset()
    nodes: frozenset[str] = frozenset()
    queues: frozenset[str] = frozenset()
    types: frozenset[str] = frozenset()
    #: job id -> queues it counts in (spec queue and resolved queue); only needed with `queues`.
    job_queues: dict[str, frozenset[str]] = field(default_factory=dict)
    defined_queues: frozenset[str] = frozenset()
    default_queue: str = "default"

    @property
    def entities(self) -> bool:
        return bool(self.jobs or self.nodes or self.queues)

    def subjects(self) -> list[str]:
        """Server-side filters: a superset of what `wants` keeps, never overlapping."""
        tags = sorted(self.types)
        if not self.entities:
            return type_filters(*tags) if tags else [ALL]

        def under(kind: str, ident: str, only: list[str] | None = None) -> list[str]:
            wanted = tags if only is None else only
            if not wanted:
                return [f"{ROOT}.{kind}.{ident}.>"]
            return [p for t in wanted for p in tag_patterns(f"{ROOT}.{kind}.{ident}", t)]

        entity: list[str] = []
        job: list[str] = []
        for j in sorted(self.jobs):
            job += under("job", j)
        for n in sorted(self.nodes):
            entity += under("node", n)
            job += [p for t in NODE_JOB_TAGS if not tags or t in tags for p in tag_patterns(f"{ROOT}.job.*", t)]
        for q in sorted(self.queues):
            entity += under("queue", q)
            job += [*under("job", "*"), f"{ROOT}.job.*.JobSubmitted"]
        job = normalize_filters(job) if job else []
        if any(_overlap(a, b) for i, a in enumerate(job) for b in job[i + 1:]):
            job = [f"{ROOT}.job.>"]  # the predicate narrows it again
        return normalize_filters(entity + job)

    def learn(self, env: Envelope) -> None:
        """Remember which queue a new job is in (for `--queue`)."""
        ev = env.event
        if self.queues and isinstance(ev, JobSubmitted):
            q = ev.spec.queue
            resolved = q if q in self.defined_queues or self.default_queue not in self.defined_queues \
                else self.default_queue
            self.job_queues[ev.job_id] = frozenset({q, resolved})

    def wants(self, env: Envelope) -> bool:
        ev = env.event
        if self.types and tag_of(ev) not in self.types:
            return False
        if not self.entities:
            return True
        parts = env.subject.split(".")
        kind = parts[1] if len(parts) > 1 else ""
        ident = parts[2] if len(parts) > 3 else ""
        if kind == "node":
            return ident in self.nodes
        if kind == "queue":
            return ident in self.queues
        if kind != "job":
            return False
        if ident in self.jobs:
            return True
        if self.queues and self.job_queues.get(ident, frozenset()) & self.queues:
            return True
        return bool(self.nodes) and not isinstance(ev, Unknown) and bool(_nodes_named(ev) & self.nodes)


def _nodes_named(ev: object) -> set[str]:
    if isinstance(ev, GangReserved):
        return {rp.node_id for rp in ev.ranks}
    node_id = getattr(ev, "node_id", None)
    return {node_id} if isinstance(node_id, str) else set()


_json = msgspec.json.Encoder()


def json_line(env: Envelope) -> str:
    """One event as a JSON object on one line (NDJSON), with its log position and stream time.

    An unreadable message is type "Unknown" (not the tag it claimed: its `event` is not that type's
    fields) with the one-line `unreadable` text; its `event` keeps the raw bytes (base64) and the error.
    """
    ev = env.event
    record = {"seq": env.seq, "subject": env.subject, "time": env.stream_time}
    if isinstance(ev, Unknown):
        record.update(type="Unknown", unreadable=unreadable(env.seq, ev))
    else:
        record["type"] = tag_of(ev)
    record["event"] = msgspec.to_builtins(ev)
    return _json.encode(record).decode()


async def _events(bus: Bus | History, subjects: list[str], *, from_seq: int | None, since: float | None,
                  follow: bool) -> AsyncGenerator[Envelope, None]:
    """The events to print, each once and in log order, or LogGap (exit 1, naming the position).

    Unfiltered, positions are contiguous from the first one read: a gap means
    the read lost events, so it reads again after the last one printed, and
    stops where the log no longer holds the next one (events/follow.py).
    With filters positions are not contiguous and cannot be checked this way;
    the bus's reader hands out each event once, in order, across resets.
    """
    whole = subjects == [ALL]
    rereads = Rereads(bus)
    # From a position, the first event read must be that one too (a purge racing the read): not skipped.
    last: int | None = from_seq - 1 if whole and from_seq is not None else None
    while True:
        try:
            async with aclosing(_read(bus, subjects, from_seq=from_seq if last is None else last + 1,
                                      since=since if last is None else None, follow=follow)) as envs:
                async for env in envs:
                    if last is not None:
                        if env.seq <= last:
                            continue  # a redelivery
                        if whole and env.seq != last + 1:
                            raise LogGap(last + 1, env.seq)
                    last = env.seq
                    yield env
            return
        except LogGap as gap:
            await rereads.check(gap)


async def _read(bus: Bus | History, subjects: list[str], *, from_seq: int | None, since: float | None,
                follow: bool) -> AsyncGenerator[Envelope, None]:
    if follow:
        async with aclosing(bus.tail(subjects=subjects, from_seq=from_seq, since=since)) as live:
            async for env in live:
                yield env
        return
    start = {"since": since} if since is not None else {"from_seq": from_seq or 1}
    async with aclosing(bus.replay(subjects=subjects, **start)) as batches:
        async for batch in batches:
            for env in batch:
                yield env


def build_filter(args: argparse.Namespace) -> TailFilter:
    return TailFilter(
        jobs=frozenset(checked_id(j, "job id") for j in _split(args.job)),
        nodes=frozenset(checked_id(n, "node id") for n in _split(args.node)),
        queues=frozenset(checked_id(q, "queue") for q in _split(args.queue)),
        types=parse_types(args.type),
    )


async def tail(args: argparse.Namespace) -> int:
    flt = build_filter(args)
    if args.since is not None and args.from_seq is not None:
        raise CliError("give --since or --from-seq, not both", USAGE)
    if args.since is not None:
        parse_instant(args.since, time.time())  # a bad --since fails before connecting
    from_seq = args.from_seq
    if from_seq is None and args.since is None:
        if flt.jobs and not flt.nodes and not flt.queues:
            from_seq = 1  # a job's own events: its history first, then what happens (like `kubectl logs -f`)
        elif args.no_follow:
            from_seq = 1  # without a start it follows from now; with --no-follow it prints the log from seq 1
    subjects = flt.subjects()
    out = sys.stdout
    async with connected(args) as stream:
        bus = with_archive(args, stream)
        since = None
        if args.since is not None:  # "10m" ago on the server's clock, the one the stream's times are on (#30)
            server = await stream.server_time()
            since = parse_instant(args.since, server if server is not None else time.time())
        await _history_held(bus, from_seq, since, args.since)
        if flt.queues:
            state = await load_state(bus)
            flt.defined_queues = frozenset(state.queues)
            flt.default_queue = state.config.default_queue
            flt.job_queues = {
                jid: frozenset({j.spec.queue, j.queue or resolve_queue(state, j.spec.queue)})
                for jid, j in state.jobs.items()
            }
        async with aclosing(_events(bus, subjects, from_seq=from_seq, since=since,
                                    follow=not args.no_follow)) as events:
            async for env in events:
                flt.learn(env)
                if flt.wants(env):
                    out.write((json_line(env) if args.json else line(env)) + "\n")
                    out.flush()
    return OK


async def _history_held(bus: Bus | History, from_seq: int | None, since: float | None, since_text: str | None) -> None:
    """Refuse (exit 1) to print the log from a start the stream no longer holds: never a silent partial history.

    From a position: the stream must hold it (`require_from`; `--from-seq N` at the stream's first
    position reads only what it holds). From a time: the stream's head must not have been removed
    after that time, since the removed positions may hold events of the window.
    """
    if from_seq is not None:
        where = "the log" if from_seq == 1 else f"the log from seq {from_seq}"
        await require_from(bus, from_seq, f"tail prints {where}",
                           instead="--from-seq at the stream's first position to print only what it holds")
        return
    if since is None or not isinstance(bus, Bus) or (why := await bus.missing(1)) is None:
        return
    async with aclosing(bus.replay(batch=1)) as batches:
        async for batch in batches:
            if batch and batch[0].stream_time > since:
                raise CliError(f"tail --since {since_text}: {why}, and they may hold events since then; "
                               f"{ARCHIVE_HINT}, or --from-seq {batch[0].seq} to print only what the stream holds",
                               FAILURE)
            return


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a sequence number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"sequences start at 1, got {value}")
    return value


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "tail", help="follow the log, one line per event",
        description="Print events as they are appended (from now, unless --since/--from-seq; with only --job "
                    "filters, the jobs' history first, then what happens, as `kubectl logs -f` does). Entity filters "
                    "(--job, --node, --queue) are OR'ed, --type narrows them. --node also shows the job events "
                    "naming the node (reservations, worker starts/exits); --queue shows the queue's definition "
                    "and every event of its jobs (matched client-side: a job's queue is only in its "
                    "JobSubmitted). Repeat an option or separate values with commas.",
    )
    add_connection_args(p)
    p.add_argument("--job", action="append", metavar="J", help="events of job J (from its first, unless "
                   "--node, --queue, --since or --from-seq say otherwise)")
    p.add_argument("--node", action="append", metavar="N", help="events of node N")
    p.add_argument("--queue", action="append", metavar="Q", help="events of queue Q and its jobs")
    p.add_argument("--type", action="append", metavar="T,...", help="only these event types, e.g. JobWaiting")
    p.add_argument("--since", metavar="WHEN", help="start at a time: 10m (ago), 1h30m, or an ISO timestamp")
    p.add_argument("--from-seq", type=_positive, metavar="N", help="start at log sequence N")
    p.add_argument("--no-follow", action="store_true", help="stop at the end of the log (default start: seq 1)")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(handler=tail)
