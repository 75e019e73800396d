"""Fixtures for the node agent tests.

Docker tests need a real engine and a FROM-scratch busybox image built here
(no registry is reachable, nothing is ever pulled). Without an engine they
SKIP on a developer machine but FAIL when CI=true, so CI can never go green
by silently not running them (.ci/run installs docker.io + busybox-static and
starts dockerd).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

BUSYBOX_IMAGE = "corral-test-busybox:latest"
DOCKERFILE = 'FROM scratch\nCOPY busybox /bin/busybox\nRUN ["/bin/busybox", "--install", "-s", "/bin"]\n'


def docker_unavailable(why: str) -> NoReturn:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{why} -- CI=true, so Docker tests must run (see .ci/run)", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    try:
        import docker

        client = docker.from_env(timeout=30)
        client.ping()
    except Exception as e:
        docker_unavailable(f"no Docker engine reachable: {type(e).__name__}: {e}")
    yield client
    client.close()


@pytest.fixture(scope="session")
def busybox_image(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A FROM-scratch image holding only the static busybox (Debian: busybox-static)."""
    src = Path("/bin/busybox") if Path("/bin/busybox").exists() else Path(shutil.which("busybox") or "/nonexistent")
    if not src.exists():
        docker_unavailable("no busybox binary (apt-get install busybox-static)")
    ctx = tmp_path_factory.mktemp("busybox-image")
    shutil.copy2(src, ctx / "busybox")
    (ctx / "Dockerfile").write_text(DOCKERFILE)
    try:
        docker_client.images.build(path=str(ctx), tag=BUSYBOX_IMAGE, rm=True, pull=False)
        out = docker_client.containers.run(BUSYBOX_IMAGE, ["sh", "-c", "echo ok"], remove=True)
    except Exception as e:  # a dynamically linked busybox builds but cannot run FROM scratch
        docker_unavailable(f"cannot build/run {BUSYBOX_IMAGE} from {src} (static busybox needed): {e}")
    assert out.strip() == b"ok"
    return BUSYBOX_IMAGE


@pytest.fixture
def docker_node(docker_client: Any) -> Iterator[str]:
    """A node id unique to the test; every container labelled with it is removed afterwards."""
    node = f"t-{uuid.uuid4().hex[:10]}"
    yield node
    for c in docker_client.containers.list(all=True, filters={"label": [f"corral.node={node}"]}):
        c.remove(force=True)
