"""The `corral` command line: one entry point, subcommands in small modules."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any, NoReturn

from orchestrator.cli import errors
from orchestrator.cli.errors import CliError

Handler = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]


class Parser(argparse.ArgumentParser):
    """argparse with usage errors on one line (and exit 2), like every other corral error."""

    def error(self, message: str) -> NoReturn:
        self.exit(errors.USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _Version(argparse.Action):
    """`corral --version`: the installed package's version, looked up only when asked (not on every start)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print corral's version (of the installed package) and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("corral")
        except PackageNotFoundError:
            found = "unknown (the corral package is not installed)"
        print(f"corral {found}")
        parser.exit()


def _add_global_archive_arg(parser: argparse.ArgumentParser) -> None:
    """`--archive PATH` (orchestrator/cli/archive.py reads it), here so that parsing needs no archive code."""
    parser.add_argument("--archive", metavar="PATH", default=os.environ.get("CORRAL_ARCHIVE") or None,
                        help="the archive directory `corral archive` writes: reads reach the positions the stream "
                             "no longer holds there (env CORRAL_ARCHIVE)")


def build_parser(*, lazy: bool = False) -> argparse.ArgumentParser:
    """corral's parser; `lazy`: a command's module is imported only when the command is parsed (what `corral`
    runs: a start imports one command's code, not all of it), otherwise every command's parser is built now."""
    from orchestrator.cli import commands
    from orchestrator.cli.connect import add_global_connection_args

    parser = Parser(
        prog="corral",
        description="corral: an event-sourced GPU scheduler. Every command reads or appends the NATS JetStream log.",
        epilog="Exit codes: 0 ok, 1 failed, 2 usage/invalid input, 3 NATS unreachable, 4 not found, 5 timed out, "
               "6 refused by NATS (credentials, permissions) or TLS.",
    )
    parser.add_argument("--version", action=_Version)
    add_global_connection_args(parser)
    _add_global_archive_arg(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, action=commands.LazyCommands)
    assert isinstance(sub, commands.LazyCommands)
    if lazy:
        sub.add_placeholders()
    else:
        commands.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from orchestrator.cli import commands

    parser = build_parser(lazy=True)
    args = parser.parse_args(argv)  # `--help` and `--version` exit here, having imported nothing more
    commands.import_structlog_without_rich()  # (if the command's module did not import it already)
    import asyncio

    from orchestrator.logging import configure_logging

    handler: Handler = args.handler
    # Library logs (the bus recovering a read, ...) go to stderr, quiet unless asked: stdout is the
    # command's output, which scripts parse. Services configure their own JSON logs.
    level = os.environ.get("CORRAL_LOG_LEVEL", "warning").lower()
    configure_logging(level if level in ("debug", "info", "warning", "error") else "warning", json=False)
    try:
        code = asyncio.run(handler(args))
    except CliError as e:
        print(f"corral: error: {e}", file=sys.stderr)
        code = e.code
    except KeyboardInterrupt:
        code = errors.INTERRUPTED
    except BrokenPipeError:  # `corral tail | head` closes early: not an error
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = errors.OK
    except Exception as e:
        code = _unexpected(e, args)
    sys.exit(code)


def _unexpected(e: Exception, args: argparse.Namespace) -> int:
    """One line for what escaped the commands (a connection lost midway, a refusal, a bug)."""
    import nats.errors

    from events.bus import BusError, LogGap

    if os.environ.get("CORRAL_DEBUG"):
        raise e
    # A service's fatal error arrives wrapped by its TaskGroup: say what it was.
    while isinstance(e, ExceptionGroup) and len(e.exceptions) == 1:
        e = e.exceptions[0]
    if isinstance(e, LogGap):  # a reader that would have to skip events stops instead (#19)
        from orchestrator.cli.archive import ARCHIVE_HINT

        # Positions the stream dropped (retention, a purge): the archive holds them (#30).
        hint = f"; {ARCHIVE_HINT}" if "not in the stream" in e.why and not getattr(args, "archive", None) else ""
        print(f"corral: error: {e}{hint}", file=sys.stderr)
        return errors.FAILURE
    if isinstance(e, (nats.errors.ConnectionClosedError, nats.errors.NoServersError, nats.errors.TimeoutError,
                      nats.errors.StaleConnectionError, BusError, ConnectionError, TimeoutError)):
        print(f"corral: error: lost NATS at {getattr(args, 'nats', '?')}: {e or type(e).__name__}", file=sys.stderr)
        return errors.UNREACHABLE
    if isinstance(e, nats.errors.Error):
        print(f"corral: error: NATS refused: {e}", file=sys.stderr)
        return errors.FAILURE
    print(f"corral: internal error: {type(e).__name__}: {e} (CORRAL_DEBUG=1 shows the traceback)", file=sys.stderr)
    return errors.FAILURE
