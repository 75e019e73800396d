"""TLS on real nats-servers, with a CA made in the test (openssl), through events.security."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import nats
import pytest

from deploy.nats.render import Tls, accounts, server
from events.security import connect_options
from tests.deploy.launcher import Server, free_ports, passwords
from tests.deploy.pki import Pki, have_openssl, make_pki

pytestmark = pytest.mark.skipif(not have_openssl(), reason="needs the openssl CLI")

NODES = ["n1"]
PASSWORD = passwords(NODES)["CORRAL_OPS_PASSWORD"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _server(d: Path, tls: Tls | None) -> Server:
    port, http = free_ports(2)
    cfg = server(
        name="tls", listen=f"127.0.0.1:{port}", http=f"127.0.0.1:{http}", store_dir=str(d / "js"),
        tls=tls, auth=accounts(NODES),
    )  # fmt: skip
    return Server(cfg, d / "server.conf", passwords(NODES)).start().wait_healthy()


@pytest.fixture(scope="module")
def tls_server(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Server:
    srv = _server(tmp_path_factory.mktemp("tls"), Tls(str(pki.server_cert), str(pki.server_key), str(pki.ca)))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def mtls_server(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Server:
    srv = _server(
        tmp_path_factory.mktemp("mtls"), Tls(str(pki.server_cert), str(pki.server_key), str(pki.ca), verify=True)
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory: pytest.TempPathFactory) -> Server:
    srv = _server(tmp_path_factory.mktemp("plain"), None)
    yield srv
    srv.stop()


async def _round_trip(url: str, opts: dict[str, Any]) -> None:
    """Connect, and prove the connection works by a JetStream request (answered on the user's inbox)."""
    nc = await nats.connect(url, allow_reconnect=False, connect_timeout=3, **opts)
    try:
        await nc.jetstream(timeout=3).account_info()
    finally:
        await nc.close()


async def test_client_trusting_the_ca_connects(tls_server: Server, pki: Pki) -> None:
    """The server's certificate verifies against the CA the client was given; auth works over it."""
    await _round_trip(tls_server.url, connect_options(tls_ca=pki.ca, user="ops", password=PASSWORD))


async def test_client_trusting_another_ca_is_refused(tls_server: Server, pki: Pki) -> None:
    """Without our CA the client cannot verify the server, so it does not connect (no blind trust)."""
    with pytest.raises(ssl.SSLCertVerificationError):
        await _round_trip(tls_server.url, connect_options(tls_ca=pki.other_ca, user="ops", password=PASSWORD))


async def test_client_checks_the_server_name(tls_server: Server, pki: Pki) -> None:
    """A certificate from our CA issued for another name does not pass (hostname checking is on)."""
    opts = connect_options(tls_ca=pki.ca, user="ops", password=PASSWORD, tls_hostname="evil.example")
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        await _round_trip(tls_server.url, opts)


async def test_plain_text_client_is_refused(tls_server: Server) -> None:
    """The server talks TLS first: a client without TLS never gets as far as sending its password."""
    with pytest.raises(nats.errors.Error):
        await _round_trip(tls_server.url, {"user": "ops", "password": PASSWORD})


async def test_mutual_tls_needs_a_client_certificate(mtls_server: Server, pki: Pki) -> None:
    """With verify: true the server refuses a client that has the CA but no certificate of its own."""
    with pytest.raises(ssl.SSLError, match="CERTIFICATE_REQUIRED"):
        await _round_trip(mtls_server.url, connect_options(tls_ca=pki.ca, user="ops", password=PASSWORD))


async def test_mutual_tls_accepts_a_certificate_from_the_ca(mtls_server: Server, pki: Pki) -> None:
    """A client certificate signed by the CA is accepted (plus the password: two factors)."""
    opts = connect_options(
        tls_ca=pki.ca, tls_cert=pki.client_cert, tls_key=pki.client_key, user="ops", password=PASSWORD
    )
    await _round_trip(mtls_server.url, opts)


async def test_tls_client_never_speaks_plain_text_to_a_server_without_tls(plain_server: Server, pki: Pki) -> None:
    """Downgrade: a TLS-configured client meets a server (or impostor) without TLS. TLS-first makes
    it fail before the CONNECT that carries the password."""
    # The server's plain-text INFO line is not a TLS record: the handshake fails, nothing is sent.
    with pytest.raises(ssl.SSLError, match="WRONG_VERSION_NUMBER"):
        await _round_trip(plain_server.url, connect_options(tls_ca=pki.ca, user="ops", password=PASSWORD))


async def test_without_tls_first_the_same_client_would_talk_plain_text(plain_server: Server, pki: Pki) -> None:
    """Control for the downgrade test: nats-py's default (read INFO, upgrade only if asked) connects
    to the plain-text server with the same CA configured, i.e. sends the password in the clear."""
    await _round_trip(plain_server.url, connect_options(tls_ca=pki.ca, user="ops", password=PASSWORD, tls_first=False))
