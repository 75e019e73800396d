"""Datasets a job trains on (`JobSpec.datasets`): what a spec may name, and the cache key of each.

A dataset is staged by each node agent into a node-local, content-addressed
cache before the gang's ranks start (nodeagent/datasets/). The cache key is
a pure function of the spec's entry, so the agent that stages it, the fold
that records which node holds it and the scheduler that prefers warm nodes
all name it alike: `sha256-<hex>` for an entry with a digest (the same bytes
from any source are one entry), else `src-<hash of the source>` (the same
source is one entry) -- and of its `fingerprint` when the submitter took one
(a local directory as it was at submit: an edited one is another entry).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Literal

import msgspec

from schemas.specinput import shown as _show

#: Where a job's datasets may live (see `JobSpec.locality`): "prefer" (warm nodes win ties of equal
#: topology quality) or "require" (only nodes that already hold every dataset).
Locality = Literal["prefer", "require"]
LOCALITIES = ("prefer", "require")

#: A dataset's name: it becomes `CORRAL_DATASET_<NAME>` (upper-cased) in each rank's environment.
NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
#: A digest: sha256 of the archive (a URL) or of the directory's manifest (a path), as `sha256:<64 hex>`.
DIGEST_RE = re.compile(r"(?:sha256:)?([0-9a-fA-F]{64})")
#: A local source's fingerprint, taken at submit (events/fingerprint.py): sha256 of each file's relative path,
#: type, size, mtime_ns and ctime_ns, as `stat:<64 hex>`.
FINGERPRINT_RE = re.compile(r"stat:[0-9a-f]{64}")
#: Source schemes the schema accepts (s3:// needs the optional `corral[s3]` on the agents).
SCHEMES = ("file://", "http://", "https://", "s3://")
#: Most datasets one job may name, and the longest source or mount.
MAX_DATASETS = 32
MAX_SOURCE_LEN = 4096


class Dataset(msgspec.Struct, frozen=True, kw_only=True, gc=False, omit_defaults=True):
    """One dataset of a job: staged from `source` on every node of the gang, seen by the job at `mount`."""

    name: str
    #: An absolute path or `file://` path (a directory on shared storage), an `http(s)://` URL of a
    #: tar or zip archive, or `s3://bucket/key` of one.
    source: str
    #: Where the job sees it: a read-only bind mount in a container; the process runtime hands the cache
    #: path in `CORRAL_DATASET_<NAME>` instead.
    mount: str
    #: `sha256:<hex>` of the archive (or of the directory's manifest); "" for none (then the source names it).
    digest: str = ""
    #: A local source without a digest: its fingerprint as the submitter saw it (`corral submit` fills it in;
    #: FINGERPRINT_RE), so an edited directory gets a new cache key and the next job stages it afresh.
    #: "" (omitted): none, the source alone names it (a spec written before #41 encodes as before).
    fingerprint: str = ""

    @property
    def env_name(self) -> str:
        """The variable that holds its path in each rank's environment."""
        return f"CORRAL_DATASET_{self.name.upper()}"

    @property
    def sha256(self) -> str:
        """The digest's hex, lower case; "" when the entry has none."""
        m = DIGEST_RE.fullmatch(self.digest) if self.digest else None
        return m.group(1).lower() if m else ""

    @property
    def key(self) -> str:
        """Its cache key: the same on every node and every reader (a file name: [a-z0-9-])."""
        return cache_key(self.source, self.digest, self.fingerprint)


def cache_key(source: str, digest: str = "", fingerprint: str = "") -> str:
    """`sha256-<hex>` for a digest, else `src-<first 32 hex of sha256(source)>` (of `source NUL fingerprint`
    when it has a fingerprint)."""
    m = DIGEST_RE.fullmatch(digest) if digest else None
    if m:
        return f"sha256-{m.group(1).lower()}"
    named = source if not fingerprint else f"{source}\0{fingerprint}"
    return "src-" + hashlib.sha256(named.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def source_scheme(source: str) -> str:
    """"file", "http", "https" or "s3" (an absolute path is "file"); "" for anything else."""
    if source.startswith("/"):
        return "file"
    for s in SCHEMES:
        if source.startswith(s):
            return s.removesuffix("://")
    return ""


def dataset_problems(v: Any, out: list[tuple[str, str]]) -> None:
    """Each problem of a raw `datasets` list as (field path, what to do), appended to `out`."""
    if not isinstance(v, (list, tuple)):
        out.append(("datasets", "must be a list of {name, source, mount, digest}"))
        return
    if len(v) > MAX_DATASETS:
        out.append(("datasets", f"must name at most {MAX_DATASETS} datasets, got {len(v)}"))
    names: dict[str, int] = {}
    mounts: dict[str, int] = {}
    for i, d in enumerate(v):
        p = f"datasets[{i}]"
        if not isinstance(d, dict):
            out.append((p, "must be a mapping {name, source, mount, digest}"))
            continue
        for k in d:
            if k not in ("name", "source", "mount", "digest", "fingerprint"):
                out.append((f"{p}.{_show(k) if not isinstance(k, str) else k}",
                            "unknown field; expected name, source, mount, digest"))
        name = d.get("name")
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            out.append((f"{p}.name", "must be a letter then letters, digits or _ (at most 64; it becomes "
                                     f"CORRAL_DATASET_<NAME>), got {_show(name)}"))
        elif name.upper() in names:
            out.append((f"{p}.name", f"repeats datasets[{names[name.upper()]}].name (names are compared "
                                     "upper-cased, as their variables are)"))
        else:
            names[name.upper()] = i
        _source_problems(d.get("source"), f"{p}.source", out)
        mount = d.get("mount")
        if not isinstance(mount, str) or not mount.startswith("/") or mount.rstrip("/") == "" or "\0" in mount:
            out.append((f"{p}.mount", f"must be an absolute path other than /, got {_show(mount)}"))
        elif len(mount) > MAX_SOURCE_LEN:
            out.append((f"{p}.mount", f"must be at most {MAX_SOURCE_LEN} characters"))
        elif mount.rstrip("/") in mounts:
            out.append((f"{p}.mount", f"repeats datasets[{mounts[mount.rstrip('/')]}].mount"))
        else:
            mounts[mount.rstrip("/")] = i
        digest = d.get("digest", "")
        if not isinstance(digest, str) or (digest and not DIGEST_RE.fullmatch(digest)):
            out.append((f"{p}.digest", "must be sha256:<64 hex digits> (sha256 of the archive, or of the "
                                       f"directory's manifest), got {_show(digest)}"))
        fingerprint = d.get("fingerprint", "")
        if not isinstance(fingerprint, str) or (fingerprint and not FINGERPRINT_RE.fullmatch(fingerprint)):
            out.append((f"{p}.fingerprint", "must be stat:<64 lower-case hex digits> (corral submit takes it; "
                                            f"leave it out), got {_show(fingerprint)}"))


def _source_problems(src: Any, path: str, out: list[tuple[str, str]]) -> None:
    if not isinstance(src, str) or not src or "\0" in src:
        out.append((path, f"must be a path or URL (file://, http(s)://, s3://), got {_show(src)}"))
        return
    if len(src) > MAX_SOURCE_LEN:
        out.append((path, f"must be at most {MAX_SOURCE_LEN} characters"))
        return
    scheme = source_scheme(src)
    if not scheme:
        out.append((path, f"must be an absolute path, file:///path, http(s)://host/archive.tar or "
                          f"s3://bucket/key, got {_show(src)}"))
    elif scheme == "file" and not src.removeprefix("file://").startswith("/"):
        out.append((path, f"a file:// source must name an absolute path (file:///data/set), got {_show(src)}"))
    elif scheme in ("http", "https") and len(src) <= len(scheme) + 3:
        out.append((path, f"must name a host and an archive, got {_show(src)}"))
    elif scheme == "s3" and "/" not in src.removeprefix("s3://").strip("/"):
        out.append((path, f"must be s3://bucket/key, got {_show(src)}"))
