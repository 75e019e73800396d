"""Dataset sources for the staging tests (#33): random trees, their archives, a real HTTP server on loopback.

The checksums here are the tests' own (hashlib over the files), never the agent's code: a cache entry is
judged by what its files hold, not by what the stager says about them.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest


def make_tree(root: Path, total_bytes: int, files: int = 8, seed: int = 0) -> str:
    """`files` files of random (incompressible) bytes, `total_bytes` in all, in two directories; its tree_sum."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    each = total_bytes // files
    for i in range(files):
        d = root / ("a" if i % 2 else "b/c")
        d.mkdir(parents=True, exist_ok=True)
        (d / f"part-{i:03d}.bin").write_bytes(rng.randbytes(each))
    return tree_sum(root)


def tree_sum(root: Path) -> str:
    """One sha256 over every regular file's relative path and content: equal sums, equal trees."""
    h = hashlib.sha256()
    for p in sorted(q for q in root.rglob("*") if q.is_file()):
        h.update(p.relative_to(root).as_posix().encode() + b"\0")
        with open(p, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


def make_tar(tree: Path, out: Path) -> str:
    """A plain tar of `tree`'s content (paths relative to it); the sha256 of the archive's bytes."""
    with tarfile.open(out, "w") as tar:
        for p in sorted(tree.rglob("*")):
            tar.add(p, arcname=p.relative_to(tree).as_posix(), recursive=False)
    return hashlib.sha256(out.read_bytes()).hexdigest()


def make_zip(tree: Path, out: Path) -> str:
    import zipfile

    with zipfile.ZipFile(out, "w") as z:
        for p in sorted(tree.rglob("*")):
            if p.is_file():
                z.write(p, p.relative_to(tree).as_posix())
    return hashlib.sha256(out.read_bytes()).hexdigest()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_http_server(directory: Path) -> tuple[subprocess.Popen[bytes], str]:
    """`python -m http.server` serving `directory` on loopback (a real server process), answering; its base URL."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port),
                             "--directory", str(directory)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(url + "/", timeout=2):
                return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop_http_server(proc)
                raise AssertionError("python -m http.server did not come up") from None
            time.sleep(0.05)


def stop_http_server(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def http_server(directory: Path) -> Iterator[str]:
    """A real HTTP server serving `directory` for the block's duration; yields its base URL."""
    proc, url = start_http_server(directory)
    try:
        yield url
    finally:
        stop_http_server(proc)


@contextlib.contextmanager
def tiny_disk(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `where` (a full disk on demand); skips without the right to mount, but fails
    under CI=true (its machine can), as tests/archive/test_faults.py does."""
    where.mkdir(parents=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        why = f"cannot mount a tmpfs for the full-disk test: {done.stderr.strip() or done.returncode}"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def unused_url() -> str:
    """A loopback URL nothing listens on (connection refused)."""
    return f"http://127.0.0.1:{free_port()}/nothing.tar"

