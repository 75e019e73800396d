"""A user's install (#21 acceptance 1): a wheel, not editable, in a fresh venv, used from a directory
outside the checkout.

The wheel is built from a copy of what the package is made of (so the build writes nothing into the
checkout), then installed into a venv made empty (`--without-pip`; this interpreter's pip installs into
it) with the exact versions of constraints.txt (from PyPI, or pip's cache). From an
unrelated temp directory: `corral --version`, `corral sim` without the `sim` extra (exit 2 and the
install hint), an s3:// dataset without the `s3` extra (the reason names it), `corral up --demo` to the end
with every job completed and, while it runs, with the extra installed, `corral sim gen` and
`corral sim --policy all`. Nothing of the checkout is importable there: PYTHONPATH
is dropped, and the test checks that the venv's corral is the installed one.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ("pyproject.toml", "README.md", "LICENSE", "schemas", "events", "orchestrator", "nodeagent")
#: pip's words for "could not reach an index" (the only reason this test may skip, and only outside CI).
OFFLINE = re.compile(r"NewConnectionError|Failed to establish a new connection|Temporary failure in name resolution|"
                     r"No matching distribution found|Could not find a version that satisfies")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def run(argv: list[str | Path], cwd: Path, env: dict[str, str], timeout: float = 300,
        check: int | None = 0) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout,
                          stdin=subprocess.DEVNULL)  # not the test runner's: `corral run` forwards its stdin
    if check is not None:
        assert proc.returncode == check, (
            f"{' '.join(map(str, argv))}: exit {proc.returncode}, expected {check}\n"
            f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}")
    return proc


def pip_install(python: Path, args: list[str | Path], cwd: Path, env: dict[str, str]) -> None:
    """`pip install` into the venv of `python` (this interpreter's pip, so the venv needs none of its own)."""
    proc = run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "-c", ROOT / "constraints.txt",
                *args], cwd, env, timeout=600, check=None)
    if proc.returncode != 0 and not os.environ.get("CI") and OFFLINE.search(proc.stderr):
        pytest.skip(f"no package index reachable here (CI runs this): {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr[-4000:]


@dataclass(frozen=True)
class Installed:
    """The wheel installed into a fresh venv, and a directory outside the checkout to use it from."""

    wheel: Path
    venv: Path
    python: Path
    corral: Path
    home: Path
    env: dict[str, str]
    version: str


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    tmp_path = tmp_path_factory.mktemp("install")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["CORRAL_LOG_LEVEL"] = "warning"
    src, wheels, venv, home = tmp_path / "src", tmp_path / "wheels", tmp_path / "venv", tmp_path / "elsewhere"
    home.mkdir()
    src.mkdir()
    for name in PACKAGE:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, src / name)
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]

    # 1. A wheel, and a fresh venv (not --system-site-packages) with it installed, not editable.
    proc = run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", wheels, src], home, env,
               timeout=600, check=None)
    if proc.returncode != 0 and not os.environ.get("CI") and OFFLINE.search(proc.stderr):
        pytest.skip(f"no package index reachable for the build backend (CI runs this): {proc.stderr[-300:]}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    (wheel,) = wheels.glob("corral-*.whl")
    run([sys.executable, "-m", "venv", "--without-pip", venv], home, env)
    python, corral = venv / "bin" / "python", venv / "bin" / "corral"
    pip_install(python, [wheel], home, env)
    where = run([python, "-c", "import orchestrator, orchestrator.demo_worker; print(orchestrator.__file__)"],
                home, env).stdout
    assert Path(where.strip()).is_relative_to(venv), f"corral imported from {where}, not the venv"
    return Installed(wheel, venv, python, corral, home, env, version)


def test_a_wheel_in_a_fresh_venv_runs_the_demo_and_the_simulator_from_anywhere(installed: Installed,
                                                                                 tmp_path: Path) -> None:
    wheel, python, corral, env, version = installed.wheel, installed.python, installed.corral, installed.env, \
        installed.version
    home = tmp_path / "elsewhere"
    home.mkdir()

    # 2. --version, from the installed metadata.
    assert run([corral, "--version"], home, env).stdout == f"corral {version}\n"

    # 3. Without the sim extra: one line, exit 2, what to install.
    hint = run([corral, "sim", "--trace", "t.csv", "--cluster", "c.yaml"], home, env, check=2)
    assert hint.stderr.count("\n") == 1 and "pip install 'corral[sim]'" in hint.stderr, hint.stderr
    # ... nor the s3 extra: an agent staging an s3:// dataset fails the attempt saying what to install (#33).
    s3 = run([python, "-c", "import threading, pathlib; from nodeagent.datasets.fetch import StagingError, stage; "
              "from schemas.datasets import Dataset\ntry: stage(Dataset(name='d', source='s3://b/k.tar', mount='/d'), "
              "pathlib.Path('s3'), lambda d, t: None, threading.Event())\nexcept StagingError as e: print(e)"],
             home, env)
    assert "s3:// sources need the optional extra corral[s3] on the agent (pip install 'corral[s3]')" in s3.stdout, s3

    # 4. The demo, to the end (it runs while step 5 installs the extra: the suite's time is short).
    with open(tmp_path / "demo.out", "w+") as out:
        demo = subprocess.Popen([str(corral), "up", "--demo", "--port", "0", "--duration", "400", "--data-dir",
                                 str(home / "demo")], stdout=out, stderr=subprocess.STDOUT, text=True, cwd=home,
                                env=env)
        try:
            # 5. With the sim extra: a trace and its cluster, every policy side by side with the figures.
            pip_install(python, [f"corral[sim] @ {wheel.as_uri()}"], home, env)
            run([corral, "sim", "gen", "--jobs", "100", "--out", "trace.csv", "--cluster-out", "cluster.yaml"], home,
                env)
            sim = run([corral, "sim", "--trace", "trace.csv", "--cluster", "cluster.yaml", "--policy", "all",
                       "--out", "out"], home, env)
            rc = demo.wait(450)
        finally:
            demo.kill()
            demo.wait()
        out.seek(0)
        told = out.read()
    assert {"corral", "fifo", "drf"} <= {p.stem.removeprefix("events-") for p in (home / "out").glob("events-*.jsonl")}
    assert len(list((home / "out").glob("*.png"))) == 4, sim.stdout[-2000:]
    # Every job completed: exit 0, the verdict says so, and no job failed.
    verdict = [line for line in told.splitlines() if line.startswith("demo: done")]
    assert rc == 0 and verdict and re.search(r"all \d+ jobs completed", verdict[0]), told[-3000:]
    assert "JobFailed" not in told, told[-3000:]


def test_a_new_users_first_jobs_run_where_they_were_submitted(installed: Installed, tmp_path: Path) -> None:
    """#31 acceptance 1: the README's path after `pip install`, corral started from a venv that is not on PATH
    (as pipx installs it): the examples, `corral up`, `corral run` from a project with every rank's output
    labelled and the job's exit status, the same worker from another directory seeing that directory and an
    exported variable, and an example job by the README's relative path."""
    env = {**installed.env, "PATH": "/usr/local/bin:/usr/bin:/bin"}  # the venv's bin is nowhere on it
    corral = installed.corral
    proj, other, upcwd = tmp_path / "proj", tmp_path / "other", tmp_path / "upcwd"
    for d in (proj, other, upcwd):
        d.mkdir()

    # 1. The examples ship in the package.
    run([corral, "examples"], proj, env)
    assert (proj / "examples" / "jobs" / "single-gpu.yaml").is_file() and (proj / "examples" / "worker.py").is_file()
    # ... and so do the dashboard and alert rules (#41): the checkout's deploy/monitoring/, byte for byte.
    run([corral, "monitoring", "--out", "mon"], proj, env)
    for name in ("prometheus-rules.yaml", "grafana-dashboard.json"):
        assert (proj / "mon" / name).read_bytes() == (ROOT / "deploy" / "monitoring" / name).read_bytes(), name

    # 2. `corral up` by the venv binary's path, from a directory of its own.
    with open(tmp_path / "up.err", "w") as err:
        up = subprocess.Popen([str(corral), "up", "--port", "0", "--nodes", "2", "--data-dir", str(tmp_path / "data")],
                              stdout=subprocess.PIPE, stderr=err, text=True, cwd=upcwd, env=env)
        try:
            assert up.stdout is not None
            first = up.stdout.readline()
            assert "NATS at " in first, (first, (tmp_path / "up.err").read_text()[-2000:])
            env["CORRAL_NATS_URL"] = first.split("NATS at ", 1)[1].split()[0]

            # 3. From the project: both ranks' output, labelled; the job's exit status (rank 1 exits 3).
            code = ("import os, sys; r = os.environ['RANK']; print('rank', r, 'in', os.getcwd()); "
                    "sys.exit(3 if r == '1' else 0)")
            ran = run([corral, "run", "-n", "2", "-g", "1", "--", "python", "-c", code], proj, env, check=3)
            assert sorted(ran.stdout.splitlines()) == [f"0: rank 0 in {proj}", f"1: rank 1 in {proj}"], ran

            # 4. The same worker from another directory: that directory, and the variable it exported.
            show = "import os; print('in', os.getcwd(), 'MYVAR', os.environ.get('MYVAR'), os.environ.get('OTHER'))"
            there = run([corral, "run", "--export", "MYVAR", "--", "python", "-c", show], other,
                        {**env, "MYVAR": "exported", "OTHER": "not-exported"})
            assert there.stdout == f"in {other} MYVAR exported None\n", there

            # 5. The README's example job by its relative path, from the project, to completion.
            run([corral, "submit", "examples/jobs/single-gpu.yaml", "--wait"], proj, env)
        finally:
            up.send_signal(signal.SIGINT)
            try:
                up.wait(60)
            except subprocess.TimeoutExpired:
                up.kill()
                up.wait()
