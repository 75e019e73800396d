"""Shared fixtures: a REAL nats-server per test (never a mock), on a free loopback port.

Each test gets its own server and store under tmp_path, so tests never see
each other's streams; starting one takes ~50 ms.

`make test` runs the suite on several pytest-xdist workers (`--dist loadgroup`): the hook below
keeps the tests that share an expensive fixture on one worker, and starts the slow ones first.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from _pytest.nodeid import NodeId

from events.bus import Bus
from events.server import NatsServer


@pytest.hookimpl(wrapper=True)  # around xdist's own hook (see the end)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> Iterator[None]:
    """Under xdist, a session- or module-scoped fixture of these tests is set up once per worker that runs one
    of its tests: the tests that share one (the CLI's `corral up` cluster, a secured server, a generated log)
    form an `xdist_group` by the widest such fixture, so it is built once per run. The `slow` ones (a minute
    or two, mostly waiting on processes) go first, so the run does not end waiting on one started last.
    The order is the same on every worker, as xdist requires."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        ours = [d for defs in (info.name2fixturedefs.values() if info else ()) for d in defs
                if d.scope in ("session", "module") and d.func.__module__.startswith("tests.")]
        if ours:  # named after where the fixture is defined: a conftest's directory, or the test module
            item.add_marker(pytest.mark.xdist_group(min(ours, key=lambda d: d.scope != "session").baseid))
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    yield
    # xdist 3.8 tells the scheduler a test's group by a suffix on its node id (`nodeid@group`), set through
    # `item._nodeid`, which pytest 9 no longer reads (a node id is `item._id`): without this, nothing groups.
    if getattr(config.option, "loadgroup", False):  # set on xdist's workers only
        for item in items:
            mark = item.get_closest_marker("xdist_group")
            if mark is not None and "@" not in item.nodeid:
                item._id = NodeId.parse(f"{item.nodeid}@{mark.args[0]}")  # type: ignore[attr-defined]


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
