"""Credentials and TLS for a NATS connection, as keyword arguments of `nats.connect`.

One function so the Bus, the CLI and the tests turn the same flags into the
same connection: a `.creds` file (JWT + nkey, decentralized auth), or a user
and password (the static accounts of deploy/nats/accounts.conf), plus TLS from
a CA and an optional client certificate (mutual TLS).

Errors surface here, at startup, with the flag's name in them: a missing CA
file or a certificate without its key would otherwise fail later inside the
TLS handshake or nats-py's reconnect loop with a less useful message.
"""

from __future__ import annotations

import base64
import json
import os
import re
import ssl
from pathlib import Path
from typing import Any


def connect_options(
    creds: str | os.PathLike[str] | None = None,
    tls_ca: str | os.PathLike[str] | None = None,
    tls_cert: str | os.PathLike[str] | None = None,
    tls_key: str | os.PathLike[str] | None = None,
    *,
    user: str | None = None,
    password: str | None = None,
    password_file: str | os.PathLike[str] | None = None,
    tls_hostname: str | None = None,
    tls_first: bool = True,
    inbox_prefix: str | None = None,
) -> dict[str, Any]:
    """kwargs for `nats.connect(servers, **connect_options(...))`; `{}` when nothing is given.

    - `creds`: a `.creds` file -> `user_credentials` (exclusive with user/password).
    - `user` with `password` or `password_file` (first line; a file keeps the
      secret out of the process arguments, e.g. a mounted Kubernetes Secret).
    - `tls_ca`: trust this CA instead of the system's (a private CA);
      `tls_cert` + `tls_key`: present a client certificate. Any TLS argument
      makes the connection TLS-only with `tls_first` (the default): the client
      opens with the TLS handshake, so it never sends its CONNECT (password)
      in plain text. Without it nats-py reads the server's plain-text INFO
      first and upgrades only if that server asks for TLS, so a server without
      TLS (or an impostor) would get the credentials in the clear. The server
      needs `handshake_first: true` in its tls block (deploy/nats renders it).
    - `inbox_prefix`: where replies and consumer deliveries arrive. corral's
      server configs let each user subscribe to `_INBOX_<user>.>` only (see
      deploy/nats/permissions.py for why), so with a `user` it defaults to
      that; with `creds`, to `_INBOX_<name>` from the JWT's `name` claim
      (the user name `nsc add user` was given). Harmless against a server
      without such limits.
    - `tls_hostname`: the name to check the server's certificate against when
      it differs from the URL's host (e.g. connecting by IP).
    """
    opts: dict[str, Any] = {}

    if creds is not None:
        if user is not None or password is not None or password_file is not None:
            raise ValueError("--creds already identifies the user: do not also pass a user or password")
        opts["user_credentials"] = str(_readable(creds, "--creds"))
        name = creds_user_name(creds)
        if inbox_prefix is None and name is not None:
            inbox_prefix = user_inbox_prefix(name)

    if password is not None and password_file is not None:
        raise ValueError("pass a password or a password file, not both")
    if password_file is not None:
        lines = _readable(password_file, "--password-file").read_text().splitlines()
        password = lines[0] if lines else ""
        if not password:
            raise ValueError(f"--password-file {password_file}: empty")
    if password is not None and user is None:
        raise ValueError("a password needs a user")
    if user is not None:
        opts["user"] = user
        if password is not None:
            opts["password"] = password
        if inbox_prefix is None:
            inbox_prefix = user_inbox_prefix(user)
    if inbox_prefix is not None:
        opts["inbox_prefix"] = inbox_prefix

    if tls_key is not None and tls_cert is None:
        raise ValueError("--tls-key needs --tls-cert")
    if tls_ca is not None or tls_cert is not None:
        opts["tls"] = tls_context(tls_ca, tls_cert, tls_key)
        opts["tls_handshake_first"] = tls_first
        if tls_hostname is not None:
            opts["tls_hostname"] = tls_hostname
    elif tls_hostname is not None:
        raise ValueError("--tls-hostname needs --tls-ca or --tls-cert")
    return opts


def creds_user_name(creds: str | os.PathLike[str]) -> str | None:
    """The `name` claim of the user JWT in a .creds file (not verified: the server does that)."""
    lines = Path(creds).read_text().splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if "BEGIN NATS USER JWT" in line)
        token = next(line.strip() for line in lines[start + 1 :] if line.strip())
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (StopIteration, IndexError, ValueError):
        return None
    name = claims.get("name") if isinstance(claims, dict) else None
    return name if isinstance(name, str) and _TOKEN.fullmatch(name) else None


_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,128}")  # a name usable in one subject token


def team_account(team: str) -> str:
    """`vision` -> `TEAM_VISION`: the NATS account of a team's users (deploy/nats/render.py renders it,
    orchestrator/scheduler/gateway.py reads it from the server's Nats-Request-Info stamp)."""
    return "TEAM_" + re.sub(r"[^A-Z0-9]", "_", team.upper())


def user_inbox_prefix(user: str) -> str:
    """`_INBOX_<user>`: must match deploy.nats.permissions.inbox_prefix (a test checks)."""
    return f"_INBOX_{user}"


def tls_context(
    ca: str | os.PathLike[str] | None,
    cert: str | os.PathLike[str] | None = None,
    key: str | os.PathLike[str] | None = None,
) -> ssl.SSLContext:
    """A client context that verifies the server (against `ca`, else the system's CAs), TLS 1.2+.

    `cert` without `key` is allowed when the PEM holds both.
    """
    ctx = ssl.create_default_context(
        ssl.Purpose.SERVER_AUTH, cafile=str(_readable(ca, "--tls-ca")) if ca is not None else None
    )
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert is not None:
        key_path = str(_readable(key, "--tls-key")) if key is not None else None
        try:
            ctx.load_cert_chain(str(_readable(cert, "--tls-cert")), key_path)
        except ssl.SSLError as e:
            raise ValueError(f"--tls-cert {cert} / --tls-key {key}: not a matching certificate and key ({e})") from e
    return ctx


def _readable(path: str | os.PathLike[str], flag: str) -> Path:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{flag} {p}: no such file")
    if not os.access(p, os.R_OK):
        raise PermissionError(f"{flag} {p}: not readable")
    return p
