"""#31: without --nats or CORRAL_NATS_URL a command reads the default URL only if a corral cluster is there.

Another program's NATS server on the default port is named, and neither read ("(no jobs)") nor written (no
stream created on it). A real nats-server stands in for it; the default URL is pointed at it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import nats
import nats.js.errors
import pytest

from events.bus import Bus
from events.server import NatsServer
from orchestrator.cli import connect
from orchestrator.cli.errors import UNREACHABLE
from tests.cli.conftest import assert_one_line_error, corral


@pytest.fixture
def default_is(nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The default URL is `nats_server`'s; nobody names one."""
    monkeypatch.setattr(connect, "DEFAULT_NATS_URL", nats_server.url)
    monkeypatch.delenv("CORRAL_NATS_URL", raising=False)
    yield nats_server.url


async def _has_stream(url: str) -> bool:
    nc = await nats.connect(url)
    try:
        await nc.jetstream().stream_info("CORRAL")
        return True
    except nats.js.errors.NotFoundError:
        return False
    finally:
        await nc.close()


def test_a_server_without_a_corral_cluster_is_named_not_read(default_is: str) -> None:
    for args in (["jobs"], ["nodes"], ["tail", "--no-follow"]):
        proc = corral(*args, check=None, env={"CORRAL_NATS_URL": None})
        err = assert_one_line_error(proc, UNREACHABLE)
        assert f"the default NATS URL {default_is} (no --nats, no CORRAL_NATS_URL) reached " in err, err
        assert "nats-server" in err and "holds no corral cluster: it has no CORRAL stream" in err, err
        assert proc.stdout == ""
    assert not asyncio.run(_has_stream(default_is)), "a look at another program's server wrote a stream to it"
    # Named explicitly, the same server is used as told (a new cluster: the stream is created).
    corral("jobs", "--nats", default_is, env={"CORRAL_NATS_URL": None})
    assert asyncio.run(_has_stream(default_is))


def test_a_corral_cluster_at_the_default_url_is_read(default_is: str) -> None:
    async def create() -> None:
        await (await Bus.connect(default_is)).close()

    asyncio.run(create())
    proc = corral("jobs", env={"CORRAL_NATS_URL": None})
    assert proc.stdout.strip() == "(no jobs)" and proc.stderr == ""
