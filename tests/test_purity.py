"""The pure rooms import no IO, clock or randomness (DESIGN.md, rule of the rooms)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PURE = ["schemas", "orchestrator/core", "orchestrator/policies"]
FORBIDDEN = {"asyncio", "nats", "docker", "structlog", "time", "random", "datetime", "socket",
             "subprocess", "threading", "os", "pynvml", "uuid", "secrets"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def _pure_files() -> list[Path]:
    return [p for d in PURE if (ROOT / d).exists() for p in sorted((ROOT / d).rglob("*.py"))]


@pytest.mark.parametrize("path", _pure_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_pure_module_imports_no_io(path: Path) -> None:
    bad = _imports(path) & FORBIDDEN
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_pure_rooms_exist() -> None:
    assert (ROOT / "schemas").is_dir()
    assert _pure_files(), "no pure modules found"
