"""Who may read the web UI: where it listens, its token, and the headers every answer carries.

It listens on 127.0.0.1 unless told otherwise, and anywhere else only with a
token (`check_access` refuses to start without one; TLS is optional on top).
With a token every request needs it: an `Authorization: Bearer` header, or
`?token=` once, which sets an HttpOnly, SameSite=Strict cookie holding an
HMAC of the token (never the token), and redirects to the same page without
it. On loopback without a token, a request whose Host is not a loopback name
is refused (403), so a web page elsewhere cannot reach it by rebinding DNS to
127.0.0.1. Nothing writes: anything but GET and HEAD is refused (405).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from aiohttp import web

from orchestrator.cli.errors import USAGE, CliError

COOKIE = "corral_ui"
#: Shortest token accepted: a guessable one protects nothing.
MIN_TOKEN = 16
_json = msgspec.json.Encoder()
_CSP = ("default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'self'")


@dataclass(frozen=True)
class Access:
    """Where the UI listens and who may read it."""

    listen: str = "127.0.0.1"
    port: int = 8470
    token: str | None = None
    ssl: ssl.SSLContext | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.ssl is not None else "http"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_access(access: Access) -> None:
    """Refuse to listen off loopback without a token (CliError, exit 2), and a token too short to protect."""
    if access.token is not None and len(access.token) < MIN_TOKEN:
        raise CliError(f"the UI token is {len(access.token)} characters: use {MIN_TOKEN} or more "
                       "(e.g. `openssl rand -hex 16 > token`)", USAGE)
    if not is_loopback(access.listen) and access.token is None:
        raise CliError(f"listening on {access.listen} (not loopback) needs a token: --token-file FILE or "
                       "CORRAL_UI_TOKEN (and --https-cert/--https-key for TLS), or listen on 127.0.0.1", USAGE)


def _cookie_value(token: str) -> str:
    return hmac.new(token.encode(), b"corral-ui-cookie", hashlib.sha256).hexdigest()


def _host_name(host: str) -> str:
    """`127.0.0.1:8470` -> `127.0.0.1`, `[::1]:8470` -> `::1`."""
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def json_response(body: Any, status: int = 200) -> web.Response:
    """Every JSON answer of the UI (an error too: `error`)."""
    return web.Response(body=_json.encode(body), status=status, content_type="application/json")


def error(status: int, message: str) -> web.Response:
    return json_response({"error": message}, status)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def guard(access: Access) -> Any:
    """The middleware that lets a request through only as the module's docstring says."""
    cookie = _cookie_value(access.token) if access.token else None

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD"):
            return error(405, "the corral UI is read-only: only GET")
        if access.token is None:
            if not is_loopback(_host_name(request.host)):
                return error(403, f"Host {request.host!r} is not this loopback server's name")
            return await handler(request)
        assert cookie is not None
        header = request.headers.get("Authorization", "")
        given = header[7:] if header.startswith("Bearer ") else None
        if given is not None and hmac.compare_digest(given.encode(), access.token.encode()):
            return await handler(request)
        if hmac.compare_digest(request.cookies.get(COOKIE, "").encode(), cookie.encode()):
            return await handler(request)
        query = request.query.get("token")
        if query is not None and hmac.compare_digest(query.encode(), access.token.encode()):
            # Once: the cookie carries it from now on, and the address bar and history lose the token.
            rest = request.rel_url.with_query([(k, v) for k, v in request.query.items() if k != "token"])
            resp = web.Response(status=302, headers={"Location": str(rest)})
            resp.set_cookie(COOKIE, cookie, httponly=True, samesite="Strict", secure=access.ssl is not None,
                            path="/")
            return resp
        return error(401, "this corral UI needs its token: open it once with ?token=TOKEN, or send "
                           "'Authorization: Bearer TOKEN'")

    return check


async def security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """On every answer: only this server's own scripts and styles, no framing, no sniffing, no referrer."""
    response.headers.setdefault("Content-Security-Policy", _CSP)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "no-referrer")
    response.headers.setdefault("X-Frame-Options", "DENY")
