"""events.security.connect_options: flags -> nats.connect kwargs, and early, named errors."""

from __future__ import annotations

import base64
import json
import ssl
from pathlib import Path

import pytest

from deploy.nats.permissions import inbox_prefix
from events.security import connect_options, user_inbox_prefix
from tests.deploy.pki import Pki, have_openssl, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    if not have_openssl():
        pytest.skip("needs the openssl CLI")
    return make_pki(tmp_path_factory.mktemp("pki"))


def test_nothing_given_is_a_plain_connection() -> None:
    """No flags, no kwargs: nats.connect's defaults apply."""
    assert connect_options() == {}


def _creds(path: Path, claims: dict[str, object]) -> Path:
    """A .creds file shaped like nsc's (the signature and seed are not checked client-side)."""
    part = lambda d: base64.urlsafe_b64encode(json.dumps(d).encode()).decode().rstrip("=")  # noqa: E731
    jwt = f"{part({'typ': 'JWT', 'alg': 'ed25519-nkey'})}.{part(claims)}.c2ln"
    path.write_text(
        f"-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n"
        "-----BEGIN USER NKEY SEED-----\nSUAEXAMPLE\n------END USER NKEY SEED------\n"
    )
    return path


def test_creds_file_becomes_user_credentials_and_its_inbox(tmp_path: Path) -> None:
    """A .creds file goes to nats-py (which signs the server's nonce with the nkey); the private
    inbox comes from the JWT's user name, as the server's permissions expect."""
    creds = _creds(tmp_path / "agent.creds", {"name": "agent-n1", "sub": "UXXXX"})
    assert connect_options(creds=creds) == {"user_credentials": str(creds), "inbox_prefix": "_INBOX_agent-n1"}
    assert connect_options(creds=creds, inbox_prefix="_INBOX_x")["inbox_prefix"] == "_INBOX_x"


def test_creds_without_a_usable_name_keep_the_default_inbox(tmp_path: Path) -> None:
    """No name (or one that cannot be a subject token): nats-py's default inbox, no guessing."""
    assert "inbox_prefix" not in connect_options(creds=_creds(tmp_path / "a.creds", {"sub": "U"}))
    assert "inbox_prefix" not in connect_options(creds=_creds(tmp_path / "b.creds", {"name": "a.b"}))
    (tmp_path / "c.creds").write_text("not a creds file")
    assert "inbox_prefix" not in connect_options(creds=tmp_path / "c.creds")


def test_missing_files_fail_early_and_name_the_flag(tmp_path: Path) -> None:
    """A typo in a path fails at startup, saying which flag, not later in a reconnect loop."""
    with pytest.raises(FileNotFoundError, match="--creds"):
        connect_options(creds=tmp_path / "nope.creds")
    with pytest.raises(FileNotFoundError, match="--tls-ca"):
        connect_options(tls_ca=tmp_path / "nope.crt")
    with pytest.raises(FileNotFoundError, match="--password-file"):
        connect_options(user="u", password_file=tmp_path / "nope")


def test_user_and_password_with_the_users_private_inbox() -> None:
    """A user gets the inbox prefix the server configs allow it to subscribe to."""
    assert connect_options(user="agent-n1", password="s3cret") == {
        "user": "agent-n1",
        "password": "s3cret",
        "inbox_prefix": "_INBOX_agent-n1",
    }


def test_inbox_prefix_matches_the_server_configs() -> None:
    """Client and server derive the inbox the same way, or every reply would be refused."""
    for user in ("scheduler", "agent-gpu-07", "client-vision", "ops"):
        assert user_inbox_prefix(user) == inbox_prefix(user)


def test_password_file_keeps_the_secret_out_of_argv(tmp_path: Path) -> None:
    """The first line of the file is the password (a mounted Secret has no trailing newline issue)."""
    f = tmp_path / "pw"
    f.write_text("from-a-file\n")
    assert connect_options(user="ops", password_file=f)["password"] == "from-a-file"
    f.write_text("")
    with pytest.raises(ValueError, match="empty"):
        connect_options(user="ops", password_file=f)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"password": "x"},  # a password without a user
        {"user": "u", "password": "x", "password_file": "/etc/hostname"},  # two passwords
        {"creds": "/etc/hostname", "user": "u"},  # creds already say who
        {"tls_key": "/etc/hostname"},  # a key without its certificate
        {"tls_hostname": "x"},  # a hostname check without TLS
    ],
    ids=["password-no-user", "two-passwords", "creds-and-user", "key-no-cert", "hostname-no-tls"],
)
def test_contradictory_flags_are_refused(kwargs: dict[str, str]) -> None:
    """Ambiguous combinations are errors, not silent precedence rules."""
    with pytest.raises(ValueError):
        connect_options(**kwargs)  # type: ignore[arg-type]


def test_tls_context_verifies_the_server_and_opens_with_tls(pki: Pki) -> None:
    """A CA gives a verifying context (certificate and hostname), TLS >= 1.2, TLS-first by default."""
    opts = connect_options(tls_ca=pki.ca, tls_hostname="localhost")
    ctx = opts["tls"]
    assert isinstance(ctx, ssl.SSLContext)
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert ctx.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert opts["tls_handshake_first"] is True and opts["tls_hostname"] == "localhost"
    assert connect_options(tls_ca=pki.ca, tls_first=False)["tls_handshake_first"] is False


def test_client_certificate_is_loaded(pki: Pki) -> None:
    """Certificate and key are checked to belong together when the options are built."""
    assert isinstance(
        connect_options(tls_ca=pki.ca, tls_cert=pki.client_cert, tls_key=pki.client_key)["tls"], ssl.SSLContext
    )
    with pytest.raises(ValueError, match="matching"):
        connect_options(tls_ca=pki.ca, tls_cert=pki.client_cert, tls_key=pki.server_key)
