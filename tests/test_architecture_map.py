"""README's "Where each decision lives" names real places: every `path.py`: `name` in it exists.

The map is the newcomer's one hop to the code; a rename that forgets it fails here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTION = re.compile(r"### Where each decision lives\n(.*?)\n## ", re.S)
#: `path/to/module.py`: followed by one or more `name`s (`Class.method` allowed), up to the next path.
PLACE = re.compile(r"`([\w/]+\.py)`(?::\s*)?((?:[^`|]*`[\w.]+`)*)")
NAME = re.compile(r"`([\w.]+)`")


def _defined(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        if isinstance(node, ast.ClassDef):
                names.update(f"{node.name}.{m.name}" for m in node.body
                             if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef))
    return names


def test_every_place_in_the_map_exists() -> None:
    found = SECTION.search((ROOT / "README.md").read_text())
    assert found, "README.md has no 'Where each decision lives' section"
    checked = 0
    for row in found.group(1).splitlines():
        if not row.startswith("| ") or "Module: function" in row:
            continue
        cell = row.split("|")[2]
        for path, names in PLACE.findall(cell):
            module = ROOT / path
            assert module.is_file(), f"README's map names {path}, which does not exist"
            defined = _defined(module)
            for name in NAME.findall(names):
                assert name in defined, f"README's map names {path}: {name}, not defined there"
                checked += 1
    assert checked >= 30
