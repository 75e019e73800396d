"""`s3://` dataset sources, through the optional extra corral[s3] (boto3): an archive object, or a prefix.

`s3://bucket/key` (no trailing slash) is an archive, as an http(s) URL is: it
streams through fetch.py's unpacker (tar plain/gz/bz2/xz, or zip) and its
digest is the sha256 of the object's bytes. `s3://bucket/prefix/` (trailing
slash) is a directory: every object under the prefix, at its path below it,
and its digest is the manifest digest of a directory (verify.py), so the same
files staged from shared storage or from S3 with the same digest are one
cache entry (`sha256-<hex>`, schemas/datasets.py).

Credentials and endpoint come from the standard AWS chain on the agent's
machine (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE and the shared
files, an instance or container role; AWS_ENDPOINT_URL(_S3)); `corral agent
--s3-endpoint-url` overrides the endpoint (MinIO, Ceph). Every request has a
connect and read timeout and a bounded number of attempts, so an unreachable
endpoint fails the staging with a reason instead of hanging it. Blocking, like
fetch.py: the stager runs it in a thread, one boto3 session per staging (a
session is not thread-safe).
"""

from __future__ import annotations

import io
import threading
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from nodeagent.datasets.fetch import Progress, Refused, StagingError, Stopped, check_manifest, unpack_archive
from nodeagent.datasets.limits import Limits
from nodeagent.datasets.verify import CHUNK

#: Seconds to connect, and that one read may stall, before an S3 request gives up (and is retried).
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 30.0
#: Attempts of one request (botocore's "standard" retry mode: backoff with jitter, transient errors only).
ATTEMPTS = 3
NEEDS_EXTRA = ("s3:// sources need the optional extra corral[s3] on the agent (pip install 'corral[s3]'), "
               "which this agent's Python lacks (no boto3)")
#: Error codes S3 and its clones (MinIO, Ceph) answer a refused request with.
DENIED = frozenset({"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
                    "InvalidToken", "TokenRefreshRequired", "AllAccessDisabled", "403"})


@dataclass(frozen=True)
class Location:
    bucket: str
    #: The object's key, or the prefix (ending in "/"; "" for a whole bucket is not allowed by the schema).
    key: str

    @property
    def is_prefix(self) -> bool:
        return self.key.endswith("/")

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


def location(source: str) -> Location:
    bucket, _, key = source.removeprefix("s3://").partition("/")
    if not bucket or not key:
        raise StagingError(f"{source} names no object: expected s3://bucket/key.tar or s3://bucket/prefix/")
    return Location(bucket, key)


def stage_s3(source: str, dest: Path, sha256: str, progress: Progress, stop: threading.Event,
             endpoint_url: str | None, limits: Limits | None = None) -> int:
    """Stage `source` into the empty directory `dest`, verified; returns the bytes read from S3."""
    loc = location(source)
    session, client = _client(endpoint_url, ATTEMPTS)
    from botocore.exceptions import BotoCoreError, ClientError

    lim = limits or Limits()
    try:
        if loc.is_prefix:
            return _prefix(client, loc, dest, sha256, progress, stop, lim)
        obj = client.get_object(Bucket=loc.bucket, Key=loc.key)
        total = int(obj.get("ContentLength") or 0)
        if total > lim.fetch_limit():
            obj["Body"].close()
            raise Refused(f"{loc} is {total} bytes, more than the {lim.fetch_limit()} a staging may fetch here "
                          "(--dataset-cache-bytes, --dataset-max-bytes)")
        return unpack_archive(str(loc), _Body(obj["Body"]), total, dest, sha256, progress, stop, lim)
    except (BotoCoreError, ClientError) as e:
        raise StagingError(why(e, loc, session, client)) from None


def expected_bytes(source: str, endpoint_url: str | None) -> int:
    """The object's length, or the sum of the prefix's objects; 0 when that cannot be known (staging says why)."""
    try:
        loc = location(source)
        _, client = _client(endpoint_url, 1)  # (a look ahead: an unreachable endpoint is waited for once, by staging)
        if not loc.is_prefix:
            return int(client.head_object(Bucket=loc.bucket, Key=loc.key).get("ContentLength") or 0)
        return sum(size for _, size in _listing(client, loc, threading.Event()))
    except Exception:  # (boto3 missing, no credentials, a refusal, an unreachable endpoint: all told by staging)
        return 0


def _client(endpoint_url: str | None, attempts: int) -> tuple[Any, Any]:
    """A new boto3 session (it reads the credential chain now) and its S3 client."""
    try:
        import boto3
        from botocore.config import Config
    except ModuleNotFoundError as e:
        if (e.name or "").partition(".")[0] not in ("boto3", "botocore"):
            raise
        raise StagingError(NEEDS_EXTRA) from None
    config = Config(connect_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S,
                    retries={"max_attempts": attempts, "mode": "standard"})
    # endpoint_url=None leaves the chain's own (AWS_ENDPOINT_URL, AWS_ENDPOINT_URL_S3, the profile's) in force.
    try:
        session = boto3.session.Session()
        return session, session.client("s3", endpoint_url=endpoint_url or None, config=config)
    except ValueError as e:  # a malformed endpoint (from the flag or the environment), an unknown region name
        raise StagingError(f"cannot make an S3 client (endpoint {endpoint_url or 'from the AWS chain'}): {e}") from None


def why(e: Exception, loc: Location, session: Any, client: Any) -> str:
    """What went wrong, in words a user can act on (the codes are S3's, so MinIO's and Ceph's match)."""
    from botocore.exceptions import (
        ClientError,
        ConnectionClosedError,
        ConnectTimeoutError,
        EndpointConnectionError,
        NoCredentialsError,
        PartialCredentialsError,
        ReadTimeoutError,
    )

    endpoint = getattr(client.meta, "endpoint_url", "?")
    if isinstance(e, (NoCredentialsError, PartialCredentialsError)):
        return (f"no AWS credentials on this node for {loc}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                f"AWS_PROFILE, or give the node an instance role ({e})")
    if isinstance(e, (EndpointConnectionError, ConnectTimeoutError, ConnectionClosedError, ReadTimeoutError)):
        return (f"cannot reach the S3 endpoint {endpoint} for {loc} (after {ATTEMPTS} attempts): {e}; "
                f"set it with AWS_ENDPOINT_URL or corral agent --s3-endpoint-url")
    if isinstance(e, ClientError):
        err = e.response.get("Error", {})
        code = str(err.get("Code", ""))
        msg = err.get("Message") or code
        status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code == "NoSuchBucket":
            return f"no such bucket {loc.bucket!r} at {endpoint} (for {loc})"
        if code in ("NoSuchKey", "404", "NotFound") or status == 404:
            return f"no such key: {loc} does not exist at {endpoint}"
        if code in DENIED or status == 403:
            creds = session.get_credentials()  # (resolved already: how the chain found them)
            how = getattr(creds, "method", None) or "none"
            return (f"access denied to {loc} at {endpoint}: {code}: {msg} (the agent's credentials came from: "
                    f"{how})")
        return f"S3 refused {loc} at {endpoint}: {code or status}: {msg}"
    return f"S3 request for {loc} at {endpoint} failed: {type(e).__name__}: {e}"


def _listing(client: Any, loc: Location, stop: threading.Event) -> list[tuple[str, int]]:
    """(key, size) of every object under the prefix, sorted by key (folder markers "…/" left out)."""
    found = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=loc.bucket, Prefix=loc.key):
        if stop.is_set():
            raise Stopped("the agent is stopping")
        found.extend((o["Key"], int(o.get("Size", 0))) for o in page.get("Contents", ()) if not o["Key"].endswith("/"))
    return sorted(found)


def _relative(key: str, loc: Location) -> PurePosixPath:
    """Where the object `key` goes below the dataset's root; refuses a key that would land outside it."""
    rel = key[len(loc.key):]
    parts = rel.split("/")
    if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise StagingError(f"the object key {key!r} under {loc} names no path inside the dataset (an empty, "
                           f"'.' or '..' component)")
    return PurePosixPath(rel)


def _prefix(client: Any, loc: Location, dest: Path, sha256: str, progress: Progress, stop: threading.Event,
            limits: Limits) -> int:
    objects = _listing(client, loc, stop)
    if not objects:
        raise StagingError(f"no objects under {loc} at {client.meta.endpoint_url}: an empty prefix is no dataset "
                           f"(a directory is s3://bucket/prefix/, an archive s3://bucket/key.tar)")
    files = [(key, _relative(key, loc), size) for key, size in objects]
    total = sum(size for _, _, size in files)
    if total > limits.fetch_limit() or len(files) > limits.max_members:
        raise Refused(f"{loc} holds {len(files)} objects of {total} bytes, more than a staging may take here "
                      f"({limits.max_members} objects, {limits.fetch_limit()} bytes: --dataset-max-members, "
                      "--dataset-max-bytes, --dataset-cache-bytes)")
    done = 0
    progress(0, total)
    for key, rel, size in files:
        if stop.is_set():
            raise Stopped("the agent is stopping")
        target = dest.joinpath(*rel.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        body = _Body(client.get_object(Bucket=loc.bucket, Key=key)["Body"])
        got = 0
        with body, open(target, "wb") as f:
            buf = bytearray(CHUNK)
            view = memoryview(buf)
            while n := body.readinto(view):
                if stop.is_set():
                    raise Stopped("the agent is stopping")
                f.write(view[:n])
                got += n
                if got > size:
                    break  # (it grew since it was listed: said below, never read past what the limits allowed)
                progress(done + got, total)
        if got != size:
            raise StagingError(f"s3://{loc.bucket}/{key} changed while staging: listed with {size} bytes, "
                               f"read {got}")
        done += got
    check_manifest(dest, sha256, loc, "the objects")
    return done


#: Most bytes one read of an object's body asks for.
READ_STEP = 1 << 16


class _Body(io.RawIOBase):
    """A botocore StreamingBody as a raw stream; a broken read is a ConnectionError, as a broken HTTP one is."""

    def __init__(self, body: Any) -> None:
        self.body = body

    def readable(self) -> bool:
        return True

    def readinto(self, b: memoryview) -> int:  # type: ignore[override]
        from botocore.exceptions import BotoCoreError

        try:
            # (a read returns once it has all it asked for: a small step keeps the progress, and a slow body
            # does not look stalled to the supervisor)
            data = self.body.read(min(len(b), READ_STEP))
        except BotoCoreError as e:
            raise ConnectionError(str(e)) from None
        n = len(data)
        b[:n] = data
        return n

    def close(self) -> None:
        self.body.close()
        super().close()
