"""`corral datasets` and `corral nodes --datasets`: which node's dataset cache holds what (issue #33).

Pure functions of the folded state: each node's cache entries with size and
last use (`ClusterState.dataset_cache`, core/caches.py), and the names jobs
gave each cache key in their specs (a key is the digest when given, else a
hash of the source: schemas/datasets.py).
"""

from __future__ import annotations

import re
from typing import Any

from orchestrator.cli.errors import NOT_FOUND, CliError
from orchestrator.cli.output import human_duration
from orchestrator.core.model.state import ClusterState, Node
from schemas.datasets import DIGEST_RE


def bytes_text(n: int) -> str:
    """1_500_000_000 -> "1.5 GB" (decimal units, as dataset sizes are quoted)."""
    size = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"


def names_by_key(state: ClusterState) -> dict[str, list[str]]:
    """Cache key -> the names jobs the fold keeps gave it (sorted; one key may have several names)."""
    out: dict[str, set[str]] = {}
    for job in state.jobs.values():
        for d in job.spec.dataset_list:
            out.setdefault(d.key, set()).add(d.name)
    return {k: sorted(v) for k, v in out.items()}


def node_datasets(state: ClusterState, node: Node) -> list[dict[str, Any]]:
    """A node's cache entries (the fold's keys, with size and last use where the log told them)."""
    entries = {d.key: d for d in state.dataset_cache.get(node.node_id, ())}
    names = names_by_key(state)
    out = []
    for key in sorted(set(node.datasets) | set(entries)):
        e = entries.get(key)
        out.append({"key": key, "names": names.get(key, []), "size_bytes": e.size_bytes if e else None,
                    "last_used": e.last_used if e and e.last_used else None})
    return out


def cache_text(entries: list[dict[str, Any]]) -> str:
    """"2 (152.0 GB): imagenet, tokens" -- a node's cache in one cell."""
    if not entries:
        return "-"
    total = sum(e["size_bytes"] or 0 for e in entries)
    names = ", ".join(", ".join(e["names"]) or e["key"][:19] for e in entries)
    return f"{len(entries)} ({bytes_text(total)}): {names}"


def datasets_summary(state: ClusterState) -> list[dict[str, Any]]:
    """Every cached dataset: its key, names, size, the nodes holding it and when each last used it."""
    names = names_by_key(state)
    by_key: dict[str, dict[str, Any]] = {}
    for node_id in sorted(state.nodes):
        for e in node_datasets(state, state.nodes[node_id]):
            d = by_key.setdefault(e["key"], {"key": e["key"], "names": names.get(e["key"], []), "size_bytes": None,
                                             "nodes": [], "last_used": None})
            d["nodes"].append({"node_id": node_id, "size_bytes": e["size_bytes"], "last_used": e["last_used"]})
            if e["size_bytes"] is not None:
                d["size_bytes"] = max(d["size_bytes"] or 0, e["size_bytes"])
            if e["last_used"] is not None:
                d["last_used"] = max(d["last_used"] or 0.0, e["last_used"])
    return [by_key[k] for k in sorted(by_key, key=lambda k: (names.get(k, [k]), k))]


DATASETS_HEADERS = ("DATASET", "KEY", "SIZE", "NODES", "LAST USED")


def datasets_rows(summary: list[dict[str, Any]], now: float) -> list[list[Any]]:
    rows = []
    for d in summary:
        size = bytes_text(d["size_bytes"]) if d["size_bytes"] is not None else "-"
        used = f"{human_duration(max(0.0, now - d['last_used']))} ago" if d["last_used"] else "-"
        rows.append([", ".join(d["names"]) or "-", d["key"], size, " ".join(n["node_id"] for n in d["nodes"]), used])
    return rows


_KEY_RE = re.compile(r"(?:sha256|src)-[0-9a-f]{32,64}")


def evict_targets(state: ClusterState, what: str, node_id: str | None = None) -> list[tuple[str, str]]:
    """(node, cache key) of each cached copy `corral datasets evict WHAT [--node N]` asks to drop.

    WHAT is a cache key (`src-...`, `sha256-...`), a digest (`sha256:<hex>`) or a dataset's name in job specs:
    a name covers every key jobs gave it (a local directory edited between jobs is one key per version).
    Only copies the log says a node holds (on `node_id` alone with --node); none is a NOT_FOUND error.
    """
    digest = DIGEST_RE.fullmatch(what)
    if _KEY_RE.fullmatch(what):
        keys = {what}
    elif digest:
        keys = {f"sha256-{digest.group(1).lower()}"}
    else:
        keys = {k for k, names in names_by_key(state).items() if what in names}
        if not keys:
            raise CliError(f"no dataset named {what!r} in the log's jobs; give a name, a cache key or a digest "
                           "(`corral datasets` lists them)", NOT_FOUND)
    if node_id is not None and node_id not in state.nodes:
        raise CliError(f"unknown node {node_id!r}; known: {', '.join(state.nodes) or 'none registered'}", NOT_FOUND)
    nodes = [node_id] if node_id is not None else sorted(state.nodes)
    out = [(n, k) for n in nodes for k in sorted(keys) if k in state.nodes[n].datasets]
    if not out:
        holder = f"node {node_id} does not hold" if node_id is not None else "no node holds"
        raise CliError(f"{holder} {what} in its dataset cache (`corral datasets` lists what each node holds)",
                       NOT_FOUND)
    return out
