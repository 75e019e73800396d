"""`corral notifier`: the end-of-job notifier as its own service (`corral up` runs one too; orchestrator/notifier.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from orchestrator.cli.errors import USAGE, CliError
from orchestrator.cli.timespec import seconds_arg


def add_notifier_args(p: argparse.ArgumentParser) -> None:
    """The notifier's delivery options (`corral notifier`, and `corral up`)."""
    p.add_argument("--notify-cmd", metavar="CMD",
                   help="run CMD (no shell) for every ended job, the note as JSON on its stdin and CORRAL_JOB_ID, "
                        "CORRAL_JOB_STATE, CORRAL_JOB_EXIT_CODE, CORRAL_NOTIFY_DEDUPE_KEY set")
    p.add_argument("--notify-timeout", type=seconds_arg, default=5.0, metavar="S",
                   help="seconds one delivery try may take (default %(default)s)")
    p.add_argument("--notify-tries", type=int, default=3, metavar="N",
                   help="tries per note, 1 s then 2 s, 4 s ... apart (default %(default)s)")


def notifier_config(args: argparse.Namespace, state_path: Path) -> object:
    from orchestrator.notifier import NotifierConfig

    if args.notify_timeout <= 0 or args.notify_tries < 1:
        raise CliError("--notify-timeout must be > 0 and --notify-tries >= 1", USAGE)
    return NotifierConfig(state_path=state_path, cmd=args.notify_cmd or None, timeout_s=args.notify_timeout,
                          tries=args.notify_tries)


async def run_notifier(args: argparse.Namespace) -> int:
    from orchestrator.cli.connect import connected
    from orchestrator.cli.services import until_signalled
    from orchestrator.logging import configure_logging
    from orchestrator.notifier import Notifier, NotifierConfig

    configure_logging(args.log_level)
    config = notifier_config(args, Path(args.state))
    assert isinstance(config, NotifierConfig)
    async with connected(args, name="corral-notifier", forever=True, wait_for_creator=True) as bus:
        return await until_signalled(Notifier(bus, config).run())


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from orchestrator.cli.connect import add_connection_args, add_log_level_arg

    p = sub.add_parser(
        "notifier", help="run the end-of-job notifier: webhooks (--notify-url) and a command",
        description="Follow the jobs' ends (JobCompleted, JobFailed, JobCancelled, JobRejected) and send each job "
                    "submitted with --notify-url a JSON note by POST (job id, name, user, state, exit code, times, "
                    "dedupe_key); with --notify-cmd run a command for every ended job. Its position is kept in "
                    "--state, so a restart neither loses nor repeats notes (at least once: receivers dedupe by "
                    "dedupe_key). `corral up` runs one.")
    add_connection_args(p, service=True)
    add_log_level_arg(p)
    p.add_argument("--state", required=True, metavar="FILE",
                   help="where the notifier keeps its position in the log (a small JSON file)")
    add_notifier_args(p)
    p.set_defaults(handler=run_notifier)
