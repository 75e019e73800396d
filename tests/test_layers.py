"""The layers in pyproject.toml's import-linter contracts hold (#22): every test run checks them.

schemas < events < the pure core < the services (scheduler, agent, simulator) < the CLI; the
scheduler and the agent never import each other. `lint-imports` reads the whole import graph,
indirect imports included, so a shortcut through a third module is caught too.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept() -> None:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe, "lint-imports is not installed: `make` installs it with the dev extra (import-linter)"
    done = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def _contract(name: str) -> dict[str, object]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    found = [c for c in config["tool"]["importlinter"]["contracts"] if c["name"] == name]
    assert len(found) == 1, f"no contract named {name!r} in pyproject.toml"
    return found[0]


def test_the_engine_list_of_the_core_contracts_is_every_engine_module() -> None:
    """model < policies < engine is written as forbidden lists: a new engine module must join them."""
    engine = {f"orchestrator.core.{p.stem}" for p in (ROOT / "orchestrator/core").glob("*.py") if p.stem != "__init__"}
    model = _contract("the core's model imports neither the policies nor the engine")
    policies = _contract("the policies import the core's model, not its engine")
    assert set(model["forbidden_modules"]) == engine | {"orchestrator.policies"}  # type: ignore[arg-type]
    assert set(policies["forbidden_modules"]) == engine  # type: ignore[arg-type]


def test_no_arrow_runs_up_from_the_core_or_the_policies() -> None:
    """Every module of orchestrator/ above the pure core is forbidden to it (a new one must join the list)."""
    above = {f"orchestrator.{p.stem}" for p in (ROOT / "orchestrator").iterdir()
             if p.stem not in {"core", "policies", "__init__", "__pycache__", "py"}
             and (p.suffix == ".py" or (p / "__init__.py").exists())}
    forbidden = set(_contract("the pure core imports no IO, clock, randomness, nor any project IO package")
                    ["forbidden_modules"])  # type: ignore[arg-type]
    assert above - forbidden == set(), f"add to the pure core's contract: {sorted(above - forbidden)}"
    assert {"events", "nodeagent"} <= forbidden
