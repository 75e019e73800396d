"""The agent's dataset staging throughput against `curl` and `cp` of the same bytes (#33: target ratio >= 0.8).

    python bench/staging.py [--mb 256] [--rounds 3] [--s3]

Makes a tree of --mb MB of random files (8 files, incompressible), its tar, and
serves the tar with `python -m http.server` on loopback. Then, in rounds
alternating which goes first, times:
- http: the agent's staging of the tar's URL (nodeagent/datasets/: download,
  sha256, unpack as it streams, rename into the cache: `Stager._stage_key`,
  the code an agent runs, without the bus) with its digest checked (and
  without a digest: then nothing is hashed), against
  `curl -o FILE URL` (download only), and `curl URL | tar x` (download and
  unpack, what staging does) where curl exists (urllib otherwise);
- dir: the agent's staging of the directory (copy, rename) without a digest,
  and with one (then every byte is hashed as well: the manifest), against
  `cp -r`;
- s3 (with --s3, needs the extras corral[s3] and moto's server from the dev
  extra): moto's S3 server on loopback holds the tar and the tree's files
  under a prefix; the agent's staging of the archive object (digest checked)
  and of the prefix (manifest digest checked) against boto3's own
  `download_file` of the tar (what `aws s3 cp` does). moto is a Python
  server: it bounds both sides, so the ratio is the figure, not the MB/s.
Throughput is the tree's MB over the median wall seconds; `*_ratio` = agent /
tool (>= 1: the agent is as fast); `*_cpu_s` the median CPU seconds of each
(the agent's process, or the tools'), steadier than wall time on a loaded machine. The sources stay in the page cache for every
contender alike (read again before each run), and each starts after a sync (nobody pays for the writeback of
what the one before wrote). The last line is one JSON object, with the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import structlog  # noqa: E402

from nodeagent.datasets.cache import DatasetCache  # noqa: E402
from nodeagent.datasets.stager import Stager  # noqa: E402
from nodeagent.datasets.verify import manifest_digest  # noqa: E402
from orchestrator.core.node_view import NodeView  # noqa: E402
from schemas import Event  # noqa: E402
from schemas.datasets import Dataset  # noqa: E402
from tests.dataset_source import make_tar, make_tree, start_http_server, stop_http_server  # noqa: E402


def note(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


async def _agent_stage(ds: Dataset, cache_dir: Path, s3_endpoint_url: str | None) -> None:
    """What an agent does to stage `ds` into an empty cache (its events go nowhere)."""
    told: list[Event] = []

    async def append(e: Event) -> int:
        told.append(e)
        return len(told)

    def spawn(coro: Any) -> asyncio.Task[object]:
        return asyncio.ensure_future(coro)

    stager = Stager("bench", "b1", DatasetCache(cache_dir), append=append, state=lambda: NodeView(node_id="b1"), spawn=spawn,
                    s3_endpoint_url=s3_endpoint_url)
    await stager.start()
    await stager._stage_key(ds)


def agent(ds: Dataset, work: Path, s3_endpoint_url: str | None = None) -> Callable[[], None]:
    def run() -> None:
        asyncio.run(_agent_stage(ds, work / "cache", s3_endpoint_url))
    return run


def boto3_file(endpoint: str, work: Path) -> Callable[[], None]:
    def run() -> None:
        from tests.dataset_source import s3_client

        s3_client(endpoint).download_file("sets", "set.tar", str(work / "out.tar"))
    return run


def curl_file(url: str, work: Path) -> Callable[[], None]:
    def run() -> None:
        if shutil.which("curl"):
            subprocess.run(["curl", "-sSf", "-o", str(work / "out.tar"), url], check=True)
        else:
            with urllib.request.urlopen(url) as r, open(work / "out.tar", "wb") as f:
                shutil.copyfileobj(r, f, 1 << 20)
    return run


def curl_tar(url: str, work: Path) -> Callable[[], None]:
    def run() -> None:
        (work / "out").mkdir()
        if shutil.which("curl"):
            subprocess.run(f"curl -sSf '{url}' | tar x -C '{work / 'out'}'", shell=True, check=True)
        else:
            with urllib.request.urlopen(url) as r:
                subprocess.run(["tar", "x", "-C", str(work / "out")], stdin=r, check=True)
    return run


def cp(src: Path, work: Path) -> Callable[[], None]:
    def run() -> None:
        subprocess.run(["cp", "-r", str(src), str(work / "out")], check=True)
    return run


def cpu_s() -> float:
    """CPU seconds of this process and of its waited-for children (the tools) so far."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def warm(sources: list[Path]) -> None:
    """Read the sources once (untimed), so each contender finds them in the page cache."""
    for root in sources:
        for p in [root] if root.is_file() else sorted(root.rglob("*")):
            if p.is_file():
                with open(p, "rb") as f:
                    while f.read(1 << 20):
                        pass


def timed(make: Callable[[Path], Callable[[], None]], scratch: Path, sources: list[Path]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run."""
    work = Path(tempfile.mkdtemp(dir=scratch))
    try:
        run = make(work)
        os.sync()  # what the contender before wrote is flushed first, not on this one's time
        warm(sources)
        c0, t0 = cpu_s(), time.perf_counter()
        run()
        return time.perf_counter() - t0, cpu_s() - c0
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=256, help="size of the dataset (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", help="scratch directory (default: a temporary one)")
    ap.add_argument("--s3", action="store_true", help="also s3:// sources, from moto's S3 server on loopback")
    args = ap.parse_args()
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))  # stdout: the figures only
    scratch = Path(args.dir or tempfile.mkdtemp(prefix="corral-staging-bench-"))
    scratch.mkdir(parents=True, exist_ok=True)
    size = args.mb << 20
    note(f"making a {args.mb} MB tree and its tar in {scratch}")
    tree = scratch / "tree"
    make_tree(tree, size)
    www = scratch / "www"
    www.mkdir(exist_ok=True)
    sha = make_tar(tree, www / "set.tar")
    proc, base = start_http_server(www)
    url = f"{base}/set.tar"
    contenders: dict[str, Callable[[Path], Callable[[], None]]] = {
        "http_agent": lambda w: agent(Dataset(name="d", source=url, mount="/d", digest=sha), w),
        "http_agent_nodigest": lambda w: agent(Dataset(name="d", source=url, mount="/d"), w),
        "curl": lambda w: curl_file(url, w),
        "curl_tar": lambda w: curl_tar(url, w),
        "dir_agent": lambda w: agent(Dataset(name="d", source=str(tree), mount="/d"), w),
        "dir_agent_digest": lambda w: agent(Dataset(name="d", source=str(tree), mount="/d",
                                                    digest=manifest_digest(tree)), w),
        "cp": lambda w: cp(tree, w),
    }
    s3 = None
    if args.s3:
        from tests.dataset_source import S3_ENV, put_tree, s3_client, start_s3_server

        for k, v in S3_ENV.items():
            os.environ[k] = v
        s3, endpoint = start_s3_server()
        c = s3_client(endpoint)
        c.create_bucket(Bucket="sets")
        c.upload_file(str(www / "set.tar"), "sets", "set.tar")
        put_tree(c, "sets", "tree/", tree)
        contenders |= {
            "s3_agent": lambda w: agent(Dataset(name="d", source="s3://sets/set.tar", mount="/d", digest=sha), w,
                                        endpoint),
            "s3_agent_prefix": lambda w: agent(Dataset(name="d", source="s3://sets/tree/", mount="/d",
                                                       digest=manifest_digest(tree)), w, endpoint),
            "boto3": lambda w: boto3_file(endpoint, w),
        }
    times: dict[str, list[float]] = {k: [] for k in contenders}
    cpus: dict[str, list[float]] = {k: [] for k in contenders}
    try:
        for r in range(args.rounds):
            order = list(contenders) if r % 2 == 0 else list(reversed(contenders))
            for name in order:
                wall, cpu = timed(contenders[name], scratch, [tree] if name.startswith(("dir", "cp")) else
                                  [www / "set.tar"])
                times[name].append(wall)
                cpus[name].append(cpu)
            note(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.3f}s" for k, v in times.items()))
    finally:
        stop_http_server(proc)
        if s3 is not None:
            stop_http_server(s3)
        if not args.dir:
            shutil.rmtree(scratch, ignore_errors=True)
    mb = size / 1e6
    rate = {k: mb / statistics.median(v) for k, v in times.items()}
    out = {
        "mb": round(mb, 1),
        "rounds": args.rounds,
        **{f"{k}_mb_s": round(v, 1) for k, v in rate.items()},
        "http_ratio": round(rate["http_agent"] / rate["curl"], 3),
        "http_ratio_vs_curl_tar": round(rate["http_agent"] / rate["curl_tar"], 3),
        "http_nodigest_ratio_vs_curl_tar": round(rate["http_agent_nodigest"] / rate["curl_tar"], 3),
        "dir_ratio": round(rate["dir_agent"] / rate["cp"], 3),
        "dir_digest_ratio": round(rate["dir_agent_digest"] / rate["cp"], 3),
        **({"s3_ratio": round(rate["s3_agent"] / rate["boto3"], 3),
            "s3_prefix_ratio": round(rate["s3_agent_prefix"] / rate["boto3"], 3)} if args.s3 else {}),
        # CPU seconds per run (medians; the HTTP server's are in neither): what a loaded machine moves least.
        **{f"{k}_cpu_s": round(statistics.median(v), 3) for k, v in cpus.items()},
        "curl": bool(shutil.which("curl")),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
