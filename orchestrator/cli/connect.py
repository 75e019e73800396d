"""Connecting the CLI to the log, with errors a user can act on.

The connection options (URL, credentials, TLS, stream replicas) are global:
`corral --user u --password-file f jobs`. Every command that connects also
takes them after its name (`corral jobs --user u ...`), which is how the
deploy manifests write them; a per-command value wins over the global one.
Each has an environment variable for its default, so a shell or a container
sets them once. There is no password flag and no password variable: the
password comes from a file, so it never shows in `ps` or a process's
environment.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, NamedTuple

from orchestrator.cli.errors import DENIED, UNREACHABLE, USAGE, CliError

if TYPE_CHECKING:
    import asyncio
    import logging

    from events.bus import Bus

# nats-py, structlog and the bus are imported when a command connects, not when `corral` starts:
# `--help`, `--version` and the parsers of every command need none of them.


def _no_ssl_eof_noise(record: logging.LogRecord) -> bool:
    """asyncio warns "returning true from eof_received() has no effect when using ssl" whenever a TLS
    connection closes (nats-py's protocol returns True): noise on a command's one-line stderr.
    (A logging filter; added by `connected`, once: the same function is not added twice.)"""
    return "eof_received()" not in record.getMessage()

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"


class DefaultUrl(str):
    """The URL a command uses when nobody named one (no --nats, no CORRAL_NATS_URL): whatever listens there may
    be another program's NATS server, so a command checks that it holds a corral cluster before reading it."""

    __slots__ = ()


def _nats_url(text: str) -> str:
    """--nats's type: the text as given (the default keeps its DefaultUrl type through argparse)."""
    return text


def _replicas(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= 5:
        raise argparse.ArgumentTypeError(f"replicas must be 1..5 (JetStream's limit), not {text!r}")
    return n


class _Option(NamedTuple):
    flag: str
    env: str
    metavar: str
    help: str
    type: Any = str
    services_only: bool = False  # per-command copy on the services only (scheduler, agent, admission)


OPTIONS = (
    _Option("--nats", "CORRAL_NATS_URL", "URL",
            "NATS server URL; several, comma-separated, for a cluster (default: the embedded server of `corral up`, "
            f"{DEFAULT_NATS_URL}, read only if it holds a corral cluster)", type=_nats_url),
    _Option("--creds", "CORRAL_NATS_CREDS", "FILE",
            "NATS .creds file (JWT + nkey, decentralized auth); instead of --user/--password-file"),
    _Option("--user", "CORRAL_NATS_USER", "NAME",
            "NATS user (deploy/nats/accounts.conf: scheduler, agent-<node>, client-<team>, admin, ops, ...)"),
    _Option("--password-file", "CORRAL_NATS_PASSWORD_FILE", "FILE",
            "file whose first line is --user's password (never on the command line: `ps` would show it)"),
    _Option("--tls-ca", "CORRAL_NATS_CA", "FILE",
            "CA bundle to verify the NATS server's certificate; any --tls-* option makes the connection "
            "TLS-first (the server needs handshake_first)"),
    _Option("--tls-cert", "CORRAL_NATS_CERT", "FILE",
            "client certificate for mutual TLS (PEM; may hold the key too)"),
    _Option("--tls-key", "CORRAL_NATS_KEY", "FILE", "private key of --tls-cert"),
    _Option("--replicas", "CORRAL_STREAM_REPLICAS", "N",
            "replicas of the CORRAL stream and buckets when this service creates them (3 in a 3-server "
            "cluster; an existing stream is never scaled down; default 1)", type=_replicas, services_only=True),
)


def _help(o: _Option) -> str:
    return f"{o.help} (env {o.env})".replace("%", "%%")


def add_global_connection_args(parser: argparse.ArgumentParser) -> None:
    """The options before the command name; defaults from the environment."""
    group = parser.add_argument_group("connection (also accepted after the command name)")
    for o in OPTIONS:
        # A string default goes through `type` too, so a bad variable is a usage error like a bad flag.
        default = os.environ.get(o.env) or {"--nats": DefaultUrl(DEFAULT_NATS_URL), "--replicas": "1"}.get(o.flag)
        group.add_argument(o.flag, default=default, metavar=o.metavar, type=o.type, help=_help(o))


def add_connection_args(p: argparse.ArgumentParser, *, service: bool = False) -> None:
    """Per-command copies of the global options, so `corral jobs --nats URL` works as well."""
    group = p.add_argument_group("connection")
    for o in OPTIONS:
        if o.services_only and not service:
            continue
        group.add_argument(o.flag, default=argparse.SUPPRESS, metavar=o.metavar, type=o.type, help=_help(o))


def add_log_level_arg(p: argparse.ArgumentParser) -> None:
    """A service's `--log-level` (env CORRAL_LOG_LEVEL)."""
    p.add_argument("--log-level", default=os.environ.get("CORRAL_LOG_LEVEL", "info"),
                   choices=("debug", "info", "warning", "error"), help="structlog JSON log level")


class _NatsErrors:
    """What nats-py reported through its error callback (it raises something vaguer, or nothing).

    A command (not a service) whose publish the server refuses is stopped at once: nats-py
    would only notice when the append's ack times out, four retries later.
    """

    def __init__(self, service: bool = False) -> None:  # (not a dataclass: `corral --help` need not import them)
        self.service = service
        self.seen: list[Exception] = []
        self.command: asyncio.Task[Any] | None = None
        self.refused: Exception | None = None

    async def record(self, e: Exception) -> None:
        self.seen.append(e)
        del self.seen[:-20]
        if self.service:  # a service keeps retrying: say why
            import structlog

            structlog.get_logger("corral.cli").warning("nats_error", error=str(e) or type(e).__name__)
        if self.command is not None and self.refused is None and self._fatal(e):
            self.refused = e
            self.command.cancel()

    def _fatal(self, e: Exception) -> bool:
        """Whether a refusal stops the command: any refused publish; for a service, a write to the log or a bucket.

        A service whose own appends or heartbeats are refused (an agent's user for another node, say)
        would retry them forever: better to stop, naming the permission. Refused creates of the
        stream or a bucket are the bus's business (it waits for the scheduler or raises
        PermissionDenied); anything else a service is refused is logged above and survived.
        """
        text = str(e).lower()
        marker = "permissions violation for publish to "
        if marker not in text:
            return False
        subject = text.split(marker, 1)[1].strip().strip("'\"")
        return not self.service or subject.startswith(("corral.", "$kv."))

    def matching(self, text: str) -> Exception | None:
        return next((e for e in reversed(self.seen) if text in str(e).lower()), None)


def _who(args: argparse.Namespace) -> str:
    if getattr(args, "creds", None):
        return f"the credentials in {args.creds}"
    if getattr(args, "user", None):
        return f"user {args.user!r}"
    return "an anonymous connection (this server wants --user/--password-file or --creds)"


def _connect_failure(args: argparse.Namespace, e: BaseException, errs: _NatsErrors) -> CliError:
    """The one line that explains why connecting failed, and its exit code."""
    import ssl

    url = args.nats
    if errs.matching("authorization violation") or "authorization violation" in str(e).lower():
        return CliError(f"NATS at {url} refused {_who(args)}: authorization violation "
                        "(wrong user or password, or an unknown user)", DENIED)
    if errs.matching("authentication expired") or errs.matching("authentication revoked"):
        return CliError(f"NATS at {url} refused {_who(args)}: the credentials expired or were revoked", DENIED)
    tls = next((x for x in [e, *reversed(errs.seen)] if isinstance(x, ssl.SSLError)), None)
    if isinstance(tls, ssl.SSLCertVerificationError):
        return CliError(f"TLS: cannot verify the NATS server at {url} with --tls-ca {args.tls_ca or '(system CAs)'}: "
                        f"{tls.verify_message or tls}", DENIED)
    if tls is not None:
        return CliError(f"TLS handshake with NATS at {url} failed ({tls.reason or tls}); the server must speak TLS "
                        "with handshake_first, and with mutual TLS it needs --tls-cert/--tls-key", DENIED)
    return CliError(f"cannot reach NATS at {url} ({type(e).__name__}); is `corral up` running? "
                    "Set --nats or CORRAL_NATS_URL", UNREACHABLE)


@contextlib.asynccontextmanager
async def connected(args: argparse.Namespace, *, name: str = "corral-cli", timeout: float = 3.0,
                    forever: bool = False, wait_for_creator: bool = False) -> AsyncIterator[Bus]:
    """A Bus for the command; `forever` (services) keeps reconnecting instead of giving up.

    Refused credentials and failed TLS exit with DENIED, an unreachable server with
    UNREACHABLE; a write the server's permissions refuse fails the command with DENIED
    and the server's words instead of a timeout. `wait_for_creator` (agents, admission:
    their users may not create the stream) waits for the scheduler to create the stream
    and buckets instead of failing; a cluster still electing its JetStream meta leader
    gets 60 s (services) or 10 s (commands) before UNREACHABLE says so.
    """
    import asyncio
    import logging

    import nats.errors

    from events.bus import Bus, BusError, NotReady, PermissionDenied
    from events.security import connect_options

    logging.getLogger("asyncio").addFilter(_no_ssl_eof_noise)
    try:
        opts = connect_options(
            creds=getattr(args, "creds", None), tls_ca=getattr(args, "tls_ca", None),
            tls_cert=getattr(args, "tls_cert", None), tls_key=getattr(args, "tls_key", None),
            user=getattr(args, "user", None), password_file=getattr(args, "password_file", None),
        )  # fmt: skip
    except (ValueError, OSError) as e:
        raise CliError(str(e), USAGE) from None
    errs = _NatsErrors(service=forever)
    opts["error_cb"] = errs.record  # no tracebacks from nats-py's default callback: the lines above say it
    if not forever:
        # One try, then an error: a command should fail in seconds, not retry.
        opts.update(connect_timeout=timeout, allow_reconnect=False, connect_attempts=1)
    servers = [u.strip() for u in args.nats.split(",") if u.strip()]
    if not forever and isinstance(args.nats, DefaultUrl):
        await _check_holds_corral(args.nats, {k: v for k, v in opts.items() if k not in ("error_cb", "connect_attempts")})
    try:
        bus = await Bus.connect(servers if len(servers) > 1 else args.nats, name=name,
                                replicas=getattr(args, "replicas", 1) or 1, wait_for_creator=wait_for_creator,
                                ready_timeout=60.0 if forever else 10.0, **opts)
    except PermissionDenied as e:
        raise CliError(f"NATS refused {_who(args)} permission to {e.operation}: permissions violation for publish "
                       f"to {e.subject}{_CREATOR_HINT if e.operation.startswith('create') else ''}", DENIED) from None
    except NotReady as e:
        raise CliError(f"NATS at {args.nats}: {e}", UNREACHABLE) from None
    except (nats.errors.NoServersError, nats.errors.Error, OSError, TimeoutError) as e:
        raise _connect_failure(args, e, errs) from None
    errs.command = asyncio.current_task()
    try:
        yield bus
    except asyncio.CancelledError:
        if errs.refused is None or errs.command is None:
            raise
        errs.command.uncancel()
        raise CliError(f"NATS refused {_who(args)}: {_server_words(errs.refused)}; this user may not do that",
                       DENIED) from None
    except (nats.errors.Error, BusError, TimeoutError):
        denied = errs.matching("permissions violation")
        if denied is not None:
            raise CliError(f"NATS refused {_who(args)}: {_server_words(denied)}; this user may not do that",
                           DENIED) from None
        raise
    finally:
        errs.command = None
        await bus.close()


async def _check_holds_corral(url: str, opts: dict[str, Any]) -> None:
    """Raise CliError (UNREACHABLE) naming the server at the default `url` unless it holds a corral cluster: the
    CORRAL stream, capturing `corral.>`. Looked at, never written: another program's server gets no stream.

    A server that cannot be reached is left to the connection that follows (its error says so).
    """
    import nats
    import nats.errors
    import nats.js.errors

    from events.subjects import ALL

    try:
        nc = await nats.connect(url, name="corral-cli-check", error_cb=_quiet, max_reconnect_attempts=1, **opts)
    except (nats.errors.Error, OSError, TimeoutError):
        return
    try:
        server = nc._server_info  # (what the server said of itself in its INFO)
        what = f"{server.get('server_name') or server.get('server_id', '?')} (nats-server {server.get('version', '?')})"
        try:
            info = await nc.jetstream(timeout=2.0).stream_info("CORRAL")
            missing = "" if ALL in (info.config.subjects or []) else \
                f"its stream CORRAL captures {', '.join(info.config.subjects or []) or 'nothing'}, not {ALL}"
        except nats.js.errors.NotFoundError:
            missing = "it has no CORRAL stream"
        except (nats.errors.Error, TimeoutError) as e:
            missing = f"it answers no JetStream request ({type(e).__name__})"
    finally:
        await nc.close()
    if missing:
        raise CliError(f"the default NATS URL {url} (no --nats, no CORRAL_NATS_URL) reached {what}, which holds no "
                       f"corral cluster: {missing}; not reading it. Start `corral up`, or point --nats or "
                       "CORRAL_NATS_URL at your cluster", UNREACHABLE)


async def _quiet(e: Exception) -> None:
    """nats-py's error callback for the look at the default URL: the command's own connection reports errors."""


#: Why a create is refused: it was missing, and only the scheduler's user creates it (deploy/nats/permissions.py).
_CREATOR_HINT = ("; it does not exist yet, and only the `scheduler` user may create it: start `corral scheduler` "
                 "(as that user) first")


def _server_words(e: Exception) -> str:
    """nats-py's "nats: 'permissions violation for publish to ...'" as the server said it (lowercased by nats-py)."""
    text = str(e).strip()
    return text.removeprefix("nats: ").strip("'") or type(e).__name__
