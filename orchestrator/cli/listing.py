"""Read commands: `corral jobs`, `job`, `nodes`, `queues` — projections of the log, folded here."""

from __future__ import annotations

import argparse
import time

import msgspec

from events.subjects import InvalidId, check_id
from orchestrator.cli import jobcolumns
from orchestrator.cli.connect import add_connection_args, connected
from orchestrator.cli.datasets_view import (
    DATASETS_HEADERS,
    cache_text,
    datasets_rows,
    datasets_summary,
    evict_targets,
    names_by_key,
    node_datasets,
)
from orchestrator.cli.errors import FAILURE, NOT_FOUND, OK, USAGE, CliError
from orchestrator.cli.indexed import add_index_arg, asked, job_of, wants_index
from orchestrator.cli.output import print_json, print_table
from orchestrator.cli.position import add_at_arg, log_clock, resolve_at
from orchestrator.cli.state_view import LogSource, add_log_arg, load_state, log_now, log_source
from orchestrator.cli.views import (
    NODES_HEADERS,
    QUEUES_HEADERS,
    STATUSES,
    job_detail,
    job_lines,
    job_summary,
    node_summary,
    nodes_rows,
    queue_summaries,
    queues_rows,
    select_jobs,
    sorted_nodes,
)
from orchestrator.cli.whole_log import every_job
from orchestrator.core.model.state import FINISHED_KEPT, HOLDING, TERMINAL, ClusterState, Job
from orchestrator.index import api
from orchestrator.index.client import IndexRefused

#: Shorthands `--state` accepts besides the statuses themselves.
STATE_GROUPS = {"active": HOLDING, "final": TERMINAL}


#: squeue's state codes and names (`-t PD,R`), read as corral's statuses.
SLURM_STATES = {"pd": "pending", "r": "running", "cd": "completed", "f": "failed", "ca": "cancelled",
                "canceled": "cancelled"}


def parse_states(text: str | None) -> frozenset[str]:
    """`running,pending` (any case; squeue's PD, R, CD, F, CA too) -> the statuses; raises CliError (exit 2)
    for a name that is not one."""
    out: set[str] = set()
    for part in filter(None, (p.strip().lower() for p in (text or "").split(","))):
        part = SLURM_STATES.get(part, part)
        if part in STATE_GROUPS:
            out |= STATE_GROUPS[part]
        elif part in STATUSES:
            out.add(part)
        else:
            known = ", ".join([*STATUSES, *STATE_GROUPS])
            raise CliError(f"unknown job state {part!r}; known: {known}", USAGE)
    return frozenset(out)


def checked_id(value: str, what: str) -> str:
    try:
        return check_id(value, what)
    except InvalidId as e:
        raise CliError(str(e), USAGE) from None


def known_queues(state: ClusterState) -> set[str]:
    """Queues defined, charged, or named by some job's spec."""
    return {*state.queues, *state.usage, *(j.spec.queue for j in state.jobs.values())}


async def state_at(args: argparse.Namespace) -> tuple[ClusterState, float]:
    """The state folded up to `--at` (default: the end of the log) and the moment its ages count to."""
    async with log_source(args) as bus:
        at = await resolve_at(bus, args.at)
        return await load_state(bus, to_seq=at.seq), at.time


#: What `corral jobs` lists without --state or --all: jobs not finished (like squeue).
UNFINISHED: frozenset[str] = frozenset(STATUSES) - TERMINAL


async def since_of(args: argparse.Namespace, source: LogSource) -> float | None:
    """`--since WHEN` on the log's clock (None without it)."""
    if getattr(args, "since", None) is None:
        return None
    return (await log_clock(source)).parse(args.since, await log_now(source))


async def jobs(args: argparse.Namespace) -> int:
    statuses = parse_states(args.state)
    # History (finished jobs) gets sacct's columns: when each job ran, how long, how it ended.
    history = args.all or bool(statuses & TERMINAL)
    args.columns = jobcolumns.parse_format(args.format) if args.format is not None else \
        jobcolumns.columns(jobcolumns.HISTORY if history else jobcolumns.DEFAULT)
    if not statuses and not args.all:
        statuses = UNFINISHED
    if args.queue is not None:
        checked_id(args.queue, "queue")
    # Finished jobs, or a window: the index holds every job, the fold the newest FINISHED_KEPT finished ones.
    if wants_index(args) and (args.all or statuses & TERMINAL or args.since is not None):
        listed = await jobs_from_index(args, statuses)
        if listed is not None:
            seq, found = listed
            print_jobs(args, ClusterState(), found, time.time(), seq)
            return OK
    async with log_source(args) as bus:
        since = await since_of(args, bus)
        at = await resolve_at(bus, args.at)
        if args.all or statuses & TERMINAL:
            # History: the fold keeps the newest FINISHED_KEPT finished jobs; the whole log keeps every one.
            state = await every_job(bus, "listing finished jobs needs the whole log", to_seq=at.seq)
        else:
            state = await load_state(bus, to_seq=at.seq)
        now = at.time
    if args.queue is not None and args.queue not in known_queues(state):
        raise CliError(f"unknown queue {args.queue!r}; known: {', '.join(sorted(known_queues(state))) or 'none'}",
                       NOT_FOUND)
    selected = select_jobs(state, queue=args.queue, statuses=statuses, user=args.user_filter)
    if since is not None:
        selected = [j for j in selected if j.submitted_at >= since]
    print_jobs(args, state, selected, now, state.seq)
    return OK


def print_jobs(args: argparse.Namespace, state: ClusterState, selected: list[Job], now: float, seq: int) -> None:
    cols: list[jobcolumns.Column] = args.columns
    if args.json:
        found = [job_summary(state, j) for j in selected]
        if args.format is not None:
            found = [jobcolumns.json_fields(d, j, now, cols) for d, j in zip(found, selected, strict=True)]
        print_json({"seq": seq, "jobs": found})
    else:
        print_table([c.header for c in cols], jobcolumns.rows(state, selected, now, cols), empty="(no jobs)")


async def jobs_from_index(args: argparse.Namespace, statuses: frozenset[str]) -> tuple[int, list[Job]] | None:
    """Every job the index holds that the filters select, page by page; None when no index answers."""
    async with connected(args) as bus:
        request = api.JobsRequest(since=await since_of(args, bus), user=args.user_filter, states=sorted(statuses),
                                  queue=args.queue, limit=api.MAX_LIMIT)
        found: list[Job] = []
        seq = 0
        while True:
            try:
                reply = await asked(bus, api.JOBS, request, api.JobsReply, fresh=request.after == 0)
            except IndexRefused as e:
                raise CliError(f"the index refused the listing: {e}", FAILURE) from None
            if reply is None:
                return None
            seq = seq or reply.as_of_seq  # (the first page's: later pages only add jobs submitted after it)
            found.extend(job_of(info) for info in reply.jobs)
            if reply.next_after is None:
                return seq, found
            request = msgspec.structs.replace(request, after=reply.next_after)


async def job_from_index(args: argparse.Namespace, job_id: str) -> tuple[int, Job] | None:
    """The index's record of a job, and its position; None when no index answers or it has none."""
    async with connected(args) as bus:
        try:
            reply = await asked(bus, api.JOB, api.JobRequest(job_id=job_id), api.JobReply)
        except IndexRefused:
            return None  # not (yet) in the index: the fold may know it
    if reply is None or reply.job is None:
        return None
    return reply.as_of_seq, job_of(reply.job)


async def job(args: argparse.Namespace) -> int:
    job_id = checked_id(args.job, "job id")
    if wants_index(args):
        indexed = await job_from_index(args, job_id)
        # A finished job's record is final: the index's is the fold's. A live one's ranks live in the fold.
        if indexed is not None and indexed[1].status in TERMINAL:
            print_job(args, ClusterState(), indexed[1], time.time(), indexed[0])
            return OK
    async with log_source(args) as bus:
        at = await resolve_at(bus, args.at)
        state, now = await load_state(bus, to_seq=at.seq), at.time
        found = state.jobs.get(job_id)
        if found is None and len(state.finished) >= FINISHED_KEPT:
            # The fold keeps the newest FINISHED_KEPT finished jobs and forgot older ones: the whole log says.
            state = await every_job(bus, f"job {job_id} may have finished before the newest {FINISHED_KEPT:,} "
                                         "finished jobs the fold keeps: finding it needs the whole log",
                                    to_seq=at.seq)
            found = state.jobs.get(job_id)
    if found is None:
        raise CliError(f"unknown job {job_id!r}: the log has no such job (see `corral jobs --all`)", NOT_FOUND)
    print_job(args, state, found, now, state.seq)
    return OK


def print_job(args: argparse.Namespace, state: ClusterState, found: Job, now: float, seq: int) -> None:
    if args.json:
        print_json({"seq": seq, **job_detail(state, found, now)})
    else:
        print("\n".join(job_lines(state, found, now)))


async def nodes(args: argparse.Namespace) -> int:
    state, _ = await state_at(args)
    if args.json:
        found = [node_summary(state, n) for n in sorted_nodes(state)]
        if args.datasets:
            for summary, n in zip(found, sorted_nodes(state), strict=True):
                summary["datasets"] = node_datasets(state, n)
        print_json({"seq": state.seq, "nodes": found})
    elif args.datasets:
        rows = [[*row, cache_text(node_datasets(state, n))] for row, n in zip(nodes_rows(state), sorted_nodes(state),
                                                                            strict=True)]
        print_table((*NODES_HEADERS, "DATASETS"), rows, empty="(no nodes registered)")
    else:
        print_table(NODES_HEADERS, nodes_rows(state), empty="(no nodes registered)")
    return OK


async def datasets(args: argparse.Namespace) -> int:
    state, now = await state_at(args)
    summary = datasets_summary(state)
    if args.json:
        print_json({"seq": state.seq, "datasets": summary})
    else:
        print_table(DATASETS_HEADERS, datasets_rows(summary, now), empty="(no node holds a dataset)")
    return OK


async def datasets_evict(args: argparse.Namespace) -> int:
    """`corral datasets evict NAME|KEY|DIGEST [--node N]`: DatasetEvictRequested to each node holding a copy."""
    from events.sdk import Client

    if args.node is not None:
        checked_id(args.node, "node id")
    async with connected(args) as bus:
        state = await load_state(bus)
        targets = evict_targets(state, args.dataset, args.node)
        client = Client(bus)
        asked = [(node, key, await client.evict_dataset(node, key, reason=args.reason)) for node, key in targets]
    names = names_by_key(state)
    if args.json:
        print_json({"requests": [{"node_id": n, "key": k, "names": names.get(k, []), "seq": seq}
                                 for n, k, seq in asked]})
        return OK
    for node, key, seq in asked:
        named = f" ({', '.join(names[key])})" if names.get(key) else ""
        print(f"{node}: evict {key}{named} asked (#{seq}); its agent drops it once no job there uses it")
    return OK


async def queues(args: argparse.Namespace) -> int:
    state, now = await state_at(args)
    summaries = queue_summaries(state, now)
    if args.json:
        print_json({"seq": state.seq, "queues": summaries})
    else:
        print_table(QUEUES_HEADERS, queues_rows(summaries), empty="(no queues)")
    return OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    def common(p: argparse.ArgumentParser) -> None:
        add_connection_args(p)
        add_log_arg(p)
        add_at_arg(p, "the listing")
        p.add_argument("--json", action="store_true", help="machine-readable output (includes the log position)")

    p = sub.add_parser("jobs", help="list jobs not finished (--all: finished ones too)",
                       description="Jobs in submit order, folded from the log: those not finished yet (pending, "
                                   "reserved, running, preempting) unless --all or --state says otherwise. With --all, "
                                   "a final --state or --since the index service (`corral index`) lists every job "
                                   "the log holds; without a caught-up index the whole log is folded (from the "
                                   "archive too with --archive), or the command exits non-zero naming what is "
                                   "missing.")
    common(p)
    p.add_argument("--all", "-a", action="store_true", help="finished jobs too (completed, failed, cancelled, "
                   "rejected), with sacct's columns: submit, start, end, elapsed, exit code; with --state, every "
                   "job in those states")
    p.add_argument("--queue", "-q", "-p", "--partition", dest="queue", metavar="Q",
                   help="only jobs of queue Q (named in the spec or charged; Slurm's partition)")
    p.add_argument("--state", "-s", "-t", metavar="S[,S]", help=f"only jobs in these states: {', '.join(STATUSES)}, "
                   "or active (holding GPUs), final")
    # `--user` is the NATS user of the connection options: the submitter filter is `--by-user`/`-u`.
    p.add_argument("--by-user", "-u", dest="user_filter", metavar="U", help="only jobs submitted by U (the NATS "
                   "user or $USER of whoever submitted; `corral job` shows it)")
    p.add_argument("--since", metavar="WHEN", help="only jobs submitted at or after WHEN: a duration before the "
                   "log's end (30d, 12h), one after its first event (+3d), an ISO time")
    p.add_argument("--format", "-o", metavar="COL[,COL]", help="the columns to print, like sacct's --format "
                   f"(with --json: the fields): {', '.join(c.name for c in jobcolumns.COLUMNS)}")
    add_index_arg(p)
    p.set_defaults(handler=jobs)

    p = sub.add_parser("job", help="one job in detail", description="A job's status, placement, attempt, pending "
                       "reason, checkpoint and per-rank states. Its history: `corral explain JOB`.")
    common(p)
    p.add_argument("job", help="job id")
    add_index_arg(p)
    p.set_defaults(handler=job)

    p = sub.add_parser("nodes", help="list nodes", description="Nodes with GPUs used/free, labels, and whether "
                       "they are cordoned or failed.")
    common(p)
    p.add_argument("--datasets", action="store_true", help="also what each node's dataset cache holds (count, "
                   "size, names; with --json each entry's key, size and last use)")
    p.set_defaults(handler=nodes)

    p = sub.add_parser("datasets", help="which node caches which dataset",
                       description="Every dataset a node's cache holds, folded from the log (the agents' "
                                   "NodeDatasets, DatasetReady and DatasetEvicted): its names in job specs, cache "
                                   "key, size, the nodes holding it, and when a job last used it. "
                                   "`corral datasets evict` drops one from the nodes' caches.")
    common(p)
    p.set_defaults(handler=datasets)
    dsub = p.add_subparsers(dest="datasets_command", metavar="ACTION")
    e = dsub.add_parser("evict", help="drop a dataset from the nodes' caches (the next job stages it again)",
                        description="Ask each node whose cache holds the dataset (or only --node N) to drop it "
                                    "(DatasetEvictRequested); its agent deletes it once no job placed there uses "
                                    "it and tells DatasetEvicted. The next job naming it stages it afresh.")
    add_connection_args(e)
    e.add_argument("dataset", metavar="NAME|KEY|DIGEST", help="a dataset's name in job specs (every cached "
                   "version of it), a cache key (src-..., sha256-...) or a digest (sha256:<hex>)")
    e.add_argument("--node", metavar="N", help="only on this node")
    e.add_argument("--reason", default="", help="why (kept in the log)")
    e.add_argument("--json", action="store_true", help="machine-readable output (each request's log position)")
    e.set_defaults(handler=datasets_evict)

    p = sub.add_parser("queues", help="list queues", description="Queues: GPUs used vs guarantee vs limit, "
                       "weight, pending and active jobs.")
    common(p)
    p.set_defaults(handler=queues)
