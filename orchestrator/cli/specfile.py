"""Reading a JobSpec from a YAML or JSON file, with every problem reported at once.

The file is read up to schemas.jobspec.MAX_JOBSPEC_BYTES (1 MiB) and refused
past it before anything is parsed; the text and YAML bounds are
schemas.specinput's. Every way a spec can be wrong exits 2 (USAGE) with one
line, or with one line per problem of a readable spec.
"""

from __future__ import annotations

import sys
from pathlib import Path

from orchestrator.cli.errors import NOT_FOUND, USAGE, CliError
from schemas import InvalidJobSpec, JobSpec
from schemas.jobspec import MAX_JOBSPEC_BYTES, read_jobspec
from schemas.specinput import SpecInputError


def _read(path: str) -> bytes:
    """The file's bytes, at most one past the limit (so an oversized file or pipe is never read whole)."""
    if path == "-":
        return sys.stdin.buffer.read(MAX_JOBSPEC_BYTES + 1)
    p = Path(path)
    if not p.is_file():
        raise CliError(f"no such job spec file: {path}", NOT_FOUND)
    try:
        with p.open("rb") as f:
            return f.read(MAX_JOBSPEC_BYTES + 1)
    except OSError as e:
        raise CliError(f"cannot read job spec {path}: {e.strerror or e}", USAGE) from None


def load_jobspec(path: str) -> JobSpec:
    name = "<stdin>" if path == "-" else path
    try:
        return read_jobspec(_read(path), json=name.endswith(".json"))
    except SpecInputError as e:
        raise CliError(f"{name}: {e}", USAGE) from None
    except InvalidJobSpec as e:
        lines = "\n".join(f"  {p.path}: {p.message}" for p in e.problems)
        raise CliError(f"{path} has {len(e.problems)} problem(s):\n{lines}", USAGE) from None
