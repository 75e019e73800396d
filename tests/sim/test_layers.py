"""The simulator library never imports the CLI (#22): `corral sim` lives in orchestrator/cli/sim.py and calls it.

The one exception is the `python -m orchestrator.sim` alias, an entry point no library module imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SIM = Path(__file__).resolve().parents[2] / "orchestrator" / "sim"
ALIAS = SIM / "__main__.py"


def imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


@pytest.mark.parametrize("path", sorted(p for p in SIM.rglob("*.py") if p != ALIAS), ids=lambda p: p.name)
def test_the_simulator_library_does_not_import_the_cli(path: Path) -> None:
    cli = sorted(m for m in imported_modules(path) if m == "orchestrator.cli" or m.startswith("orchestrator.cli."))
    assert not cli, f"orchestrator/sim/{path.name} imports {cli}"


def test_the_alias_is_only_the_cli_command() -> None:
    assert imported_modules(ALIAS) == {"__future__", "sys", "orchestrator.cli.sim"}
