"""Each node's view, as of a log position, in a KV bucket: where an agent starts (issue #40).

An agent folds only its node's slice of the log (events/subjects.py:
`slice_filters`). To start without reading that slice from the beginning of
time, it loads its node's view -- the scheduler's state projected onto the
node (orchestrator/core/node_view.py: `node_view_of`) -- and reads its slice
after the view's position. The scheduler writes the views before each of its
snapshots: first every node whose slice changed since its view was last
written (every node after a start), then the `_base` record, the position all
views are current through. So a node whose view is older than `_base` had no
event of its slice in between, and starts its slice after `_base`; a node
with no view at all (never registered) starts from `_base` too. Retention
never removes what an agent needs: the archiver cuts no later than `_base`
(`base_seq`; orchestrator/archiver.py), so every stored view's slice is
still in the stream.

The views are derived and rebuildable: a deleted bucket is written whole by
the next scheduler start, and without one an agent reads its slice from the
stream's start. One small versioned format, checked whole:

    b"CORRALNV" | format (u32, big-endian) | seq (u64) | sha256 of the body | body (msgpack)

A view that fails its checksum, is truncated or was written by a newer format
is skipped with one log line naming the node and why: the agent then reads its
slice from the log's start (never from `_base`, whose slice is empty), which
reads more, never a wrong state. Once retention trimmed the stream's head that
start is only in the archive: an agent given `--archive PATH` (or
CORRAL_ARCHIVE) reads its slice there, filtered as the server would
(events/history.py); without one it stops naming the positions and the flag.

The bus layer knows no view type: callers pass theirs (`load(node, NodeView)`).
"""

from __future__ import annotations

import asyncio
import hashlib
import struct
from collections.abc import Iterable
from typing import Any, TypeVar

import msgspec
import nats.errors
import structlog
from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NotFoundError
from nats.js.kv import KeyValue

log = structlog.get_logger("corral.nodeviews")

NODEVIEW_BUCKET = "corral-nodeviews"
#: The record of the position every stored view is current through (not a node id: those start alnum).
BASE = "_base"
MAGIC = b"CORRALNV"
FORMAT = 1
_PREFIX = struct.Struct(">8sIQ32s")
#: Puts in flight at once when many views are written (a scheduler's first flush writes every node's).
_PARALLEL = 64

V = TypeVar("V")

_encoder = msgspec.msgpack.Encoder()


class Corrupt(ValueError):
    """A stored view that cannot be used: why, in words."""


def encode(view: Any, seq: int) -> bytes:
    body = _encoder.encode(view)
    return _PREFIX.pack(MAGIC, FORMAT, seq, hashlib.sha256(body).digest()) + body


def decode(data: bytes, kind: type[V]) -> tuple[int, V]:
    """(seq, view) of a stored record; raises Corrupt saying why it cannot be used."""
    if len(data) < _PREFIX.size:
        raise Corrupt(f"truncated ({len(data)} bytes)")
    magic, fmt, seq, digest = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise Corrupt("not a node view")
    if fmt > FORMAT:
        raise Corrupt(f"written by a newer corral (format {fmt}, this one reads {FORMAT})")
    body = data[_PREFIX.size:]
    if hashlib.sha256(body).digest() != digest:
        raise Corrupt("checksum mismatch (a flipped byte or a truncated write)")
    try:
        return seq, msgspec.msgpack.decode(body, type=kind)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise Corrupt(f"does not decode: {e}") from None


class NodeViewStore:
    """The `corral-nodeviews` bucket: the scheduler writes, each agent reads its own node's."""

    def __init__(self, js: JetStreamContext, *, replicas: int = 1) -> None:
        self.js = js
        self.replicas = replicas
        self._kv: KeyValue | None = None

    async def _bucket(self, create: bool) -> KeyValue | None:
        if self._kv is None:
            try:
                self._kv = await self.js.key_value(NODEVIEW_BUCKET)
            except BucketNotFoundError:
                if not create:
                    return None
                from nats.js.api import KeyValueConfig

                self._kv = await self.js.create_key_value(KeyValueConfig(bucket=NODEVIEW_BUCKET, history=1,
                                                                         replicas=self.replicas))
        return self._kv

    async def save(self, views: Iterable[tuple[str, Any]], seq: int, base: Any | None) -> int:
        """Write each (node, view) at `seq`, then `base` (the view of a node with none) as current through
        `seq`: in that order, so a reader that finds `_base` at `seq` finds every changed view written. Returns
        how many views it wrote. `base` None: the views only (a part of a flush; its last part writes `base`)."""
        kv = await self._bucket(create=True)
        assert kv is not None
        pending: set[asyncio.Task[int]] = set()
        n = 0
        for node, view in views:
            if len(pending) >= _PARALLEL:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    t.result()
            pending.add(asyncio.ensure_future(kv.put(node, encode(view, seq))))
            n += 1
        if pending:
            await asyncio.gather(*pending)
        if base is not None:
            await kv.put(BASE, encode(base, seq))
        return n

    async def load(self, node_id: str, kind: type[V]) -> tuple[int, V] | None:
        """The newest usable start for `node_id`: its own view, or `_base` when that is newer or it has none
        (with the position the view is current through); None when the bucket holds neither."""
        kv = await self._bucket(create=False)
        if kv is None:
            return None
        # `_base` first: a view read after it is at least as new as the flush that wrote it (module docstring).
        base = await self._get(kv, BASE, kind)
        try:
            own = await self._get(kv, node_id, kind)
        except Corrupt:
            return None  # what the node held is unknown: its slice from the start, never `_base`'s empty one
        if own is None:
            return base
        if base is not None and base[0] > own[0]:
            return base[0], own[1]  # no event of its slice since its view: the view holds through `_base`
        return own

    async def base_seq(self) -> int | None:
        """The position `_base` says every view is current through (checked, not decoded); None: no bucket, no
        `_base`, or one that fails its check (the next flush writes it again). Errors reading go to the caller."""
        kv = await self._bucket(create=False)
        if kv is None:
            return None
        try:
            entry = await kv.get(BASE)
        except (KeyNotFoundError, NotFoundError):
            return None
        data = entry.value or b""
        if len(data) < _PREFIX.size:
            return None
        magic, fmt, seq, digest = _PREFIX.unpack_from(data)
        if magic != MAGIC or fmt > FORMAT or hashlib.sha256(data[_PREFIX.size:]).digest() != digest:
            return None
        return int(seq)

    async def _get(self, kv: KeyValue, key: str, kind: type[V]) -> tuple[int, V] | None:
        try:
            entry = await kv.get(key)
        except (KeyNotFoundError, NotFoundError):
            return None
        except (nats.errors.Error, TimeoutError) as e:
            log.warning("nodeview_unreadable", key=key, error=repr(e))
            return None
        if not entry.value:
            return None
        try:
            return decode(entry.value, kind)
        except Corrupt as e:
            log.warning("nodeview_skipped", key=key, why=str(e))
            if key == BASE:
                return None
            raise
