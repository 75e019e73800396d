"""The layers in pyproject.toml's import-linter contracts hold (#22): every test run checks them.

schemas < events < the pure core < the services (scheduler, agent, simulator) < the CLI; the
scheduler and the agent never import each other. `lint-imports` reads the whole import graph,
indirect imports included, so a shortcut through a third module is caught too.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept() -> None:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe, "lint-imports is not installed: `make` installs it with the dev extra (import-linter)"
    done = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout
