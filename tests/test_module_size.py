"""The bus's house stays in rooms (#35): no module in events/ over 500 lines, and the bus's parts do not need `Bus`.

A module that grows past 500 lines is doing more than one job (events/bus.py did five in 1,586 lines:
setup, publishing, reading, a durable consumer, the errors); split it by job. The parts of the bus
(events/bus/*.py) take the narrow connection they need (`Link`), so none imports the facade
`events.bus` itself: the facade imports them, and an import back would be a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EVENTS = ROOT / "events"
MAX_LINES = 500


def test_no_module_in_events_is_over_500_lines() -> None:
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in sorted(EVENTS.rglob("*.py"))}
    assert "events/follow.py" in sizes  # the walk found the package
    over = {path: n for path, n in sizes.items() if n > MAX_LINES}
    assert not over, f"modules of events/ over {MAX_LINES} lines (split them by job): {over}"


def _imported(path: Path) -> set[str]:
    """The modules `path` imports, absolute, with `from X import name` counted as X and X.name."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def test_the_bus_parts_do_not_import_the_facade() -> None:
    parts = sorted(p for p in (EVENTS / "bus").glob("*.py") if p.name != "__init__.py")
    assert {p.stem for p in parts} >= {"provision", "publish", "read", "reader", "errors"}
    back = {p.name: sorted(m for m in _imported(p) if m in ("events.bus", "events.bus.Bus")) for p in parts}
    assert not any(back.values()), f"parts of the bus importing events.bus (take a Link instead): {back}"
