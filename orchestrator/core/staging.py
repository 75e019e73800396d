"""The fold of dataset staging (issue #33): which node holds which dataset, and each attempt's staging phase.

Agents stage a job's datasets before its ranks start (nodeagent/datasets/) and
tell the log: DatasetStaging (progress), DatasetReady, DatasetFailed; their
caches' contents with NodeDatasets and DatasetEvicted. The fold keeps

- per node, the cache keys it holds (`Node.datasets`), which placement reads
  to prefer warm nodes, and the evictions an operator asked of it
  (DatasetEvictRequested) until its DatasetEvicted (`Node.evict_requests`);
- per job, the current attempt's staging (`Job.staging`): when it began, each
  (node, dataset)'s progress, and when the last one was ready, which is when
  the agents may start the gang's ranks (`staged`);
- a DatasetFailed as the attempt's `failure`, so react ends the attempt the
  way it ends one whose rank crashed: restarted with backoff while restarts
  remain, else failed, with the agent's reason in `corral job`; a permanent
  one (the archive is hostile or too large, a limit passed: the
  same anywhere) fails the job at once, never restarted onto another node.

Reports about an attempt that is not the job's current one holding GPUs, a
node not in its placement, or a dataset its spec does not name change
nothing (a late report of an earlier attempt must not start a later one).
"""

from __future__ import annotations

from msgspec.structs import replace

from orchestrator.core.evolve_jobs import active
from orchestrator.core.model.state import ClusterState, EvictRequest, Job, StagedDataset, Staging
from schemas.events import (
    DatasetEvicted,
    DatasetEvictRequested,
    DatasetFailed,
    DatasetReady,
    DatasetStaging,
    NodeDatasets,
)

#: Most characters of an agent's reason kept in a job's failure.
REASON_CHARS = 500


def staged(job: Job) -> bool:
    """Whether the current attempt's ranks may start as far as datasets go: none asked, or all ready everywhere."""
    if not job.spec.dataset_list:
        return True
    s = job.staging
    return s is not None and s.attempt == job.attempt and s.ready


def _attempt_job(state: ClusterState, e: DatasetStaging | DatasetReady | DatasetFailed) -> Job | None:
    job = active(state, e.job_id, e.attempt)
    if job is None or all(p.node_id != e.node_id for p in job.placement):
        return None
    if all(d.name != e.dataset for d in job.spec.dataset_list):
        return None
    return job


def _staging(job: Job, attempt: int, at: float) -> Staging:
    s = job.staging
    return s if s is not None and s.attempt == attempt else Staging(attempt=attempt, started_at=at)


def _item(s: Staging, node_id: str, dataset: str) -> tuple[int, StagedDataset | None]:
    for i, it in enumerate(s.items):
        if it.node_id == node_id and it.dataset == dataset:
            return i, it
    return -1, None


def _with(s: Staging, i: int, item: StagedDataset) -> Staging:
    items = (*s.items, item) if i < 0 else (*s.items[:i], item, *s.items[i + 1:])
    return replace(s, items=items)


def dataset_staging(state: ClusterState, e: DatasetStaging, at: float) -> None:
    job = _attempt_job(state, e)
    if job is None:
        return
    s = _staging(job, e.attempt, at)
    i, it = _item(s, e.node_id, e.dataset)
    if it is not None and it.ready:
        return  # a late progress report of what is ready already
    item = StagedDataset(node_id=e.node_id, dataset=e.dataset, key=e.key, bytes_done=e.bytes_done,
                         bytes_total=e.bytes_total, since=it.since if it is not None else at)
    state.jobs[e.job_id] = replace(job, staging=_with(s, i, item))


def dataset_ready(state: ClusterState, e: DatasetReady, at: float) -> None:
    _hold(state, e.node_id, e.key)
    job = _attempt_job(state, e)
    if job is None:
        return
    s = _staging(job, e.attempt, at)
    i, it = _item(s, e.node_id, e.dataset)
    if it is not None and it.ready:
        return  # duplicate
    item = StagedDataset(node_id=e.node_id, dataset=e.dataset, key=e.key, bytes_done=e.size_bytes,
                         bytes_total=e.size_bytes, ready=True, cached=e.cached, size_bytes=e.size_bytes,
                         staged_bytes=e.staged_bytes, since=it.since if it is not None else at, ready_at=at)
    s = _with(s, i, item)
    nodes = {p.node_id for p in job.placement}
    if not s.ready and sum(1 for x in s.items if x.ready) >= len(nodes) * len(job.spec.dataset_list):
        s = replace(s, ready=True, ready_at=at)
    state.jobs[e.job_id] = replace(job, staging=s)


def dataset_failed(state: ClusterState, e: DatasetFailed, at: float) -> None:
    job = _attempt_job(state, e)
    if job is None:
        return
    s = _staging(job, e.attempt, at)
    why = f"dataset {e.dataset} on {e.node_id}: {e.reason[:REASON_CHARS]}"
    state.jobs[e.job_id] = replace(job, staging=s if s.failed else replace(s, failed=why, permanent=e.permanent),
                                   failure=job.failure or why)


def failed_for_good(job: Job) -> bool:
    """Whether the current attempt's staging failed in a way no restart mends (DatasetFailed.permanent: a hostile
    or oversized archive, a limit passed): the job fails once with the reason (#39)."""
    s = job.staging
    return s is not None and s.attempt == job.attempt and s.permanent and job.failure == s.failed


def dataset_evicted(state: ClusterState, e: DatasetEvicted) -> None:
    """The entry is gone: from the node's keys, and any request to evict it is done."""
    node = state.nodes.get(e.node_id)
    if node is not None and (e.key in node.datasets or any(r.key == e.key for r in node.evict_requests)):
        state.nodes[e.node_id] = replace(node, datasets=tuple(k for k in node.datasets if k != e.key),
                                         evict_requests=tuple(r for r in node.evict_requests if r.key != e.key))


def node_datasets(state: ClusterState, e: NodeDatasets) -> None:
    node = state.nodes.get(e.node_id)
    if node is not None:
        keys = {d.key for d in e.datasets}
        # (a request for a key the cache no longer holds is moot: its agent restarted without it)
        state.nodes[e.node_id] = replace(node, datasets=tuple(sorted(keys)),
                                         evict_requests=tuple(r for r in node.evict_requests if r.key in keys))


def evict_requested(state: ClusterState, e: DatasetEvictRequested, seq: int) -> None:
    """Remember the request until the node's DatasetEvicted of the key (one per key: the first one stands)."""
    node = state.nodes.get(e.node_id)
    if node is None or not e.key or any(r.key == e.key for r in node.evict_requests):
        return
    request = EvictRequest(key=e.key, requested_by=e.requested_by, seq=seq)
    state.nodes[e.node_id] = replace(node, evict_requests=(*node.evict_requests, request))


def _hold(state: ClusterState, node_id: str, key: str) -> None:
    node = state.nodes.get(node_id)
    if node is not None and key and key not in node.datasets:
        state.nodes[node_id] = replace(node, datasets=tuple(sorted((*node.datasets, key))))
