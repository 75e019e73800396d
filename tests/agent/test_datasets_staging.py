"""Staging one dataset into the node's cache (nodeagent/datasets/): fetch, verify, rename, evict, reconcile.

Real sources: a directory, and archives served by `python -m http.server` on loopback. Every cache entry
is judged by the test's own checksum of its files (tests/dataset_source.py), never by the stager's word.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeagent.datasets.cache import CacheFull, DatasetCache
from nodeagent.datasets.fetch import StagingError, Stopped, stage
from schemas.datasets import Dataset
from tests.dataset_source import http_server, make_tar, make_tree, make_zip, tree_sum, unused_url

MB = 1 << 20


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, dict[str, str]]]:
    """A 4 MB tree, its tar and zip behind a real HTTP server: (base URL, tree, {name: sha256 of the archive})."""
    root = tmp_path_factory.mktemp("served")
    tree = root / "tree"
    make_tree(tree, 4 * MB)
    www = root / "www"
    www.mkdir()
    sums = {"set.tar": make_tar(tree, www / "set.tar"), "set.zip": make_zip(tree, www / "set.zip")}
    (www / "junk.tar").write_bytes(b"this is not an archive" * 100)
    with http_server(www) as url:
        yield url, tree, sums


def _stage(ds: Dataset, cache: DatasetCache) -> tuple[Path, int, list[tuple[int, int]]]:
    seen: list[tuple[int, int]] = []
    tmp = cache.temp_dir(ds.key)
    read = stage(ds, tmp / "data", lambda d, t: seen.append((d, t)), threading.Event())
    entry = cache.commit(tmp, ds.key, read, ds.source)
    return entry.path, read, seen


@pytest.mark.parametrize("name", ["set.tar", "set.zip"])
def test_an_archive_is_downloaded_verified_and_unpacked(served: tuple[str, Path, dict[str, str]], tmp_path: Path,
                                                        name: str) -> None:
    url, tree, sums = served
    cache = DatasetCache(tmp_path / "cache")
    ds = Dataset(name="d", source=f"{url}/{name}", mount="/d", digest=f"sha256:{sums[name]}")
    path, read, seen = _stage(ds, cache)
    assert tree_sum(path) == tree_sum(tree)
    assert read == os.path.getsize(tree.parent / "www" / name)
    assert seen[-1] == (read, read) and len(seen) > 2  # progress, ending at the archive's length
    assert path == tmp_path / "cache" / f"sha256-{sums[name]}" / "data"
    assert not list((tmp_path / "cache" / ".tmp").iterdir()), "nothing left behind"


def test_a_directory_is_copied_and_its_manifest_digest_checked(served: tuple[str, Path, dict[str, str]],
                                                               tmp_path: Path) -> None:
    _, tree, _ = served
    # The manifest digest as the docs define it, computed here independently of nodeagent/datasets/verify.py.
    lines = sorted(f"{hashlib.sha256(p.read_bytes()).hexdigest()} {p.stat().st_size} {p.relative_to(tree).as_posix()}\n"
                   for p in tree.rglob("*") if p.is_file())
    lines.sort(key=lambda ln: ln.split(" ", 2)[2])
    digest = hashlib.sha256("".join(lines).encode()).hexdigest()
    cache = DatasetCache(tmp_path / "cache")
    path, read, _ = _stage(Dataset(name="d", source=f"file://{tree}", mount="/d", digest=digest), cache)
    assert tree_sum(path) == tree_sum(tree) and read == 4 * MB
    wrong = Dataset(name="d", source=str(tree), mount="/d", digest="0" * 64)
    with pytest.raises(StagingError, match=f"digest mismatch: the manifest of {tree} hashes to sha256:{digest}"):
        _stage(wrong, cache)


def test_bad_sources_fail_with_a_reason_to_act_on(served: tuple[str, Path, dict[str, str]], tmp_path: Path) -> None:
    url, _, sums = served
    cache = DatasetCache(tmp_path / "cache")
    cases = {
        f"{url}/set.tar|{'1' * 64}": f"digest mismatch: {url}/set.tar hashes to sha256:{sums['set.tar']}, the spec "
                                     f"says sha256:{'1' * 64}",
        unused_url() + "|": "cannot fetch http://127.0.0.1:",
        f"{url}/missing.tar|": "HTTP 404",
        f"{url}/junk.tar|": "is not a readable tar or zip archive",
        f"{tmp_path}/nope|": f"source {tmp_path}/nope does not exist on this node",
    }
    for src_digest, says in cases.items():
        src, digest = src_digest.split("|")
        ds = Dataset(name="d", source=src, mount="/d", digest=digest)
        with pytest.raises(StagingError) as e:
            _stage(ds, cache)
        assert says in str(e.value), (src, str(e.value))
        assert cache.get(ds.key) is None, "a failed staging is never an entry"


def test_a_stop_gives_up_mid_download(served: tuple[str, Path, dict[str, str]], tmp_path: Path) -> None:
    url, _, _ = served
    stop = threading.Event()

    def progress(done: int, total: int) -> None:
        if done > MB:
            stop.set()

    with pytest.raises(Stopped):
        stage(Dataset(name="d", source=f"{url}/set.tar", mount="/d"), tmp_path / "data", progress, stop)


def test_reconcile_keeps_finished_entries_and_drops_partial_ones(served: tuple[str, Path, dict[str, str]],
                                                                 tmp_path: Path) -> None:
    url, tree, _ = served
    cache = DatasetCache(tmp_path / "cache")
    ds = Dataset(name="d", source=f"{url}/set.tar", mount="/d")
    path, _, _ = _stage(ds, cache)
    partial = cache.temp_dir("src-" + "0" * 32)  # a staging a killed agent left
    (partial / "data" / "half.bin").write_bytes(b"x" * 1000)
    broken = tmp_path / "cache" / ("src-" + "1" * 32)  # an entry without its entry.json
    (broken / "data").mkdir(parents=True)
    (tmp_path / "cache" / "notes.txt").write_text("not ours")  # not a cache key: left alone
    removed = DatasetCache(tmp_path / "cache").reconcile()
    assert sorted(removed) == sorted([f".tmp/{partial.name}", broken.name])
    assert [e.key for e in cache.entries()] == [ds.key] and tree_sum(path) == tree_sum(tree)
    assert (tmp_path / "cache" / "notes.txt").exists()


def test_room_is_made_by_evicting_the_least_recently_used_entry_no_job_uses(tmp_path: Path) -> None:
    cache = DatasetCache(tmp_path / "cache", limit_bytes=3000)
    keys = [f"src-{i:032d}" for i in range(3)]
    for i, key in enumerate(keys):
        tmp = cache.temp_dir(key)
        (tmp / "data" / "f").write_bytes(b"x" * 1000)
        cache.commit(tmp, key, 1000, f"/src/{i}")
        os.utime(tmp_path / "cache" / key / "entry.json", (time.time() - 100 + i, time.time() - 100 + i))
    cache.touch(keys[0])  # now the most recently used
    assert [e.key for e in cache.room_for(1000, in_use=set())] == [keys[1]]
    assert [e.key for e in cache.room_for(1000, in_use={keys[1]})] == [keys[2]]
    assert [e.key for e in cache.room_for(2000, in_use={keys[0]})] == [keys[1], keys[2]]
    with pytest.raises(CacheFull, match="the dataset cache is full: 2500 bytes needed, limit 3000"):
        cache.room_for(2500, in_use={keys[0], keys[1]})
    cache.evict(keys[1])
    assert [e.key for e in cache.entries()] == [keys[2], keys[0]]
    assert DatasetCache(tmp_path / "c2").room_for(10**12, in_use=set()) == []  # no limit
