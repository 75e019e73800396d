"""The agent's side of dataset staging: stage what this node's gangs need, and tell the log.

For each dataset of each attempt placed here (`ensure`, from reconcile) one
request: a cache hit is told at once (DatasetReady, cached, 0 bytes staged);
otherwise it waits on the one staging of that cache key (shared by every job
and attempt that names it), telling its progress (DatasetStaging, at most one
every `progress_s`) and then DatasetReady or DatasetFailed. The gang's ranks
start once the scheduler's fold says every node told DatasetReady for every
dataset (orchestrator/core/staging.py `staged`), which it tells this node
(WorkChanged, `staged`); a DatasetFailed ends the attempt.

Room: before a staging, and again with its real size before its entry is
renamed into place, the least recently used entries no job on this node uses
(nor any staging) are evicted (DatasetEvicted), or the staging fails saying
the cache is full. An agent killed mid-staging leaves only `.tmp/`, deleted on
start (`start`); the fold still lacks this node's DatasetReady, so the next
agent stages it again. Its cache's contents go to the log (NodeDatasets) when
they differ from what the log holds.
"""

from __future__ import annotations

import asyncio
import http.client
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog

from nodeagent.datasets.cache import CacheFull, DatasetCache, Entry, tree_bytes
from nodeagent.datasets.fetch import HTTP_TIMEOUT_S, DiskFull, Refused, StagingError, Stopped
from nodeagent.datasets.limits import Limits
from nodeagent.datasets.supervise import size_in_child, stage_in_child
from orchestrator.core.model.slices import NodeJob
from orchestrator.core.model.state import EvictRequest, Node
from orchestrator.core.node_view import NodeView
from schemas import Event, Mount
from schemas.datasets import Dataset, source_scheme
from schemas.events import (
    CachedDataset,
    DatasetEvicted,
    DatasetFailed,
    DatasetReady,
    DatasetStaging,
    NodeDatasets,
)

log = structlog.get_logger("corral.datasets")

#: Least seconds between two progress events of one dataset of one attempt on this node.
PROGRESS_S = 1.0
#: Room left on the cache's disk beyond a staging's known size (file system overhead, the entry's metadata).
DISK_MARGIN = 1 << 20

RequestKey = tuple[str, int, str]


class Stager:
    def __init__(self, node_id: str, incarnation: str, cache: DatasetCache, *,
                 append: Callable[[Event], Awaitable[int]], state: Callable[[], NodeView],
                 spawn: Callable[[Awaitable[object]], asyncio.Task[object]], progress_s: float = PROGRESS_S,
                 s3_endpoint_url: str | None = None, limits: Limits | None = None) -> None:
        self.node_id = node_id
        self.incarnation = incarnation
        self.cache = cache
        self._append = append
        self._state = state
        self._spawn = spawn
        self.progress_s = progress_s
        #: Where s3:// sources are (None: the AWS chain's own, e.g. AWS_ENDPOINT_URL).
        self.s3_endpoint_url = s3_endpoint_url
        #: What one staging may take (limits.py), never more than the cache holds; each runs in a child (#39).
        self.limits = (limits or Limits()).with_cache(cache.limit_bytes)
        #: cache key -> its one staging, and that staging's (bytes done, bytes total).
        self._keys: dict[str, asyncio.Task[object]] = {}
        self._progress: dict[str, tuple[int, int]] = {}
        self._requests: dict[RequestKey, asyncio.Task[object]] = {}
        self._room = asyncio.Lock()
        #: Evictions asked by the log (`corral datasets evict`), by the request's position: acted on once each.
        self._evictions: dict[int, asyncio.Task[object]] = {}
        self._stop = threading.Event()
        self._n = 0

    # --- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Reconcile the cache with the disk: what a killed agent left half done goes."""
        removed = await asyncio.to_thread(self.cache.reconcile)
        if removed:
            log.warning("dataset_cache_reconciled", node_id=self.node_id, removed=removed)

    async def announce(self) -> None:
        """Tell the log what the cache holds when the fold's view of this node differs (a restart, a wipe)."""
        entries = await asyncio.to_thread(self.cache.entries)
        me = self._state().node
        if me is None or set(me.datasets) == {e.key for e in entries}:
            return
        await self._append(NodeDatasets(
            event_id=f"node-datasets:{self.node_id}:{self.incarnation}:{self._next()}", occurred_at=time.time(),
            node_id=self.node_id, capacity_bytes=self.cache.limit_bytes,
            datasets=tuple(CachedDataset(key=e.key, size_bytes=e.size_bytes, last_used=e.last_used)
                           for e in entries)))

    def close(self) -> None:
        """Stop stagings in progress at their next chunk (their temporary directories are deleted)."""
        self._stop.set()

    # --- what the agent asks ---------------------------------------------------------

    def ensure(self, job: NodeJob, *, again: bool = False) -> None:
        """Stage every dataset of `job`'s current attempt here, once (reconcile calls it every pass); `again`:
        also those whose request ended but whose entry is not here (the log says ready, the disk disagrees)."""
        for ds in job.spec.dataset_list:
            rk = (job.job_id, job.attempt, ds.name)
            old = self._requests.get(rk)
            if old is None or (again and old.done() and self.cache.get(ds.key) is None):
                self._requests[rk] = self._spawn(self._request(job.job_id, job.attempt, ds))
        for rk, task in list(self._requests.items()):
            if task.done() and not self._current(rk[0], rk[1]):
                del self._requests[rk]

    def holds(self, job: NodeJob) -> bool:
        """Whether this node's cache has every dataset of `job` (a rank never starts on a path that is not there)."""
        return all((self.cache.root / ds.key / "entry.json").is_file() for ds in job.spec.dataset_list)

    def env(self, job: NodeJob, *, on_host: bool) -> dict[str, str]:
        """CORRAL_DATASET_<NAME> of each dataset: its cache path on the host, or its mount in a container."""
        return {ds.env_name: str(self.cache.root / ds.key / "data") if on_host else ds.mount
                for ds in job.spec.dataset_list}

    def mounts(self, job: NodeJob) -> tuple[Mount, ...]:
        """Read-only bind mounts of the datasets at their `mount` (container runtimes)."""
        return tuple(Mount(source=str(self.cache.root / ds.key / "data"), target=ds.mount, read_only=True)
                     for ds in job.spec.dataset_list)

    def _wanted(self, key: str) -> bool:
        """Whether a gang placed here still names the dataset `key`."""
        return any(ds.key == key for job in self._state().work.values() for ds in job.spec.dataset_list)

    def in_use(self) -> set[str]:
        """Cache keys no eviction may take: datasets of gangs placed here, and stagings in progress."""
        keys = set(self._keys)
        for job in self._state().work.values():
            keys.update(ds.key for ds in job.spec.dataset_list)
        return keys

    def evict_requested(self, node: Node | None) -> None:
        """Act on the evictions the log asks of this node (DatasetEvictRequested): each one once no job placed
        here uses its dataset (nor a staging); until then it waits, and the next pass looks again."""
        asked = {r.seq: r for r in node.evict_requests} if node is not None else {}
        for seq in [s for s, t in self._evictions.items() if s not in asked and t.done()]:
            del self._evictions[seq]  # (told and folded)
        busy = self.in_use()
        for seq, r in asked.items():
            if seq not in self._evictions and r.key not in busy:
                self._evictions[seq] = self._spawn(self._evict_on_request(r))

    async def _evict_on_request(self, r: EvictRequest) -> None:
        async with self._room:
            if r.key in self.in_use():  # a gang placed here meanwhile: a later pass asks again
                self._evictions.pop(r.seq, None)
                return
            gone = await asyncio.to_thread(self.cache.evict, r.key)
        by = f" by {r.requested_by}" if r.requested_by else ""
        log.info("dataset_evicted", node_id=self.node_id, key=r.key, bytes=gone.size_bytes if gone else 0,
                 requested_by=r.requested_by, held=gone is not None)
        await self._append(DatasetEvicted(
            event_id=f"dataset-evicted:{self.node_id}:{r.key}:request-{r.seq}", occurred_at=time.time(),
            node_id=self.node_id, key=r.key, size_bytes=gone.size_bytes if gone else 0,
            reason=f"asked{by} (corral datasets evict)" + ("" if gone else "; this node's cache did not hold it")))

    # --- one dataset of one attempt ---------------------------------------------------------

    def _current(self, job_id: str, attempt: int) -> bool:
        job = self._state().work.get(job_id)
        return job is not None and job.attempt == attempt

    async def _request(self, job_id: str, attempt: int, ds: Dataset) -> None:
        key = ds.key
        task = self._keys.get(key)
        if task is None:
            entry = self.cache.get(key)
            if entry is not None:
                self.cache.touch(key)
                log.info("dataset_cached", node_id=self.node_id, job_id=job_id, attempt=attempt, dataset=ds.name,
                         key=key, bytes=entry.size_bytes)
                await self._ready(job_id, attempt, ds, entry.size_bytes, cached=True, staged=0)
                return
            task = self._keys[key] = self._spawn(self._stage_key(ds))
            task.add_done_callback(lambda _t: self._keys.pop(key, None))
        told = (-1, -1)
        while True:
            done, total = self._progress.get(key, (0, 0))
            if (done, total) != told and self._current(job_id, attempt):
                told = (done, total)
                await self._append(DatasetStaging(
                    event_id=f"dataset-staging:{job_id}:{attempt}:{self.node_id}:{ds.name}:{self.incarnation}:"
                             f"{self._next()}",
                    occurred_at=time.time(), job_id=job_id, attempt=attempt, node_id=self.node_id, dataset=ds.name,
                    key=key, bytes_done=done, bytes_total=total))
            await asyncio.wait({task}, timeout=self.progress_s)
            if task.done():
                break
            if not self._current(job_id, attempt):
                if not self._wanted(key):
                    task.cancel()  # (no job here wants it any more: its child is killed, its directory deleted)
                    log.info("dataset_staging_cancelled", node_id=self.node_id, job_id=job_id, attempt=attempt,
                             key=key)
                return
        try:
            result = task.result()
        except (Stopped, asyncio.CancelledError):
            return
        except StagingError as e:
            await self._failed(job_id, attempt, ds, str(e), permanent=e.permanent)
            return
        except Exception as e:  # a bug here must end the attempt with a reason, not hang the gang
            log.exception("dataset_staging_crashed", job_id=job_id, dataset=ds.name)
            await self._failed(job_id, attempt, ds, f"staging crashed: {type(e).__name__}: {e}")
            return
        assert isinstance(result, tuple)
        entry, staged = result
        await self._ready(job_id, attempt, ds, entry.size_bytes, cached=False, staged=staged)

    async def _ready(self, job_id: str, attempt: int, ds: Dataset, size: int, *, cached: bool, staged: int) -> None:
        if not self._current(job_id, attempt):
            await self.announce()  # the attempt is over, but the node holds the dataset now: the log should know
            return
        await self._append(DatasetReady(
            event_id=f"dataset-ready:{job_id}:{attempt}:{self.node_id}:{ds.name}", occurred_at=time.time(),
            job_id=job_id, attempt=attempt, node_id=self.node_id, dataset=ds.name, key=ds.key, size_bytes=size,
            cached=cached, staged_bytes=staged))

    async def _failed(self, job_id: str, attempt: int, ds: Dataset, reason: str, *, permanent: bool = False) -> None:
        log.warning("dataset_failed", node_id=self.node_id, job_id=job_id, attempt=attempt, dataset=ds.name,
                    reason=reason, permanent=permanent)
        if not self._current(job_id, attempt):
            return
        await self._append(DatasetFailed(
            event_id=f"dataset-failed:{job_id}:{attempt}:{self.node_id}:{ds.name}", occurred_at=time.time(),
            job_id=job_id, attempt=attempt, node_id=self.node_id, dataset=ds.name, key=ds.key, reason=reason,
            permanent=permanent))

    # --- one cache key ------------------------------------------------------------------

    async def _stage_key(self, ds: Dataset) -> tuple[Entry, int]:
        """Stage `ds` into the cache under its key: room, fetch into `.tmp/`, room again, rename into place."""
        key = ds.key
        t0 = time.monotonic()
        need = await size_in_child(ds, self._stop, limits=self.limits, s3_endpoint_url=self.s3_endpoint_url)
        if need > self.limits.fetch_limit():  # (never fits here, whatever is evicted: a limit, not a full cache)
            raise Refused(f"{ds.source} is {need} bytes, more than the {self.limits.fetch_limit()} a staging may "
                          "fetch here (--dataset-cache-bytes, --dataset-max-bytes)")
        await self._make_room(need, key)
        tmp = await asyncio.to_thread(self.cache.temp_dir, key)
        try:
            log.info("dataset_staging", node_id=self.node_id, key=key, source=ds.source)
            try:
                read = await stage_in_child(ds, tmp / "data", self._progress_of(key), self._stop,
                                            limits=self.limits, s3_endpoint_url=self.s3_endpoint_url)
            except DiskFull as e:
                # More than foreseen (an archive that unpacks larger, a length not told): evict every entry no
                # job here uses, then once more from the start; a second full disk fails the attempt.
                async with self._room:
                    unused = self.cache.unused(self.in_use() - {key})
                    if not unused:
                        raise
                    log.warning("dataset_disk_full", node_id=self.node_id, key=key, evicting=len(unused), error=str(e))
                    await self._evict(unused, key, why="the disk filled up while staging")
                await asyncio.to_thread(self.cache.discard, tmp)
                tmp = await asyncio.to_thread(self.cache.temp_dir, key)
                read = await stage_in_child(ds, tmp / "data", self._progress_of(key), self._stop,
                                            limits=self.limits, s3_endpoint_url=self.s3_endpoint_url)
            size = await asyncio.to_thread(tree_bytes, tmp / "data")
            async with self._room:
                await self._evict(self.cache.room_for(size, self.in_use() - {key}), key)
                entry = await asyncio.to_thread(self.cache.commit, tmp, key, size, ds.source)
        except BaseException:
            await asyncio.shield(asyncio.to_thread(self.cache.discard, tmp))
            raise
        finally:
            self._progress.pop(key, None)
        secs = time.monotonic() - t0
        log.info("dataset_staged", node_id=self.node_id, key=key, bytes=size, read=read, seconds=round(secs, 3),
                 mb_per_s=round(read / 1e6 / secs, 1) if secs > 0 else None)
        return entry, read

    def _progress_of(self, key: str) -> Callable[[int, int], None]:
        def progress(done: int, total: int) -> None:
            self._progress[key] = (done, total)
        return progress

    async def _make_room(self, need: int, key: str) -> None:
        if need <= 0:
            return
        async with self._room:
            in_use = self.in_use() - {key}
            await self._evict(self.cache.room_for(need, in_use), key)
            # and on the disk itself (a cache without a limit, or a disk shared with others)
            await self._evict(self.cache.room_on_disk(need, in_use, margin=DISK_MARGIN), key,
                              why="the disk holding the cache lacks room")

    async def _evict(self, entries: list[Entry], for_key: str, why: str = "") -> None:
        for e in entries:
            gone = await asyncio.to_thread(self.cache.evict, e.key)
            if gone is None:
                continue
            log.info("dataset_evicted", node_id=self.node_id, key=e.key, bytes=e.size_bytes, for_key=for_key)
            await self._append(DatasetEvicted(
                event_id=f"dataset-evicted:{self.node_id}:{e.key}:{self.incarnation}:{self._next()}",
                occurred_at=time.time(), node_id=self.node_id, key=e.key, size_bytes=e.size_bytes,
                reason=f"least recently used, in use by no job here; room for {for_key} "
                       + (f"({why})" if why else f"(limit {self.cache.limit_bytes} bytes)")))

    def _next(self) -> int:
        self._n += 1
        return self._n


def expected_bytes(ds: Dataset, s3_endpoint_url: str | None = None) -> int:
    """What staging `ds` will need, as far as is known beforehand (a directory's size, a Content-Length, an S3
    object's or prefix's size); 0: not known (room is then made once its real size is)."""
    scheme = source_scheme(ds.source)
    if scheme == "file":
        root = Path(ds.source.removeprefix("file://"))
        return tree_bytes(root) if root.is_dir() else 0
    if scheme in ("http", "https"):
        try:
            req = urllib.request.Request(ds.source, method="HEAD")
            with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as resp:
                return int(resp.headers.get("Content-Length") or 0)
        except (OSError, ValueError, urllib.error.URLError, http.client.HTTPException):
            return 0  # the download itself says what is wrong
    if scheme == "s3":
        from nodeagent.datasets import s3  # (boto3, the optional extra corral[s3], only when it is used)

        return s3.expected_bytes(ds.source, s3_endpoint_url)
    return 0


__all__ = ["CacheFull", "Stager"]
