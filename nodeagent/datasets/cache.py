"""This node's dataset cache: one directory per cache key, present only complete and verified.

Layout under the cache root:

    <key>/data/         the dataset (what a job sees)
    <key>/entry.json    its size and source; its mtime is when a job last used it (LRU)
    .tmp/<key>.<rand>/  a staging in progress, or an eviction being deleted

An entry is made by staging into `.tmp/` and renaming the finished directory to
`<key>` (one rename on one file system: atomic), so a process killed at any
point leaves either no `<key>` or a whole one; `reconcile` (on agent start)
deletes whatever `.tmp/` holds and any `<key>` without its entry.json. Eviction
renames an entry back into `.tmp/` before deleting it, for the same reason.

Blocking file operations: the stager calls them in a thread or between awaits.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from nodeagent.datasets.fetch import StagingError

TMP = ".tmp"
META = "entry.json"
DATA = "data"
_KEY_RE = re.compile(r"(sha256|src)-[0-9a-f]{32,64}")


class CacheFull(StagingError):
    """The cache cannot make room: what is left is in use by jobs on this node."""


@dataclass(frozen=True)
class Entry:
    key: str
    size_bytes: int
    #: Wall clock of its last use (mtime of entry.json).
    last_used: float
    path: Path


class DatasetCache:
    def __init__(self, root: Path, limit_bytes: int = 0) -> None:
        self.root = root
        #: 0: no limit.
        self.limit_bytes = limit_bytes

    @property
    def tmp(self) -> Path:
        return self.root / TMP

    def reconcile(self) -> list[str]:
        """Delete what a killed process left (partial stagings, half-deleted or unreadable entries); say what."""
        self.root.mkdir(parents=True, exist_ok=True)
        removed = []
        if self.tmp.exists():
            for p in self.tmp.iterdir():
                removed.append(f"{TMP}/{p.name}")
                _remove(p)
        for p in self.root.iterdir():  # (names that are no cache key are not ours: left alone)
            if _KEY_RE.fullmatch(p.name) and self._entry(p) is None:
                removed.append(p.name)
                _remove(p)
        self.tmp.mkdir(exist_ok=True)
        return removed

    def entries(self) -> list[Entry]:
        """Every complete entry, least recently used first."""
        if not self.root.exists():
            return []
        found = [e for p in self.root.iterdir() if p.name != TMP and (e := self._entry(p)) is not None]
        return sorted(found, key=lambda e: (e.last_used, e.key))

    def get(self, key: str) -> Entry | None:
        return self._entry(self.root / key)

    def used_bytes(self) -> int:
        return sum(e.size_bytes for e in self.entries())

    def temp_dir(self, key: str) -> Path:
        """A new empty staging directory for `key`; the dataset goes into its `data/`."""
        self.tmp.mkdir(parents=True, exist_ok=True)
        d = Path(tempfile.mkdtemp(prefix=f"{key}.", dir=self.tmp))
        (d / DATA).mkdir()
        return d

    def commit(self, staged: Path, key: str, size_bytes: int, source: str) -> Entry:
        """Make the finished, verified staging directory the entry for `key` (atomically)."""
        (staged / META).write_text(json.dumps({"key": key, "size_bytes": size_bytes, "source": source}))
        final = self.root / key
        try:
            os.rename(staged, final)
        except OSError:
            if self.get(key) is None:
                raise
            _remove(staged)  # staged twice (two attempts at once): the first one stays
        entry = self.get(key)
        assert entry is not None
        return entry

    def discard(self, staged: Path) -> None:
        """Delete a staging directory that will not become an entry (failed, stopped)."""
        _remove(staged)

    def touch(self, key: str) -> None:
        """Mark `key` used now (LRU order)."""
        now = time.time()
        try:
            os.utime(self.root / key / META, (now, now))
        except FileNotFoundError:
            pass

    def evict(self, key: str) -> Entry | None:
        """Remove `key`'s entry; moved into `.tmp/` first, so a kill mid-delete leaves no half entry."""
        entry = self.get(key)
        if entry is None:
            return None
        self.tmp.mkdir(parents=True, exist_ok=True)
        doomed = Path(tempfile.mkdtemp(prefix=f"{key}.evicted.", dir=self.tmp))
        os.rename(self.root / key, doomed / key)
        _remove(doomed)
        return entry

    def room_for(self, need: int, in_use: Collection[str]) -> list[Entry]:
        """The least recently used entries no job uses whose eviction leaves `need` bytes free under the
        limit (to be evicted by the caller); raises CacheFull when even all of them would not do."""
        if not self.limit_bytes:
            return []
        entries = self.entries()
        used = sum(e.size_bytes for e in entries)
        if used + need <= self.limit_bytes:
            return []
        out: list[Entry] = []
        for e in entries:
            if e.key in in_use:
                continue
            out.append(e)
            used -= e.size_bytes
            if used + need <= self.limit_bytes:
                return out
        busy = sum(e.size_bytes for e in entries if e.key in in_use)
        raise CacheFull(f"the dataset cache is full: {need} bytes needed, limit {self.limit_bytes} "
                        f"(--dataset-cache-bytes), {busy} bytes in use by jobs on this node")

    def room_on_disk(self, need: int, in_use: Collection[str], *, margin: int = 0) -> list[Entry]:
        """The least recently used entries no job uses whose eviction frees `need` (+ `margin`) bytes on the
        disk that holds the cache (limit or not); raises CacheFull when even all of them would not."""
        free = shutil.disk_usage(self.root).free
        if free >= need + margin:
            return []
        out: list[Entry] = []
        for e in self.entries():
            if e.key in in_use:
                continue
            out.append(e)
            free += e.size_bytes
            if free >= need + margin:
                return out
        raise CacheFull(f"no room on the disk of the dataset cache ({self.root}): {need} bytes needed, "
                        f"{shutil.disk_usage(self.root).free} free, the rest in use by jobs on this node")

    def unused(self, in_use: Collection[str]) -> list[Entry]:
        """Every entry no job uses, least recently used first."""
        return [e for e in self.entries() if e.key not in in_use]

    def _entry(self, p: Path) -> Entry | None:
        if not _KEY_RE.fullmatch(p.name):
            return None
        meta = p / META
        try:
            info = json.loads(meta.read_text())
            st = meta.stat()
        except (OSError, ValueError):
            return None
        if not isinstance(info, dict) or info.get("key") != p.name or not (p / DATA).is_dir():
            return None
        size = info.get("size_bytes")
        return Entry(key=p.name, size_bytes=size if isinstance(size, int) else 0, last_used=st.st_mtime,
                     path=p / DATA)


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def tree_bytes(root: Path) -> int:
    """Bytes of the regular files under `root` (an entry's size)."""
    total = 0
    for d, _, files in os.walk(root):
        for name in files:
            p = os.path.join(d, name)
            if os.path.isfile(p) and not os.path.islink(p):
                total += os.path.getsize(p)
    return total
