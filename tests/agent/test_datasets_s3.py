"""s3:// dataset sources (nodeagent/datasets/s3.py, the extra corral[s3]) against a real S3 server on loopback:
moto's standalone server as its own process, filled with boto3. An archive object and a prefix (a directory),
digests, and each way it fails with its reason. Every cache entry is judged by the test's own checksum of its files
(tests/dataset_source.py), and the manifest digest is computed here, not by nodeagent/datasets/verify.py.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeagent.datasets.cache import DatasetCache
from nodeagent.datasets.fetch import StagingError, Stopped, stage
from nodeagent.datasets.stager import expected_bytes
from schemas.datasets import Dataset
from tests.dataset_source import (
    S3_ENV,
    make_tar,
    make_tree,
    make_zip,
    need_moto,
    put_tree,
    s3_auth,
    s3_client,
    s3_server,
    tree_sum,
)

MB = 1 << 20
ROOT = Path(__file__).resolve().parents[2]


def manifest_sha(tree: Path) -> str:
    """The directory digest as the README defines it (one line per file, sorted by path), computed here."""
    lines = sorted((f"{hashlib.sha256(p.read_bytes()).hexdigest()} {p.stat().st_size} "
                    f"{p.relative_to(tree).as_posix()}\n" for p in tree.rglob("*") if p.is_file()),
                   key=lambda ln: ln.split(" ", 2)[2])
    return hashlib.sha256("".join(lines).encode()).hexdigest()


@pytest.fixture(scope="module")
def bucket(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, dict[str, str]]]:
    """A bucket "sets" with a 4 MB tree as set.tar, set.tar.gz and set.zip, and as objects under tree/:
    (endpoint, tree, {object: sha256 of its bytes})."""
    root = tmp_path_factory.mktemp("s3")
    tree = root / "tree"
    make_tree(tree, 4 * MB)
    sums = {"set.tar": make_tar(tree, root / "set.tar"), "set.zip": make_zip(tree, root / "set.zip")}
    with tarfile.open(root / "set.tar.gz", "w:gz") as tar:
        tar.add(tree, arcname=".")
    sums["set.tar.gz"] = hashlib.sha256((root / "set.tar.gz").read_bytes()).hexdigest()
    with s3_server() as endpoint:
        c = s3_client(endpoint)
        c.create_bucket(Bucket="sets")
        for name in sums:
            c.upload_file(str(root / name), "sets", name)
        put_tree(c, "sets", "tree/", tree)
        c.put_object(Bucket="sets", Key="bad/../escape.bin", Body=b"x")
        c.put_object(Bucket="sets", Key="junk.tar", Body=b"this is not an archive" * 100)
        yield endpoint, tree, sums


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in S3_ENV.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(k, raising=False)


def _stage(ds: Dataset, cache: DatasetCache, endpoint: str | None) -> tuple[Path, int, list[tuple[int, int]]]:
    seen: list[tuple[int, int]] = []
    tmp = cache.temp_dir(ds.key)
    try:
        read = stage(ds, tmp / "data", lambda d, t: seen.append((d, t)), threading.Event(), s3_endpoint_url=endpoint)
    except BaseException:
        cache.discard(tmp)
        raise
    entry = cache.commit(tmp, ds.key, read, ds.source)
    return entry.path, read, seen


@pytest.mark.parametrize("name", ["set.tar", "set.tar.gz", "set.zip"])
def test_an_archive_object_is_streamed_verified_and_unpacked(bucket: tuple[str, Path, dict[str, str]],
                                                             tmp_path: Path, name: str) -> None:
    endpoint, tree, sums = bucket
    ds = Dataset(name="d", source=f"s3://sets/{name}", mount="/d", digest=f"sha256:{sums[name]}")
    size = s3_client(endpoint).head_object(Bucket="sets", Key=name)["ContentLength"]
    assert expected_bytes(ds, endpoint) == size
    path, read, seen = _stage(ds, DatasetCache(tmp_path / "cache"), endpoint)
    assert tree_sum(path) == tree_sum(tree)
    assert read == size and seen[0] == (0, size) and seen[-1] == (size, size) and len(seen) > 2
    assert path == tmp_path / "cache" / f"sha256-{sums[name]}" / "data"
    assert not list((tmp_path / "cache" / ".tmp").iterdir())


def test_a_prefix_is_a_directory_with_the_same_manifest_digest_and_cache_key_as_one_on_shared_storage(
        bucket: tuple[str, Path, dict[str, str]], tmp_path: Path) -> None:
    endpoint, tree, _ = bucket
    digest = manifest_sha(tree)
    from_s3 = Dataset(name="d", source="s3://sets/tree/", mount="/d", digest=f"sha256:{digest}")
    from_path = Dataset(name="d", source=str(tree), mount="/d", digest=f"sha256:{digest}")
    assert from_s3.key == from_path.key == f"sha256-{digest}"
    assert expected_bytes(from_s3, endpoint) == 4 * MB
    path, read, seen = _stage(from_s3, DatasetCache(tmp_path / "s3"), endpoint)
    assert tree_sum(path) == tree_sum(tree) and read == 4 * MB and seen[-1] == (4 * MB, 4 * MB)
    copied, _, _ = _stage(from_path, DatasetCache(tmp_path / "path"), None)
    assert tree_sum(copied) == tree_sum(path)


def test_the_endpoint_comes_from_the_aws_chain_without_the_flag(bucket: tuple[str, Path, dict[str, str]],
                                                                tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    endpoint, tree, _ = bucket
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    path, _, _ = _stage(Dataset(name="d", source="s3://sets/set.tar", mount="/d"), DatasetCache(tmp_path), None)
    assert tree_sum(path) == tree_sum(tree)


def test_bad_sources_fail_with_a_reason_to_act_on(bucket: tuple[str, Path, dict[str, str]], tmp_path: Path) -> None:
    endpoint, tree, sums = bucket
    wrong = "1" * 64
    cases = {
        f"s3://sets/set.tar|{wrong}": f"digest mismatch: s3://sets/set.tar hashes to sha256:{sums['set.tar']}, "
                                      f"the spec says sha256:{wrong}",
        f"s3://sets/tree/|{wrong}": f"digest mismatch: the manifest of s3://sets/tree/ hashes to "
                                    f"sha256:{manifest_sha(tree)}, the spec says sha256:{wrong}",
        "s3://sets/missing.tar|": f"no such key: s3://sets/missing.tar does not exist at {endpoint}",
        "s3://nobucket/set.tar|": f"no such bucket 'nobucket' at {endpoint}",
        "s3://nobucket/tree/|": f"no such bucket 'nobucket' at {endpoint}",
        "s3://sets/nothing-here/|": "no objects under s3://sets/nothing-here/ at",
        "s3://sets/junk.tar|": "s3://sets/junk.tar is not a readable tar or zip archive",
        "s3://sets/bad/|": "the object key 'bad/../escape.bin' under s3://sets/bad/ names no path inside",
    }
    cache = DatasetCache(tmp_path / "cache")
    for src_digest, says in cases.items():
        src, digest = src_digest.split("|")
        ds = Dataset(name="d", source=src, mount="/d", digest=digest)
        with pytest.raises(StagingError) as e:
            _stage(ds, cache, endpoint)
        assert says in str(e.value), (src, str(e.value))
        assert cache.get(ds.key) is None, "a failed staging is never an entry"
    assert not (tmp_path / "escape.bin").exists() and not list((tmp_path / "cache" / ".tmp").iterdir())


def test_no_credentials_fail_saying_where_they_come_from(bucket: tuple[str, Path, dict[str, str]], tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    endpoint, _, _ = bucket
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(StagingError, match=r"no AWS credentials on this node for s3://sets/set.tar: set "
                                           r"AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE"):
        _stage(Dataset(name="d", source="s3://sets/set.tar", mount="/d"), DatasetCache(tmp_path), endpoint)


def test_access_denied_names_the_refusal_and_where_the_credentials_came_from(
        bucket: tuple[str, Path, dict[str, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """moto's IAM checks on: a key its IAM does not know, and a known user's key with no policy, are refused."""
    endpoint, _, _ = bucket
    import boto3

    iam = boto3.session.Session().client("iam", endpoint_url=endpoint, region_name="us-east-1")
    iam.create_user(UserName="nobody")
    key = iam.create_access_key(UserName="nobody")["AccessKey"]
    s3_auth(endpoint, on=True)
    try:
        ds = Dataset(name="d", source="s3://sets/set.tar", mount="/d")
        with pytest.raises(StagingError) as unknown:
            _stage(ds, DatasetCache(tmp_path / "a"), endpoint)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
        with pytest.raises(StagingError) as denied:
            _stage(Dataset(name="d", source="s3://sets/tree/", mount="/d"), DatasetCache(tmp_path / "b"), endpoint)
    finally:
        s3_auth(endpoint, on=False)
    assert str(unknown.value).startswith(f"access denied to s3://sets/set.tar at {endpoint}: InvalidAccessKeyId: ")
    assert str(unknown.value).endswith("(the agent's credentials came from: env)")
    assert str(denied.value).startswith(f"access denied to s3://sets/tree/ at {endpoint}: AccessDenied: ")


def test_an_unreachable_endpoint_fails_after_bounded_attempts(tmp_path: Path) -> None:
    from tests.dataset_source import free_port

    need_moto()
    nowhere = f"http://127.0.0.1:{free_port()}"
    ds = Dataset(name="d", source="s3://sets/set.tar", mount="/d")
    assert expected_bytes(ds, nowhere) == 0
    with pytest.raises(StagingError, match=rf"cannot reach the S3 endpoint {nowhere} for s3://sets/set.tar "
                                           r"\(after 3 attempts\)"):
        _stage(ds, DatasetCache(tmp_path), nowhere)


def test_a_stop_gives_up_mid_download(bucket: tuple[str, Path, dict[str, str]], tmp_path: Path) -> None:
    endpoint, _, _ = bucket
    for src in ("s3://sets/set.tar", "s3://sets/tree/"):
        stop = threading.Event()

        def progress(done: int, total: int, stop: threading.Event = stop) -> None:
            if done > MB:
                stop.set()

        with pytest.raises(Stopped):
            stage(Dataset(name="d", source=src, mount="/d"), tmp_path / src[-4:].strip("/"), progress, stop,
                  s3_endpoint_url=endpoint)


def test_without_the_extra_an_s3_source_fails_saying_what_to_install(tmp_path: Path) -> None:
    """An agent whose Python has no boto3 (a plain `pip install corral`): the reason names corral[s3]."""
    code = ("import sys, threading; from pathlib import Path\n"
            "sys.modules['boto3'] = None  # not installed\n"
            "from nodeagent.datasets.fetch import StagingError, stage\n"
            "from nodeagent.datasets.stager import expected_bytes\n"
            "from schemas.datasets import Dataset\n"
            "ds = Dataset(name='d', source='s3://b/k.tar', mount='/d')\n"
            "assert expected_bytes(ds) == 0\n"
            "try:\n"
            f"    stage(ds, Path({str(tmp_path)!r}), lambda d, t: None, threading.Event())\n"
            "except StagingError as e:\n"
            "    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH",
                                                                                                      "")])})
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("s3:// sources need the optional extra corral[s3] on the agent (pip install "
                                 "'corral[s3]')"), out.stdout


def test_a_malformed_endpoint_is_refused_by_the_agent_and_by_staging(tmp_path: Path) -> None:
    from tests.integration.harness import CORRAL

    need_moto()
    with pytest.raises(StagingError, match="cannot make an S3 client \\(endpoint not a url\\): "):
        _stage(Dataset(name="d", source="s3://sets/set.tar", mount="/d"), DatasetCache(tmp_path), "not a url")
    out = subprocess.run([CORRAL, "--nats", "nats://127.0.0.1:1", "agent", "--node-id", "n0", "--fake-gpus", "8",
                          "--runtime", "process", "--data-dir", str(tmp_path / "agent"), "--s3-endpoint-url",
                          "minio:9000"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--s3-endpoint-url is an http:// or https:// URL, got 'minio:9000'" in out.stderr
