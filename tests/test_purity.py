"""The pure rooms import no IO, clock or randomness (DESIGN.md, rule of the rooms).

Nor any of the project's own packages outside them: the bus (`events`), the
node agent, the scheduler's shell, the CLI, the simulator, deploy or bench
all do IO or build on what does; the core may be imported by them, never the
other way round. Schemas, the lowest layer, import only schemas.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PURE = ["schemas", "orchestrator/core", "orchestrator/policies",
        "nodeagent/start_rules.py"]  # the agent's decisions, apart from its IO shell
FORBIDDEN = {"asyncio", "nats", "docker", "structlog", "time", "random", "datetime", "socket",
             "subprocess", "threading", "os", "pynvml", "uuid", "secrets"}


#: The project's top-level packages; of them the pure rooms may import only these (schemas: only schemas).
PROJECT = {"schemas", "events", "orchestrator", "nodeagent", "deploy", "bench", "tests"}
PURE_PACKAGES = ("schemas", "orchestrator.core", "orchestrator.policies")


def _modules(path: Path) -> set[str]:
    """Every module a file imports, dotted and absolute (relative imports resolved against its package)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                found.add(f"{base}.{node.module}" if node.module else base)
            elif node.module:
                found.add(node.module)
    return found


def _imports(path: Path) -> set[str]:
    return {m.split(".")[0] for m in _modules(path)}


def _inside(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def _pure_files() -> list[Path]:
    return [p for d in PURE if (ROOT / d).exists()
            for p in ([ROOT / d] if d.endswith(".py") else sorted((ROOT / d).rglob("*.py")))]


@pytest.mark.parametrize("path", _pure_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_pure_module_imports_no_io(path: Path) -> None:
    bad = _imports(path) & FORBIDDEN
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


@pytest.mark.parametrize("path", _pure_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_pure_module_imports_no_project_io_package(path: Path) -> None:
    rel = path.relative_to(ROOT)
    allowed = ("schemas",) if rel.parts[0] == "schemas" else PURE_PACKAGES
    bad = {m for m in _modules(path) if m.split(".")[0] in PROJECT and not _inside(m, allowed)}
    assert not bad, f"{rel} imports {sorted(bad)}: outside {', '.join(allowed)}"


def test_the_import_rule_sees_project_packages() -> None:
    core = ROOT / "orchestrator" / "core" / "model" / "state.py"
    assert {"msgspec", "schemas.events"} <= _modules(core)
    assert not _inside("orchestrator.scheduler.service", PURE_PACKAGES) and not _inside("orchestrator.cli.views", PURE_PACKAGES)
    assert not _inside("orchestrator.corex", PURE_PACKAGES) and _inside("orchestrator.core.model.plan", PURE_PACKAGES)


def test_pure_rooms_exist() -> None:
    assert (ROOT / "schemas").is_dir()
    assert _pure_files(), "no pure modules found"
