"""`corral examples DIR` (#31 point 1): the README's examples from the package, the worker self-contained."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.cli.conftest import corral

ROOT = Path(__file__).resolve().parents[2]


def test_examples_writes_every_example_and_a_worker_that_needs_no_corral(tmp_path: Path) -> None:
    dest = tmp_path / "examples"
    proc = corral("examples", str(dest))
    repo = sorted(p.relative_to(ROOT / "examples").as_posix() for p in (ROOT / "examples").rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts)
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == repo
    assert proc.stdout.splitlines() == [str(dest / rel) for rel in sorted(repo)]
    for rel in repo:
        if rel != "worker.py":
            assert (dest / rel).read_bytes() == (ROOT / "examples" / rel).read_bytes(), rel
    # The worker is the toy worker's own source: it runs without corral importable (-I -S: no site-packages).
    assert (dest / "worker.py").read_bytes() == (ROOT / "orchestrator" / "demo_worker.py").read_bytes()
    run = subprocess.run([sys.executable, "-I", "-S", str(dest / "worker.py"), "--steps", "3", "--step-ms", "1"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert run.returncode == 0 and "done at step 3" in run.stdout, (run.stdout, run.stderr)


def test_examples_never_overwrites_a_changed_file_without_force(tmp_path: Path) -> None:
    dest = tmp_path / "ex"
    corral("examples", str(dest))
    corral("examples", str(dest))  # the same files again: nothing lost, fine
    (dest / "jobs" / "train.yaml").write_text("name: mine\n")
    refused = corral("examples", str(dest), check=2)
    assert "jobs/train.yaml" in refused.stderr and "--force" in refused.stderr
    assert (dest / "jobs" / "train.yaml").read_text() == "name: mine\n"
    corral("examples", str(dest), "--force")
    assert (dest / "jobs" / "train.yaml").read_bytes() == (ROOT / "examples" / "jobs" / "train.yaml").read_bytes()


def test_examples_in_a_checkout_is_a_no_op() -> None:
    proc = corral("examples")  # (the in-process CLI runs in the checkout's root: examples/ is the package's)
    assert proc.stdout == "" and "nothing to write" in proc.stderr
