"""`corral run [options] -- COMMAND [ARGS...]`: a job from flags, attached, like `srun` or `ray job submit --`.

It submits the job (from this directory, with the variables `--export` names:
orchestrator/cli/submitter.py), then prints every rank's output as it is
written, each line labelled `R: ` when it has more than one rank (orchestrator/cli/attach.py), and exits with
the job's exit status: 0 when it completed, the failing rank's exit code (128 +
signal) when it failed, 1 when it failed with none or was rejected or
cancelled. Ctrl-C cancels the job and waits for it to end (its ranks get their
checkpoint signal and grace period); a second Ctrl-C stops waiting (exit 130).
`--detach` prints the job id and returns at once. Job and progress lines go to
stderr, so stdout holds the job's output only. Its stdin goes to rank 0 (EOF
included), and `--pty` gives rank 0 a terminal: orchestrator/cli/interactive.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys

from msgspec.structs import replace

from orchestrator.cli.attach import JobStream, exit_status, follow_job
from orchestrator.cli.connect import add_connection_args, connected
from orchestrator.cli.errors import INTERRUPTED, OK, USAGE, CliError
from orchestrator.cli.interactive import (
    Forwarder,
    interactive_key,
    raw_terminal,
    read_in_thread,
    stdin_binary,
    terminal_size,
)
from orchestrator.cli.jobflags import add_job_args, checked, with_job_flags
from orchestrator.cli.jobs import (
    _client,
    _refusals,
    _via_admission,
    check_fits,
    check_queue,
    checked_dependencies,
    gated,
)
from orchestrator.cli.logs import FOLLOW_POLL_S
from orchestrator.cli.render import line
from orchestrator.cli.spec_extras import add_spec_extras, check_reservation, with_spec_extras
from orchestrator.cli.submitter import add_submitter_args, with_submitter
from schemas import JobCancelled, JobSpec


def spec_from_flags(args: argparse.Namespace) -> JobSpec:
    """The job the flags describe (validated: exit 2 with every problem)."""
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise CliError("no command: `corral run [options] -- COMMAND [ARGS...]`", USAGE)
    raw = with_job_flags({"name": os.path.basename(command[0]) or "run", "command": command}, args)
    return checked(raw, "the job")


def _say(text: str) -> None:
    print(f"corral: {text}", file=sys.stderr, flush=True)


#: How often a `--pty` job's output is asked for: a terminal's echo should feel immediate.
PTY_POLL_S = 0.05


def _terminal() -> int | None:
    """The fd of this process's stdin when it is a terminal."""
    with contextlib.suppress(AttributeError, OSError, ValueError):
        fd = sys.stdin.fileno()
        if os.isatty(fd):
            return fd
    return None


async def run(args: argparse.Namespace) -> int:
    if args.pty and (args.detach or args.no_stdin):
        raise CliError("--pty gives rank 0 your terminal: not with --detach or --no-stdin", USAGE)
    told: list[str] = []  # what the export left out, said once the job is in
    spec = with_spec_extras(with_submitter(spec_from_flags(args), args, notice=told.append), args)
    ok_ids, any_ids = checked_dependencies(args)  # (bad ids refused before connecting)
    key = ""
    if not args.detach and not args.no_stdin:  # rank 0 reads our stdin (`srun`s default)
        key, it = interactive_key(args.pty)
        spec = replace(spec, interactive=it)
    async with connected(args) as bus:
        await check_queue(bus, spec)
        await check_reservation(bus, spec, _client(bus, args).user)
        await check_fits(bus, spec)
        spec = await gated(bus, spec, ok_ids, any_ids, hold=args.hold)
        client = _client(bus, args)
        with _refusals():
            job_id = await client.submit(spec, job_id=args.id)
        for text in told:
            _say(text)
        if args.detach:
            print(job_id)
            return OK
        _say(f"{job_id} submitted ({spec.ranks} x {spec.gpus_per_rank} GPU, queue {spec.queue}); Ctrl-C cancels it")
        stop = asyncio.Event()
        cancels: list[asyncio.Task[int]] = []

        def interrupted() -> None:
            if cancels:
                _say(f"stopped waiting; {job_id} goes on ending (corral job {job_id})")
                stop.set()
                return
            _say(f"cancelling {job_id} (Ctrl-C again stops waiting for it)")
            cancels.append(asyncio.ensure_future(client.cancel(job_id, reason="Ctrl-C in corral run")))

        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGINT, interrupted)
        # Lines labelled `R: ` when more than one rank writes (or --label), as `srun --label`; one rank's are its own.
        label = not args.pty and (args.label or spec.ranks > 1)
        stream = JobStream(bus, label=label, only=0 if args.pty else None, raw=args.pty)
        terminal = _terminal() if args.pty else None
        forwarder = Forwarder(bus, job_id, key, stream,
                              size=(lambda: terminal_size(terminal)) if terminal is not None else None)
        forwarding: asyncio.Task[None] | None = None
        try:
            with raw_terminal(terminal, forwarder, loop) if terminal is not None else contextlib.nullcontext():
                if key:
                    if terminal is None:
                        source = stdin_binary()
                        if source is None:
                            forwarder.queue.put_nowait(b"")  # no stdin at all: rank 0 reads its end at once
                        else:
                            read_in_thread(source, forwarder, loop)
                    forwarding = asyncio.ensure_future(forwarder.run())
                seen = await follow_job(bus, job_id, stream, stop=stop,
                                        poll_s=PTY_POLL_S if args.pty else FOLLOW_POLL_S)
        finally:
            loop.remove_signal_handler(signal.SIGINT)
            if forwarding is not None:
                forwarding.cancel()
                await asyncio.gather(forwarding, return_exceptions=True)
            await asyncio.gather(*cancels, return_exceptions=True)
        if forwarder.problem:
            _say(f"rank 0 got no more input: {forwarder.problem}")
    if stop.is_set() or seen.final is None:
        return INTERRUPTED
    _say(line(seen.final))
    if cancels and isinstance(seen.final.event, JobCancelled):
        return INTERRUPTED
    return exit_status(seen)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("run", help="submit a job from flags and stay attached: every rank's output, its exit status",
                       description="Submit COMMAND as a job of RANKS x GPUS (from this directory), print every "
                                   "rank's output as it is written (each line labelled 'R: ' when it has more than one "
                                   "rank), and exit with the "
                                   "job's exit status (0 completed, the failing rank's code, 1 otherwise). Ctrl-C "
                                   "cancels the job; --detach prints its id and returns.",
                       usage="corral run [options] -- COMMAND [ARGS...]")
    add_connection_args(p)
    add_job_args(p, run=True)
    add_submitter_args(p)
    add_spec_extras(p)
    p.add_argument("--id", help="job id (default generated)")
    p.add_argument("--detach", "-d", action="store_true", help="print the job id and return at once")
    p.add_argument("-l", "--label", action="store_true",
                   help="label every line with its rank, 'R: ', a one-rank job's too (`srun --label`; the default "
                        "for more than one rank)")
    p.add_argument("--pty", action="store_true",
                   help="run rank 0 on a pseudo-terminal with this terminal raw (like `srun --pty`): "
                        "`corral run --pty -- bash`; only rank 0's output is shown")
    p.add_argument("--no-stdin", action="store_true",
                   help="rank 0 reads /dev/null, not this command's stdin (`srun --input none`)")
    _via_admission(p)
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command every rank runs, after --")
    p.set_defaults(handler=run)
