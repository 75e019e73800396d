"""A local dataset's fingerprint, taken at submit: an edited directory is a new cache entry (#41).

A dataset from a local path without a digest was cached by its path alone, so
after a user edited a file the next jobs read the old copy. Hashing the
content at every submit would cost a read of the whole dataset; a fingerprint
of what `stat` says costs one `lstat` per file: sha256 over one line per
entry, sorted by relative path,

    <relative path> NUL <file type> NUL <size> NUL <mtime_ns> NUL <ctime_ns> LF

(directories count by their entries; a symlink by its own stat). Any write,
truncate, rename, added or removed file changes it (ctime moves even when a
tool puts mtime back). Bounded: a tree of more than MAX_ENTRIES entries is not
fingerprinted (a note says so; give it a digest), so a submit never walks
millions of files.

The submitter fills `Dataset.fingerprint` in (`with_fingerprints`); the cache
key then names the source *and* that fingerprint (schemas/datasets.py), so
the nodes stage the edited content afresh, and a job still running on the old
copy keeps it. It reads the path as the submitter sees it: a path this machine
cannot read is left as it was (cached by path), with a note.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import msgspec

from schemas import JobSpec
from schemas.datasets import Dataset, source_scheme

#: Most files and directories a fingerprint walks (about a second of `lstat` on a local disk).
MAX_ENTRIES = 200_000


class TooManyEntries(Exception):
    pass


def fingerprint(path: Path, max_entries: int = MAX_ENTRIES) -> str:
    """`stat:<hex>` of the file or directory `path` (module docstring); raises OSError when it cannot be read,
    TooManyEntries past `max_entries`."""
    h = hashlib.sha256()
    top = os.lstat(path)
    if not stat.S_ISDIR(top.st_mode):
        h.update(_line(".", top))
        return f"stat:{h.hexdigest()}"
    lines: list[bytes] = []

    def fail(e: OSError) -> None:
        raise e

    for d, dirs, files in os.walk(path, onerror=fail):
        for name in [*dirs, *files]:
            p = os.path.join(d, name)
            lines.append(_line(os.path.relpath(p, path), os.lstat(p)))
            if len(lines) > max_entries:
                raise TooManyEntries(f"more than {max_entries} files")
    for line in sorted(lines):
        h.update(line)
    return f"stat:{h.hexdigest()}"


def _line(rel: str, st: os.stat_result) -> bytes:
    kind = stat.S_IFMT(st.st_mode)
    size = st.st_size if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode) else 0
    text = f"{rel}\0{kind}\0{size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\n"
    return text.encode("utf-8", "surrogateescape")


def with_fingerprints(spec: JobSpec, max_entries: int = MAX_ENTRIES) -> tuple[JobSpec, list[str]]:
    """`spec` with each local dataset that has neither digest nor fingerprint fingerprinted, and a note for each
    one that could not be (it stays cached by its path: an edit to it is not seen)."""
    notes: list[str] = []
    out: list[Dataset] = []
    for ds in spec.dataset_list:
        if ds.digest or ds.fingerprint or source_scheme(ds.source) != "file":
            out.append(ds)
            continue
        path = Path(ds.source.removeprefix("file://"))
        why = ""
        try:
            ds = msgspec.structs.replace(ds, fingerprint=fingerprint(path, max_entries))
        except TooManyEntries as e:
            why = str(e)
        except OSError as e:
            why = f"cannot read it here: {e.strerror or e}"
        if why:
            notes.append(f"dataset {ds.name}: {ds.source} not fingerprinted ({why}): nodes that cached it keep "
                         f"their copy even if it changes; give it a digest, or `corral datasets evict {ds.name}` "
                         "after an edit")
        out.append(ds)
    if not out or all(a is b for a, b in zip(out, spec.dataset_list, strict=True)):
        return spec, notes
    return msgspec.structs.replace(spec, datasets=tuple(out)), notes
