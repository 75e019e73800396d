"""Connecting the CLI to the log, with errors a user can act on."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator

import nats.errors

from events.bus import Bus
from events.security import connect_options
from orchestrator.cli.errors import UNREACHABLE, USAGE, CliError


def add_connection_args(p: argparse.ArgumentParser) -> None:
    """Per-command copies of the global options, so `corral jobs --nats URL` works as well."""
    p.add_argument("--nats", default=argparse.SUPPRESS, metavar="URL", help="NATS server URL")
    p.add_argument("--creds", default=argparse.SUPPRESS, metavar="FILE", help="NATS credentials file")
    p.add_argument("--tls-ca", default=argparse.SUPPRESS, metavar="FILE", help="CA bundle for NATS TLS")


async def _quiet(_e: Exception) -> None:
    """Connection errors surface as CliError; nats-py need not print them too."""


@contextlib.asynccontextmanager
async def connected(args: argparse.Namespace, *, name: str = "corral-cli", timeout: float = 3.0,
                    forever: bool = False) -> AsyncIterator[Bus]:
    """A Bus for the command; `forever` (services) keeps reconnecting instead of giving up."""
    try:
        opts = connect_options(creds=args.creds, tls_ca=args.tls_ca)
    except (ValueError, OSError) as e:
        raise CliError(str(e), USAGE) from None
    if not forever:
        # Two tries, then NoServersError; no tracebacks from nats-py's default error callback:
        # the one line below says it all.
        opts.update(connect_timeout=timeout, allow_reconnect=False, connect_attempts=1, error_cb=_quiet)
    try:
        bus = await Bus.connect(args.nats, name=name, **opts)
    except (nats.errors.NoServersError, nats.errors.Error, OSError, TimeoutError) as e:
        raise CliError(f"cannot reach NATS at {args.nats} ({type(e).__name__}); is `corral up` running? "
                       "Set --nats or CORRAL_NATS_URL", UNREACHABLE) from None
    try:
        yield bus
    finally:
        await bus.close()
