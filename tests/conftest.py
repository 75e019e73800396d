"""Shared fixtures: a REAL nats-server per test (never a mock), on a free loopback port.

Each test gets its own server and store under tmp_path, so tests never see
each other's streams; starting one takes ~50 ms.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from events.bus import Bus
from events.server import NatsServer


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A running nats-server with JetStream; `.url`, `.data_dir`, `.restart()`, `.kill()`."""
    server = NatsServer(tmp_path / "nats").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def bus(nats_server: NatsServer) -> AsyncIterator[Bus]:
    """A Bus on `nats_server` with the CORRAL stream created."""
    b = await Bus.connect(nats_server.url)
    try:
        yield b
    finally:
        await b.close()
