"""`corral logs JOB [--rank R | --all-ranks] [--attempt A] [-f]`: a worker's output, like `kubectl logs -f`.

The output stays on the worker's node; the CLI needs only NATS. It finds the
node from the log (the attempt's GangReserved places each rank), then asks
that node's agent on `corral-logs.<node>` (nodeagent/logs.py) for the bytes
from an offset, one chunk at a time, until it has them all. With `-f` it
keeps asking for what was appended while the worker runs, and stops when the
worker has ended and everything it wrote was printed; on a job not placed
yet it waits for its placement first. `--all-ranks` prints every rank's lines
labelled `R: ` (orchestrator/cli/attach.py).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from contextlib import aclosing

import nats.errors

from events.bus import Bus
from events.subjects import job_filter, log_subject
from orchestrator.cli.connect import add_connection_args, connected
from orchestrator.cli.errors import NOT_FOUND, OK, TIMEOUT, UNREACHABLE, USAGE, CliError
from orchestrator.cli.listing import checked_id
from orchestrator.cli.output import print_json
from schemas import GangReserved, GangRestarted, JobSubmitted
from schemas.events import RankPlacement
from schemas.logs import LOG_CHUNK, LogChunk, LogRequest, decode_log_chunk, encode_log

#: How often `-f` asks for new output, and how long one request may take.
FOLLOW_POLL_S = 0.5
REQUEST_TIMEOUT_S = 5.0


async def job_placements(bus: Bus, job_id: str) -> tuple[bool, dict[int, tuple[RankPlacement, ...]]]:
    """(whether the job was submitted, attempt -> where its ranks were placed), from the job's own events."""
    submitted = False
    out: dict[int, tuple[RankPlacement, ...]] = {}
    async with aclosing(bus.replay(subjects=[job_filter(job_id)])) as batches:
        async for batch in batches:
            for env in batch:
                if isinstance(env.event, JobSubmitted):
                    submitted = True
                elif isinstance(env.event, GangReserved):
                    out[env.event.attempt] = env.event.ranks  # (a void one is followed by the valid one)
                elif isinstance(env.event, GangRestarted) and out:  # a new attempt on the same GPUs
                    out[env.event.attempt] = out[max(out)]
    return submitted, out


async def ask(bus: Bus, node: str, req: LogRequest) -> LogChunk:
    try:
        msg = await bus.nc.request(log_subject(node), encode_log(req), timeout=REQUEST_TIMEOUT_S)
    except nats.errors.NoRespondersError:
        raise CliError(f"no agent answers for node {node} (is its `corral agent` running and connected?)",
                       UNREACHABLE) from None
    except nats.errors.TimeoutError:
        raise CliError(f"the agent of node {node} did not answer in {REQUEST_TIMEOUT_S:g}s", TIMEOUT) from None
    return decode_log_chunk(msg.data)


async def logs(args: argparse.Namespace) -> int:
    job_id = checked_id(args.job, "job id")
    if args.rank < 0 or (args.attempt is not None and args.attempt < 1):
        raise CliError("--rank is 0 or more and --attempt 1 or more", USAGE)
    async with connected(args) as bus:
        submitted, placed = await job_placements(bus, job_id)
        if not submitted:
            raise CliError(f"unknown job {job_id!r} (see `corral jobs --all`)", NOT_FOUND)
        attempt = args.attempt if args.attempt is not None else max(placed, default=0)
        ranks = placed.get(attempt)
        if ranks is None and args.follow:  # like `kubectl logs -f` on a pod still pending: wait for it
            attempt, ranks = await _wait_placed(bus, job_id, args.attempt)
            if not args.all_ranks and not args.json:  # its rank from its first line, as `corral run` reads
                from orchestrator.cli.attach import JobStream, follow_job

                if all(rp.rank != args.rank for rp in ranks):
                    raise CliError(f"{job_id} has ranks 0-{len(ranks) - 1}, not {args.rank}", USAGE)
                await follow_job(bus, job_id, JobStream(bus, label=False, only=args.rank), attempt=attempt)
                return OK
        if ranks is None:
            which = f"attempt {attempt} of {job_id}" if args.attempt is not None else job_id
            raise CliError(f"{which} has not been placed on any node yet: no output (see `corral job {job_id}`)",
                           NOT_FOUND)
        if args.all_ranks:
            return await _all_ranks(bus, job_id, attempt, ranks, args)
        node = next((rp.node_id for rp in ranks if rp.rank == args.rank), None)
        if node is None:
            raise CliError(f"{job_id} has ranks 0-{len(ranks) - 1}, not {args.rank}", USAGE)
        req = LogRequest(job_id=job_id, attempt=attempt, rank=args.rank, restarts=args.restart,
                         offset=0, limit=LOG_CHUNK)
        chunk = await _print_all(bus, node, req, args)
        while args.follow and chunk.running:
            await asyncio.sleep(FOLLOW_POLL_S)
            req = LogRequest(job_id=job_id, attempt=attempt, rank=args.rank, restarts=chunk.restarts,
                             offset=chunk.next, limit=LOG_CHUNK)
            chunk = await _print_all(bus, node, req, args)
    return OK


async def _wait_placed(bus: Bus, job_id: str, attempt: int | None) -> tuple[int, tuple[RankPlacement, ...]]:
    """The first placement of the job (of `attempt`, if given) from its events; an error if it ends unplaced."""
    from events.sdk import FINAL, Client
    from schemas import tag_of

    print(f"corral: {job_id} is not placed yet; waiting for it to start (Ctrl-C stops)", file=sys.stderr, flush=True)
    placed: tuple[RankPlacement, ...] = ()
    async with aclosing(Client(bus).watch(job_id)) as events:
        async for env in events:
            ev = env.event
            if isinstance(ev, GangReserved):
                placed = ev.ranks
            if isinstance(ev, (GangReserved, GangRestarted)) and placed and (attempt is None or ev.attempt == attempt):
                return ev.attempt, placed
            if tag_of(ev) in FINAL:
                raise CliError(f"{job_id} ended ({tag_of(ev)}) before it was placed: no output", NOT_FOUND)
    raise CliError(f"{job_id}: its events ended", NOT_FOUND)  # pragma: no cover - watch never ends


async def _all_ranks(bus: Bus, job_id: str, attempt: int, ranks: tuple[RankPlacement, ...],
                     args: argparse.Namespace) -> int:
    """Every rank of the attempt, each line labelled 'R: ' (like `srun --label`); -f: until the attempt is over."""
    from orchestrator.cli.attach import JobStream, follow_job

    stream = JobStream(bus)
    if args.follow:
        await follow_job(bus, job_id, stream, attempt=attempt)
        return OK
    stream.place(job_id, attempt, ranks)
    for ro in sorted(stream.ranks.values(), key=lambda r: r.rank):  # rank by rank: what each wrote so far
        await stream.read(ro, final=True)
    await stream.drain()
    return OK


async def _print_all(bus: Bus, node: str, req: LogRequest, args: argparse.Namespace) -> LogChunk:
    """Ask for chunks from `req.offset` until the end the agent knows now; print each; the last answer."""
    while True:
        chunk = await ask(bus, node, req)
        if chunk.error:
            if args.follow and "not started yet" in chunk.error:  # -f on a gang still starting: wait for it
                await asyncio.sleep(FOLLOW_POLL_S)
                continue
            raise CliError(chunk.error, NOT_FOUND)
        if chunk.offset > req.offset:  # the agent's log limit rotated the head away (nodeagent/logs.py)
            print(f"corral logs: bytes {req.offset}-{chunk.offset - 1} of {req.job_id} rank {req.rank} were "
                  "dropped by the node's log size limit; printing what is kept", file=sys.stderr, flush=True)
        if args.json:
            print_json({"node_id": node, "path": chunk.path, "attempt": req.attempt, "rank": req.rank,
                        "restarts": chunk.restarts, "offset": chunk.offset, "size": chunk.size,
                        "running": chunk.running, "text": chunk.data.decode(errors="replace")})
        elif chunk.data:
            sys.stdout.buffer.write(chunk.data)
            sys.stdout.flush()
        if chunk.next >= chunk.size or not chunk.data:
            return chunk
        req = LogRequest(job_id=req.job_id, attempt=req.attempt, rank=req.rank, restarts=chunk.restarts,
                         offset=chunk.next, limit=req.limit)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("logs", help="a worker's output (stdout and stderr), like kubectl logs [-f]",
                       description="Print what a rank of a job wrote, read from its node's agent over NATS (the "
                                   "CLI needs no access to the node). Default: rank 0 of the newest attempt, its "
                                   "newest restart. -f keeps printing what the worker writes until it ends.")
    add_connection_args(p)
    p.add_argument("job", help="job id")
    p.add_argument("--rank", "-r", type=int, default=0, metavar="R", help="which rank (default 0)")
    p.add_argument("--attempt", "-a", type=int, default=None, metavar="A", help="which attempt (default: the "
                   "newest placed; `corral explain JOB` lists them)")
    p.add_argument("--restart", type=int, default=-1, metavar="N", help="which restart of the rank within the "
                   "attempt (rank restart policy; default: the newest)")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new output until the worker ends "
                   "(a job not started yet: wait for it)")
    p.add_argument("--all-ranks", action="store_true", help="every rank's output, each line labelled 'R: ' (like "
                   "srun --label); with -f, as it is written until the attempt is over")
    p.add_argument("--json", action="store_true", help="one JSON object per chunk read (text, offset, size, "
                   "node, path)")
    p.set_defaults(handler=logs)
