"""`corral ui`: the read-only web UI, served by corral itself (`corral up` starts one too).

The pages and the server are in orchestrator/cli/webui/; this module is the
command: where it listens, its token, TLS. Off loopback it will not start
without a token (README, "Web UI").
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.cli.connect import add_connection_args
from orchestrator.cli.errors import USAGE, CliError

if TYPE_CHECKING:
    from orchestrator.cli.webui.access import Access

#: The UI's port unless told (`corral up` takes any free one when it is taken).
DEFAULT_PORT = 8470


def read_token(args: argparse.Namespace) -> str | None:
    """The token from --token-file, else $CORRAL_UI_TOKEN; None: no token."""
    path = getattr(args, "token_file", None)
    if path is not None:
        try:
            token = Path(path).read_text().strip()
        except OSError as e:
            raise CliError(f"cannot read --token-file {path}: {e.strerror or e}", USAGE) from None
        if not token:
            raise CliError(f"--token-file {path} is empty", USAGE)
        return token
    return os.environ.get("CORRAL_UI_TOKEN") or None


def tls_context(cert: str | None, key: str | None) -> object | None:
    """An SSL context for --https-cert/--https-key (both or neither)."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise CliError("--https-cert and --https-key go together", USAGE)
    import ssl

    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise CliError(f"cannot load the UI's TLS certificate {cert} / key {key}: {e}", USAGE) from None
    return ctx


def access_of(args: argparse.Namespace, *, listen: str, port: int) -> Access:
    import ssl

    from orchestrator.cli.webui.access import Access, check_access

    ctx = tls_context(getattr(args, "https_cert", None), getattr(args, "https_key", None))
    assert ctx is None or isinstance(ctx, ssl.SSLContext)
    access = Access(listen=listen, port=port, token=read_token(args), ssl=ctx)
    check_access(access)
    return access


async def ui(args: argparse.Namespace) -> int:
    from orchestrator.cli.connect import connected
    from orchestrator.cli.services import until_signalled
    from orchestrator.cli.webui.server import serve

    if not 0 <= args.port <= 65535:
        raise CliError(f"--port {args.port}: 0 to 65535", USAGE)
    access = access_of(args, listen=args.listen, port=args.port)

    def ready(url: str) -> None:
        how = " (with its token: open it once as URL?token=TOKEN)" if access.token else ""
        print(f"corral ui: {url}{how}; Ctrl-C stops", flush=True)

    async with connected(args, name="corral-ui", forever=True) as bus:
        return await until_signalled(serve(bus, access, on_ready=ready))


def add_ui_access_args(p: argparse.ArgumentParser) -> None:
    """--token-file and --https-cert/--https-key (`corral ui` and `corral up`)."""
    p.add_argument("--token-file", metavar="FILE", help="a file holding the token every request must carry "
                   "(16 characters or more; env CORRAL_UI_TOKEN). Required to listen off loopback")
    p.add_argument("--https-cert", metavar="FILE", help="serve HTTPS with this certificate (PEM) ...")
    p.add_argument("--https-key", metavar="FILE", help="... and this private key")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("ui", help="serve the read-only web UI: cluster, queues, jobs, history",
                       description="A read-only web UI folded from the log, live (server-sent events): the GPU "
                                   "grid, queues and fair share, a jobs table and each job's story, history from "
                                   "the index. It listens on 127.0.0.1 unless --listen says otherwise, and "
                                   "elsewhere only with a token (--token-file or CORRAL_UI_TOKEN).")
    add_connection_args(p)
    p.add_argument("--listen", default="127.0.0.1", metavar="ADDR",
                   help="address to listen on (default %(default)s; anything but loopback needs a token)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="port (default %(default)s; 0: any free one)")
    add_ui_access_args(p)
    p.set_defaults(handler=ui)
