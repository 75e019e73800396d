r"""Digests that make a dataset content-addressed: sha256 of an archive's bytes, or of a directory's manifest.

The manifest of a directory is one line per regular file, sorted by path:
`<sha256 hex> <size> <path relative to the directory, / separated>\n`; its
sha256 is the directory's digest (empty directories and file modes do not
count). `sha256sum`-style tools can rebuild it, so a user can compute the
digest to put in a spec without corral:

    cd DIR && find . -type f | LC_ALL=C sort | sed 's|^\./||' | while read -r f; do
      printf '%s %s %s\n' "$(sha256sum < "$f" | cut -d' ' -f1)" "$(stat -c %s "$f")" "$f"; done | sha256sum
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

CHUNK = 1 << 20


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def manifest(root: Path) -> bytes:
    """The manifest of the directory `root` (see the module's docstring)."""
    lines = []
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for name in files:
            p = Path(d) / name
            if p.is_file():
                rel = p.relative_to(root).as_posix()
                lines.append(f"{file_sha256(p)} {p.stat().st_size} {rel}\n")
    return "".join(sorted(lines, key=lambda ln: ln.split(" ", 2)[2])).encode("utf-8", "surrogateescape")


def manifest_digest(root: Path) -> str:
    return hashlib.sha256(manifest(root)).hexdigest()
