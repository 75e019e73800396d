"""`corral run [options] -- COMMAND [ARGS...]`: a job from flags, attached, like `srun` or `ray job submit --`.

It submits the job (from this directory, with the variables `--export` names:
orchestrator/cli/submitter.py), then prints every rank's output as it is
written, each line labelled `R: ` (orchestrator/cli/attach.py), and exits with
the job's exit status: 0 when it completed, the failing rank's exit code (128 +
signal) when it failed, 1 when it failed with none or was rejected or
cancelled. Ctrl-C cancels the job and waits for it to end (its ranks get their
checkpoint signal and grace period); a second Ctrl-C stops waiting (exit 130).
`--detach` prints the job id and returns at once. Job and progress lines go to
stderr, so stdout holds the job's output only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from typing import Any

from orchestrator.cli.attach import JobStream, exit_status, follow_job
from orchestrator.cli.connect import add_connection_args, connected
from orchestrator.cli.errors import INTERRUPTED, OK, USAGE, CliError
from orchestrator.cli.jobs import _client, _refusals, _via_admission, check_queue
from orchestrator.cli.render import line
from orchestrator.cli.spec_extras import add_spec_extras, check_reservation, with_spec_extras
from orchestrator.cli.submitter import add_submitter_args, with_submitter
from schemas import InvalidJobSpec, JobCancelled, JobSpec, parse_jobspec


def spec_from_flags(args: argparse.Namespace) -> JobSpec:
    """The job the flags describe (validated: exit 2 with every problem)."""
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise CliError("no command: `corral run [options] -- COMMAND [ARGS...]`", USAGE)
    raw: dict[str, Any] = {
        "name": args.name or os.path.basename(command[0]) or "run",
        "ranks": args.ranks,
        "gpus_per_rank": args.gpus_per_rank,
        "priority": args.priority,
        "command": command,
        "restart_policy": args.restart_policy,
        "max_restarts": args.max_restarts,
    }
    for key, value in (("queue", args.queue), ("gpu_model", args.gpu_model), ("time_limit_s", args.time_limit),
                       ("image", args.image), ("checkpoint_dir", args.checkpoint_dir)):
        if value is not None:
            raw[key] = value
    try:
        return parse_jobspec(raw)
    except InvalidJobSpec as e:
        lines = "\n".join(f"  {p.path}: {p.message}" for p in e.problems)
        raise CliError(f"the job has {len(e.problems)} problem(s):\n{lines}", USAGE) from None


def _say(text: str) -> None:
    print(f"corral: {text}", file=sys.stderr, flush=True)


async def run(args: argparse.Namespace) -> int:
    spec = with_spec_extras(with_submitter(spec_from_flags(args), args), args)
    async with connected(args) as bus:
        await check_queue(bus, spec)
        await check_reservation(bus, spec, _client(bus, args).user)
        client = _client(bus, args)
        with _refusals():
            job_id = await client.submit(spec, job_id=args.id)
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
        try:
            seen = await follow_job(bus, job_id, JobStream(bus), stop=stop)
        finally:
            loop.remove_signal_handler(signal.SIGINT)
            await asyncio.gather(*cancels, return_exceptions=True)
    if stop.is_set() or seen.final is None:
        return INTERRUPTED
    _say(line(seen.final))
    if cancels and isinstance(seen.final.event, JobCancelled):
        return INTERRUPTED
    return exit_status(seen)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("run", help="submit a job from flags and stay attached: every rank's output, its exit status",
                       description="Submit COMMAND as a job of RANKS x GPUS (from this directory), print every "
                                   "rank's output as it is written, each line labelled 'R: ', and exit with the "
                                   "job's exit status (0 completed, the failing rank's code, 1 otherwise). Ctrl-C "
                                   "cancels the job; --detach prints its id and returns.",
                       usage="corral run [options] -- COMMAND [ARGS...]")
    add_connection_args(p)
    p.add_argument("-n", "--ranks", type=int, default=1, metavar="N", help="ranks in the gang (default 1)")
    p.add_argument("-g", "--gpus-per-rank", type=int, default=1, metavar="G", help="GPUs of each rank (default 1)")
    p.add_argument("-q", "--queue", help="queue charged (default: the cluster's default)")
    p.add_argument("--name", help="job name (default: the command's name)")
    p.add_argument("-p", "--priority", type=int, default=0, help="priority within the queue (default 0)")
    p.add_argument("--gpu-model", metavar="MODEL", help="only GPUs whose model contains this, e.g. H100")
    p.add_argument("-t", "--time-limit", type=float, metavar="S", help="stop it after S seconds running")
    p.add_argument("--restart-policy", choices=("never", "rank", "gang"), default="never",
                   help="on a crash (default never: the job fails with the rank's exit status)")
    p.add_argument("--max-restarts", type=int, default=0, metavar="N", help="restarts before it fails (default 0)")
    p.add_argument("--image", help="container image (docker runtime agents)")
    p.add_argument("--checkpoint-dir", metavar="DIR", help="where ranks checkpoint (CORRAL_CHECKPOINT_DIR)")
    add_submitter_args(p)
    add_spec_extras(p)
    p.add_argument("--id", help="job id (default generated)")
    p.add_argument("--detach", "-d", action="store_true", help="print the job id and return at once")
    _via_admission(p)
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command every rank runs, after --")
    p.set_defaults(handler=run)
