"""Tables go through rich on a terminal; a pipe gets the plain table and `--json` stays byte-identical (#21).

The CLI runs as a subprocess whose stdout is a real pseudo-terminal, or in-process writing to a pipe-like
stream, reading a simulated log (`--log`), so no NATS is needed.
"""

from __future__ import annotations

import os
import pty
import re
import subprocess
from pathlib import Path

import pytest

from orchestrator.cli.sim import main as sim_main
from tests.cli.conftest import CORRAL, ROOT, corral
from tests.terminal import drain

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("richlog")
    trace, cluster = d / "t.csv", d / "c.yaml"
    assert sim_main(["gen", "--nodes", "3", "--queues", "2", "--jobs", "20", "--seed", "1", "--out", str(trace),
                     "--cluster-out", str(cluster)]) == 0
    assert sim_main(["--trace", str(trace), "--cluster", str(cluster), "--policy", "fifo", "--out", str(d / "out"),
                     "--no-figures"]) == 0
    return d / "out" / "events-fifo.jsonl"


def run(args: list[str], *, tty: bool) -> str:
    """stdout of `corral ARGS`, written to a terminal (a subprocess on a pty) or to a pipe (in-process: not a
    terminal either); CR LF of the terminal made LF."""
    terminal: dict[str, str | None] = {"COLUMNS": "160", "TERM": "xterm-256color", "NO_COLOR": None}
    if not tty:
        return corral(*args, env=terminal).stdout
    env = {**os.environ, **terminal}
    env.pop("NO_COLOR")
    master, slave = pty.openpty()
    with subprocess.Popen([*CORRAL, *args], stdout=slave, stderr=subprocess.PIPE, env=env, cwd=ROOT) as p:
        os.close(slave)
        out = drain(master)
        assert p.wait(60) == 0, p.stderr.read() if p.stderr else ""
    os.close(master)
    return out.decode().replace("\r\n", "\n")


@pytest.mark.parametrize("command", ["nodes", "queues", "jobs"])
def test_a_terminal_gets_a_rich_table_a_pipe_the_plain_one(command: str, log: Path) -> None:
    args = [command, "--log", str(log)] + (["--all"] if command == "jobs" else [])
    plain = run(args, tty=False)
    drawn = run(args, tty=True)
    assert "\x1b[1m" in drawn and "─" in drawn, drawn  # bold headers over a rule
    assert "\x1b" not in plain and "─" not in plain
    header = plain.splitlines()[0].split()
    assert ANSI.sub("", drawn).split()[: len(header)] == header  # the same columns
    cells = {c for line in plain.splitlines()[1:] for c in line.split()}
    assert cells <= set(ANSI.sub("", drawn).split()), "a cell of the plain table is missing from the rich one"


def test_json_is_the_same_on_a_terminal(log: Path) -> None:
    for command in ("nodes", "queues", "jobs"):
        args = [command, "--log", str(log), "--json"]
        assert run(args, tty=True) == run(args, tty=False)
