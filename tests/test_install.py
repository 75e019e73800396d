"""A user's install (#21 acceptance 1): a wheel, not editable, in a fresh venv, used from a directory
outside the checkout.

The wheel is built from a copy of what the package is made of (so the build writes nothing into the
checkout), then installed into a venv made empty (`--without-pip`; this interpreter's pip installs into
it) with the exact versions of constraints.txt (from PyPI, or pip's cache). From an
unrelated temp directory: `corral --version`, `corral sim` without the `sim` extra (exit 2 and the
install hint), `corral up --demo` to the end with every job completed and, while it runs, with the extra
installed, `corral sim gen` and `corral sim --policy all`. Nothing of the checkout is importable there: PYTHONPATH
is dropped, and the test checks that the venv's corral is the installed one.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
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
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)
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


def test_a_wheel_in_a_fresh_venv_runs_the_demo_and_the_simulator_from_anywhere(tmp_path: Path) -> None:
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

    # 2. --version, from the installed metadata.
    assert run([corral, "--version"], home, env).stdout == f"corral {version}\n"

    # 3. Without the sim extra: one line, exit 2, what to install.
    hint = run([corral, "sim", "--trace", "t.csv", "--cluster", "c.yaml"], home, env, check=2)
    assert hint.stderr.count("\n") == 1 and "pip install 'corral[sim]'" in hint.stderr, hint.stderr

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
