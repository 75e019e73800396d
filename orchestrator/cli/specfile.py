"""Reading a JobSpec from a YAML or JSON file, with every problem reported at once."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

from orchestrator.cli.errors import NOT_FOUND, USAGE, CliError
from schemas import InvalidJobSpec, JobSpec, parse_jobspec


def _load(path: str) -> Any:
    if path == "-":
        text, name = sys.stdin.read(), "<stdin>"
    else:
        p = Path(path)
        if not p.is_file():
            raise CliError(f"no such job spec file: {path}", NOT_FOUND)
        text, name = p.read_text(), path
    try:
        if name.endswith(".json"):
            return json.loads(text)
        return yaml.safe_load(text)  # YAML is a superset of JSON: stdin may be either
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        where = ""
        mark = getattr(e, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        elif isinstance(e, json.JSONDecodeError):
            where = f" at line {e.lineno}, column {e.colno}"
        problem = e.msg if isinstance(e, json.JSONDecodeError) else getattr(e, "problem", None) or str(e)
        raise CliError(f"{name} is not valid YAML/JSON{where}: {problem}", USAGE) from None


def load_jobspec(path: str) -> JobSpec:
    try:
        return parse_jobspec(_load(path))
    except InvalidJobSpec as e:
        lines = "\n".join(f"  {p.path}: {p.message}" for p in e.problems)
        raise CliError(f"{path} has {len(e.problems)} problem(s):\n{lines}", USAGE) from None
