"""`corral` against a nats-server with corral's users and TLS: the global connection options.

The server runs the rendered accounts (deploy/nats/render.py) with a TLS-first listener and a CA
made by openssl (tests/deploy/pki.py). The commands go through the real parser (`corral ARGS`, in-process:
tests/cli/conftest.py), so what is tested is what a user types.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from deploy.nats.render import Tls, accounts, server
from events.bus import Bus
from events.security import connect_options
from orchestrator.cli.errors import DENIED, OK, USAGE
from tests.cli.conftest import assert_one_line_error, corral
from tests.deploy.launcher import Server, free_ports, passwords
from tests.deploy.pki import Pki, have_openssl, make_pki

pytestmark = pytest.mark.skipif(not have_openssl(), reason="needs the openssl CLI")

NODES = ["n1"]
PASSWORDS = passwords(NODES)


@dataclass(frozen=True)
class Secured:
    url: str
    pki: Pki
    secrets: Path

    def password_file(self, user: str) -> Path:
        return self.secrets / f"{user}.password"

    def login(self, user: str, *, ca: Path | None = None) -> list[str]:
        """Global options for `user` (its password file), trusting `ca` (default: the server's CA)."""
        return ["--nats", self.url, "--user", user, "--password-file", str(self.password_file(user)),
                "--tls-ca", str(ca or self.pki.ca)]


def _start(d: Path, tls: Tls) -> Server:
    port, http = free_ports(2)
    cfg = server(name="secured", listen=f"127.0.0.1:{port}", http=f"127.0.0.1:{http}", store_dir=str(d / "js"),
                 tls=tls, auth=accounts(NODES))
    return Server(cfg, d / "server.conf", PASSWORDS).start().wait_healthy()


def _secrets(d: Path) -> Path:
    out = d / "secrets"
    out.mkdir()
    for user in ("scheduler", "ops", "client", "admin"):
        (out / f"{user}.password").write_text(PASSWORDS[f"CORRAL_{user.upper()}_PASSWORD"] + "\n")
    (out / "wrong.password").write_text("not-the-password\n")
    return out


async def _make_stream(url: str, pki: Pki, secrets: Path, *, client_cert: bool = False) -> None:
    """The scheduler's user creates the stream, as `corral scheduler` would (clients may not)."""
    cert = (pki.client_cert, pki.client_key) if client_cert else (None, None)
    opts = connect_options(tls_ca=pki.ca, tls_cert=cert[0], tls_key=cert[1], user="scheduler",
                           password_file=secrets / "scheduler.password")
    bus = await Bus.connect(url, **opts)
    await bus.close()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secured(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    d = tmp_path_factory.mktemp("secured")
    srv = _start(d, Tls(str(pki.server_cert), str(pki.server_key), str(pki.ca)))
    secrets = _secrets(d)
    try:
        asyncio.run(_make_stream(srv.url, pki, secrets))
        yield Secured(srv.url, pki, secrets)
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def mutual(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    d = tmp_path_factory.mktemp("mutual")
    srv = _start(d, Tls(str(pki.server_cert), str(pki.server_key), str(pki.ca), verify=True))
    secrets = _secrets(d)
    try:
        asyncio.run(_make_stream(srv.url, pki, secrets, client_cert=True))
        yield Secured(srv.url, pki, secrets)
    finally:
        srv.stop()


def test_right_credentials_over_tls_list_jobs(secured: Secured) -> None:
    """User, password file and CA as global options: `corral jobs --json` reads the log."""
    assert json.loads(corral(*secured.login("ops"), "jobs", "--json").stdout)["jobs"] == []


def test_options_after_the_command_name_and_from_the_environment(secured: Secured) -> None:
    """The deploy manifests put them after the command; containers set them in the environment."""
    corral("jobs", *secured.login("ops"), "--json")
    env = {"CORRAL_NATS_URL": secured.url, "CORRAL_NATS_USER": "ops",
           "CORRAL_NATS_PASSWORD_FILE": str(secured.password_file("ops")), "CORRAL_NATS_CA": str(secured.pki.ca)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        assert json.loads(corral("jobs", "--json").stdout)["jobs"] == []
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_wrong_password_is_refused_with_a_clear_line(secured: Secured) -> None:
    args = secured.login("ops")
    args[args.index("--password-file") + 1] = str(secured.password_file("wrong"))
    line = assert_one_line_error(corral(*args, "jobs", "--json", check=None), DENIED)
    assert "refused user 'ops'" in line and "authorization violation" in line


def test_unknown_user_is_refused(secured: Secured) -> None:
    args = secured.login("ops")
    args[args.index("--user") + 1] = "mallory"
    line = assert_one_line_error(corral(*args, "jobs", check=None), DENIED)
    assert "'mallory'" in line and "authorization violation" in line


def test_no_credentials_says_which_options_to_give(secured: Secured) -> None:
    line = assert_one_line_error(corral("--nats", secured.url, "--tls-ca", str(secured.pki.ca), "jobs",
                                        check=None), DENIED)
    assert "--user/--password-file or --creds" in line


def test_a_server_the_ca_does_not_vouch_for_is_not_trusted(secured: Secured) -> None:
    """TLS verification fails before any credential is sent: exit DENIED, saying which CA."""
    line = assert_one_line_error(corral(*secured.login("ops", ca=secured.pki.other_ca), "jobs", check=None),
                                 DENIED)
    assert "cannot verify" in line and "other-ca.crt" in line


def test_there_is_no_password_flag(secured: Secured) -> None:
    """A password on the command line would show in `ps`: only --password-file exists."""
    proc = corral("--nats", secured.url, "--user", "ops", "--password", "x", "jobs", check=None)
    assert proc.returncode == USAGE


def test_missing_password_file_is_a_usage_error(secured: Secured, tmp_path: Path) -> None:
    args = secured.login("ops")
    args[args.index("--password-file") + 1] = str(tmp_path / "nope")
    line = assert_one_line_error(corral(*args, "jobs", check=None), USAGE)
    assert "--password-file" in line and "no such file" in line


def test_a_refused_write_fails_fast_with_the_servers_words(secured: Secured) -> None:
    """ops may not append: `queue set` stops at the server's permission error, not after ack timeouts."""
    start = time.monotonic()
    line = assert_one_line_error(corral(*secured.login("ops"), "queue", "set", "q1", check=None), DENIED)
    assert "permissions violation for publish" in line and "corral.queue.q1.queuedefined" in line.lower()
    assert time.monotonic() - start < 15
    # ... while the admin user may.
    assert corral(*secured.login("admin"), "queue", "set", "q1").returncode == OK


def test_mutual_tls_needs_the_client_certificate(mutual: Secured) -> None:
    cert = ["--tls-cert", str(mutual.pki.client_cert), "--tls-key", str(mutual.pki.client_key)]
    assert json.loads(corral(*mutual.login("ops"), *cert, "jobs", "--json").stdout)["jobs"] == []
    assert_one_line_error(corral(*mutual.login("ops"), "jobs", check=None), DENIED)


def test_help_describes_every_connection_option() -> None:
    out = corral("--help").stdout + corral("scheduler", "--help").stdout
    for flag, words in (("--user", "NATS user"), ("--password-file", "password"), ("--tls-ca", "CA"),
                        ("--tls-cert", "mutual TLS"), ("--tls-key", "key"), ("--replicas", "replicas"),
                        ("--creds", "creds")):
        assert flag in out and words in out, flag
    assert "6 refused by NATS" in corral("--help").stdout
