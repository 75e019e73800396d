"""Dataset staging as the simulator plays it (issue #33): per-node links, per-node LRU caches, staging time.

A job with datasets starts its ranks only once every node of its gang holds
every dataset (the real agents' rule, core/staging.py). Here each node has one
staging link of `SimConfig.staging_gbps` GB/s, used by one dataset at a time
in the order they were asked for (a node staging for two jobs serves them one
after the other), and a cache of `SimConfig.cache_gb` GB (0: unbounded). A
dataset the node holds, or is already staging for another job, costs nothing
more. A node's staging ends at its link's turn plus size / bandwidth; the
gang's at the slowest node's end. Then the node holds it: the cache inserts it
and evicts the least recently used entries that no gang holding GPUs on that
node uses (never one in use; a cache full of entries in use stays over its
size until they are released, as a real node would have to), each told as
DatasetEvicted; the scheduler then sees the node warm through DatasetReady.

Every number is a function of the log so far: the same scenario stages alike.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

from orchestrator.core.model.state import ClusterState, Job
from orchestrator.sim.specs import dataset_sizes
from schemas.events import DatasetEvicted, DatasetReady, Event


class Item(NamedTuple):
    """One dataset of one attempt on one node."""

    node_id: str
    name: str
    key: str
    size: int
    #: The node held it, or was staging it for someone else, when asked: nothing more to move.
    cached: bool
    #: When it is on the node.
    ready_at: float


class Plan(NamedTuple):
    """The staging of one attempt: its items and when the last one is ready."""

    job_id: str
    attempt: int
    asked_at: float
    ready_at: float
    items: tuple[Item, ...]


class StagingStats(NamedTuple):
    """What staging cost a run (SimResult.staging; None for a run without datasets)."""

    #: Attempts that staged (each gang placement of a job with datasets), and the seconds from placement to
    #: the last node's last dataset, summed over them.
    attempts: int
    seconds: float
    #: GPU-seconds a gang held while its nodes staged (its GPUs idle).
    gpu_seconds: float
    #: (node, dataset) pairs asked for, those the node held already (or was staging), bytes moved.
    items: int
    hits: int
    bytes_staged: int
    evictions: int
    #: Per job, its staging seconds over all attempts.
    per_job: dict[str, float]


class Stager:
    def __init__(self, gbps: float, cache_gb: float) -> None:
        self.rate = gbps * 1e9
        self.capacity = int(cache_gb * 1e9)
        #: node -> key -> size, least recently used first.
        self.caches: dict[str, OrderedDict[str, int]] = {}
        #: (node, key) -> when the staging in flight ends.
        self.inflight: dict[tuple[str, str], float] = {}
        #: node -> when its link is free again.
        self.link_free: dict[str, float] = {}
        self.attempts = 0
        self.seconds = 0.0
        self.gpu_seconds = 0.0
        self.items = 0
        self.hits = 0
        self.bytes = 0
        self.evictions = 0
        self.per_job: dict[str, float] = {}

    def plan(self, job: Job, now: float) -> Plan:
        """Ask every node of the gang for every dataset of the job; when each is there."""
        sizes = dataset_sizes(job.spec)
        items: list[Item] = []
        for node in dict.fromkeys(rp.node_id for rp in job.placement):
            cache = self.caches.setdefault(node, OrderedDict())
            for d in job.spec.dataset_list:
                key = d.key
                if key in cache:
                    cache.move_to_end(key)  # used now
                    items.append(Item(node, d.name, key, cache[key], True, now))
                    continue
                flying = self.inflight.get((node, key))
                if flying is not None:  # staging for another gang: ready when that ends
                    items.append(Item(node, d.name, key, sizes[d.name], True, max(now, flying)))
                    continue
                size = sizes[d.name]
                start = max(now, self.link_free.get(node, now))
                end = start + (size / self.rate if self.rate > 0 else 0.0)
                self.link_free[node] = end
                self.inflight[(node, key)] = end
                self.bytes += size
                items.append(Item(node, d.name, key, size, False, end))
        ready = max((it.ready_at for it in items), default=now)
        self.attempts += 1
        self.items += len(items)
        self.hits += sum(1 for it in items if it.cached)
        self.seconds += ready - now
        self.gpu_seconds += (ready - now) * job.gpus
        self.per_job[job.job_id] = self.per_job.get(job.job_id, 0.0) + (ready - now)
        return Plan(job.job_id, job.attempt, now, ready, tuple(items))

    def land(self, plan: Plan, state: ClusterState, now: float) -> list[Event]:
        """The attempt's datasets are on its nodes: DatasetReady for each, and the evictions they cause."""
        out: list[Event] = []
        for it in plan.items:
            out += self._insert(it, state, now)
            out.append(DatasetReady(event_id=f"sim:ready:{plan.job_id}:{plan.attempt}:{it.node_id}:{it.name}",
                                    occurred_at=now, job_id=plan.job_id, attempt=plan.attempt, node_id=it.node_id,
                                    dataset=it.name, key=it.key, size_bytes=it.size, cached=it.cached,
                                    staged_bytes=0 if it.cached else it.size))
        return out

    def _insert(self, it: Item, state: ClusterState, now: float) -> list[Event]:
        cache = self.caches.setdefault(it.node_id, OrderedDict())
        self.inflight.pop((it.node_id, it.key), None)
        if it.key in cache:
            return []
        cache[it.key] = it.size
        if self.capacity <= 0:
            return []
        out: list[Event] = []
        total = sum(cache.values())
        if total <= self.capacity:
            return out
        busy = in_use(state, it.node_id) | {it.key}
        for key in list(cache):
            if total <= self.capacity:
                break
            if key in busy:
                continue
            size = cache.pop(key)
            total -= size
            self.evictions += 1
            out.append(DatasetEvicted(event_id=f"sim:evict:{it.node_id}:{key}:{self.evictions}", occurred_at=now,
                                      node_id=it.node_id, key=key, size_bytes=size,
                                      reason="least recently used, over the cache size"))
        return out

    def stats(self) -> StagingStats:
        return StagingStats(self.attempts, self.seconds, self.gpu_seconds, self.items, self.hits, self.bytes,
                            self.evictions, dict(self.per_job))


def in_use(state: ClusterState, node_id: str) -> set[str]:
    """Cache keys the gangs holding GPUs on `node_id` use (staging or running): never evicted."""
    keys: set[str] = set()
    for jid in state.active:
        job = state.jobs[jid]
        if job.spec.dataset_list and any(rp.node_id == node_id for rp in job.placement):
            keys.update(d.key for d in job.spec.dataset_list)
    return keys
