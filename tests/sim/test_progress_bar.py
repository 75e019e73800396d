"""`corral sim` shows a progress bar with jobs/s on stderr when stderr is a terminal, and plain lines otherwise (#21).

The CLI runs as a subprocess whose stderr is a real pseudo-terminal (or a pipe), so the check is the
one a user's terminal makes: `isatty`.
"""

from __future__ import annotations

import argparse
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

from orchestrator.cli.sim import main
from orchestrator.cli.simrun import scenario_of
from orchestrator.sim.runs import run_policies
from tests.terminal import drain

ROOT = Path(__file__).resolve().parents[2]


def _trace(tmp_path: Path) -> tuple[Path, Path]:
    trace, cluster = tmp_path / "t.csv", tmp_path / "c.yaml"
    assert main(["gen", "--nodes", "4", "--queues", "2", "--jobs", "80", "--seed", "3", "--out", str(trace),
                 "--cluster-out", str(cluster)]) == 0
    return trace, cluster


def _sim(tmp_path: Path, *, tty: bool) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of `corral sim` on a tiny trace, stderr a terminal or a pipe."""
    trace, cluster = _trace(tmp_path)
    argv = [sys.executable, "-m", "orchestrator.cli", "sim", "--trace", str(trace), "--cluster", str(cluster),
            "--policy", "corral,fifo", "--out", str(tmp_path / "out"), "--no-figures"]
    env = {**os.environ, "COLUMNS": "120", "TERM": "xterm-256color"}
    if not tty:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
        return proc.returncode, proc.stdout, proc.stderr
    master, slave = pty.openpty()
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=slave, env=env, cwd=ROOT) as p:
        os.close(slave)
        err = drain(master)
        out = p.stdout.read() if p.stdout else b""
        rc = p.wait(120)
    os.close(master)
    return rc, out.decode(), err.decode(errors="replace")


def test_a_terminal_gets_a_bar_per_policy_with_jobs_per_second(tmp_path: Path) -> None:
    rc, out, raw = _sim(tmp_path, tty=True)
    assert rc == 0, raw
    assert "\x1b[" in raw  # drawn for a terminal
    err = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", raw)
    assert "━" in err and "jobs/s" in err and "/80 jobs" in err, err[-2000:]
    for policy in ("corral", "fifo"):
        assert f"{policy}: 80 jobs completed" in err, err[-2000:]  # each summary line is kept above the bars
    assert "\x1b" not in out and "jobs simulated / s" in out  # the table on stdout is plain


def test_a_pipe_gets_plain_lines_only(tmp_path: Path) -> None:
    rc, _out, err = _sim(tmp_path, tty=False)
    assert rc == 0, err
    lines = err.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == ["corral", "fifo"], err
    assert "\x1b" not in err and "━" not in err


def test_advance_counts_finished_jobs_up_to_all_of_them(tmp_path: Path) -> None:
    trace, cluster = _trace(tmp_path)
    scenario = scenario_of(argparse.Namespace(trace=str(trace), cluster=str(cluster), outages=None, from_log=None))
    seen: list[tuple[str, int]] = []
    run_policies(scenario, ["fifo"], write_logs=False, figures=False, advance=lambda p, n: seen.append((p, n)))
    counts = [n for _, n in seen]
    assert counts == sorted(set(counts)) and counts[-1] == len(scenario.jobs) == 80  # rises, never repeats
    assert {p for p, _ in seen} == {"fifo"}
