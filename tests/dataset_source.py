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



# --- S3: moto's standalone server on loopback (`python -m moto.server`, dev extra), filled with boto3 ---------

#: Credentials moto accepts (any, until its IAM checks are switched on); the agent finds them in its environment.
S3_ENV = {"AWS_ACCESS_KEY_ID": "corral-test", "AWS_SECRET_ACCESS_KEY": "corral-test-secret",
          "AWS_DEFAULT_REGION": "us-east-1",
          # Never the instance metadata service (a link-local address, not loopback), nor a developer's own files.
          "AWS_EC2_METADATA_DISABLED": "true", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/corral-test",
          "AWS_CONFIG_FILE": "/nonexistent/corral-test"}


def need_moto() -> None:
    """Skip without moto here (a plain checkout's venv); fail under CI=true, whose `make` installs the dev extra."""
    try:
        import moto.server  # noqa: F401
    except ModuleNotFoundError as e:
        if os.environ.get("CI") == "true":
            pytest.fail(f"moto[s3] (the dev extra) is not installed: {e}")
        pytest.skip(f"moto[s3] and boto3 (the dev extra) are not installed: {e}")


def start_s3_server() -> tuple[subprocess.Popen[bytes], str]:
    """A real S3 server (moto's, `python -m moto.server`) on a free loopback port, answering; its endpoint URL."""
    need_moto()
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(url + "/moto-api/", timeout=2):
                return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop_http_server(proc)
                raise AssertionError("python -m moto.server did not come up") from None
            time.sleep(0.05)


@contextlib.contextmanager
def s3_server() -> Iterator[str]:
    """A real S3 server on loopback for the block's duration (start_s3_server); yields its endpoint URL."""
    proc, url = start_s3_server()
    try:
        yield url
    finally:
        stop_http_server(proc)


def s3_client(endpoint: str, **creds: str):  # type: ignore[no-untyped-def]
    """The test's own boto3 client (it fills buckets; the agent makes its own from its environment)."""
    import boto3

    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id=creds.get("key", S3_ENV["AWS_ACCESS_KEY_ID"]),
        aws_secret_access_key=creds.get("secret", S3_ENV["AWS_SECRET_ACCESS_KEY"]))


def put_tree(client, bucket: str, prefix: str, tree: Path) -> None:  # type: ignore[no-untyped-def]
    """Every file of `tree` as an object `prefix` + its relative path."""
    for p in sorted(tree.rglob("*")):
        if p.is_file():
            client.upload_file(str(p), bucket, prefix + p.relative_to(tree).as_posix())


def s3_auth(endpoint: str, on: bool) -> None:
    """Switch moto's IAM checks on (every request must be signed by a key its IAM knows, and be allowed) or off
    (its public test API, /moto-api/reset-auth)."""
    req = urllib.request.Request(endpoint + "/moto-api/reset-auth", data=b"0" if on else b"1e18", method="POST",
                                 headers={"Content-Type": "text/plain"})  # (a form's body would not reach it)
    with urllib.request.urlopen(req, timeout=10):
        pass
