"""`corral logs [-f]` (#21 acceptance 4): the CLI, connected only to NATS, prints a worker's output that an
agent in another process and another working directory serves; large output comes in chunks; -f follows
a running worker until it ends. (Who may ask: tests/deploy/test_permissions.py, `request-logs`.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from events.server import NatsServer
from orchestrator.cli.errors import NOT_FOUND, USAGE
from schemas.logs import LOG_CHUNK
from tests.cli.conftest import assert_one_line_error, corral, corral_json
from tests.integration.harness import CORRAL

LINES = 40
#: A first line longer than several chunks: the agent sends it in pieces, the CLI joins them.
BIG = "x" * (3 * LOG_CHUNK + 123)
WORKER = (f"import time\nprint({BIG!r}, flush=True)\n"
          f"for i in range({LINES}):\n    print(f'line {{i}}', flush=True)\n    time.sleep(0.15)\n")


def _service(args: list[str], cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    cwd.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen([CORRAL, *args], cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "CORRAL_LOG_LEVEL": "info"})


@pytest.fixture
def services(nats_server: NatsServer, tmp_path: Path) -> Iterator[str]:
    url = nats_server.url
    procs = [
        _service(["scheduler", "--nats", url], tmp_path / "sched", tmp_path / "scheduler.log"),
        _service(["agent", "--nats", url, "--node-id", "n1", "--fake-gpus", "2", "--data-dir", "state"],
                 tmp_path / "elsewhere", tmp_path / "agent.log"),  # its logs: elsewhere/state/logs/
    ]
    try:
        yield url
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _status(url: str, job_id: str) -> str:
    return str(corral_json("job", job_id, url=url)["status"])


def test_logs_follow_a_running_worker_over_nats(services: str, tmp_path: Path) -> None:
    url = services
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({"name": "talker", "command": [sys.executable, str(script)]}))
    corral("submit", str(spec), "--id", "j-talk", url=url)
    deadline = time.monotonic() + 60
    while _status(url, "j-talk") != "running":
        assert time.monotonic() < deadline, "j-talk never ran"
        time.sleep(0.3)

    # From a third directory, with nothing but the NATS URL: follow while it runs.
    cli_dir = tmp_path / "cli"
    cli_dir.mkdir()
    follow = subprocess.run([CORRAL, "--nats", url, "logs", "j-talk", "-f"], cwd=cli_dir, capture_output=True,
                            text=True, timeout=90)
    assert follow.returncode == 0, follow.stderr
    expected = [BIG, *(f"line {i}" for i in range(LINES))]
    assert follow.stdout.splitlines() == expected
    assert _status(url, "j-talk") in ("running", "completed")  # -f returned once the worker ended

    # Afterwards the whole log again, and where it is.
    assert corral("logs", "j-talk", url=url).stdout.splitlines() == expected
    detail = corral_json("job", "j-talk", url=url)
    assert detail["rank_states"][0]["node_id"] == "n1"
    log_file = detail["rank_states"][0]["log"]
    assert (tmp_path / "elsewhere" / "state" / log_file).read_text().splitlines() == expected
    assert "corral logs j-talk" in corral("job", "j-talk", url=url).stdout

    assert_one_line_error(corral("logs", "j-talk", "--rank", "3", url=url, check=None), USAGE)
    assert_one_line_error(corral("logs", "j-nobody", url=url, check=None), NOT_FOUND)
    assert_one_line_error(corral("logs", "j-talk", "--attempt", "2", url=url, check=None), NOT_FOUND)
