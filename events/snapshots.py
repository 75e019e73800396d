"""Snapshots of a projection, kept by log position in a JetStream object store: every reader starts from one.

A snapshot is a fold of the log up to its `seq`, so a reader that needs the
state at position P loads the newest snapshot at or before P and folds the
log's tail after it (the scheduler, node agents, the CLI). The store keeps the
newest few (KEEP), one object per position (`<name>.<seq>`), so a snapshot
that cannot be used falls back to the one before it, and the oldest kept
one's position is how far back the log must still be readable.

One versioned format (FORMAT), read whole or refused:

    b"CORRALSN" | format (u32, big-endian) | header length (u32) | header (JSON) | body

The header (`Header`) names the writer's corral version, the state's `seq`,
the body's codec, length and sha256. The body is the state as msgpack,
zlib-compressed when that saves more than a tenth. A snapshot that cannot be
used -- written by a newer corral, checksum or length mismatch (a flipped
byte, a truncated write), not a snapshot at all, unreadable (no permission,
deleted while read), a body that does not decode into the state type, or a
state whose `seq` is not the header's -- is skipped for an older one, or the
log, with one log line naming it and why: a slower start, never a wrong state.

What the fold could not read (#30): a reader folds an event type it does not
know as "no change" (schemas/codec.py: Unknown), so after a rollback an older
scheduler's snapshot lacks what those events did (a QueueDeleted an older
release skipped leaves the queue defined). The header records the types its
fold skipped for that reason (`skipped`), and a reader that decodes any of them
never uses the snapshot: it takes an older one or the log, and logs why. A
snapshot whose header has no such record (`skipped` is None: written before
the record existed, or folded on from such a snapshot) may have skipped any
type its writer did not know; every corral that wrote format 3 without the
record decoded exactly UNRECORDED_DECODED, so it is used only by a reader that
decodes nothing more (`suspect`). Only unknown *types* are recorded: a known
type with fields that do not decode is skipped by every release alike (events
only gain fields with defaults and never change a field's type; a change of
type is a new tag), so recording it would only make snapshots unusable after
one poison message.

The bus layer knows no state type: callers pass theirs (`load(ClusterState)`),
and anything with a `seq` that msgspec encodes can be stored. Readers only
read: `load` and `newest_seq` never create the bucket (an agent may not).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import importlib.metadata
import io
import re
import struct
import zlib
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

import msgspec
import structlog
from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, NotFoundError

from schemas.codec import UPCASTERS
from schemas.events import EVENT_TAGS

log = structlog.get_logger("corral.snapshot")

SNAPSHOT_BUCKET = "corral-snapshots"
#: The object store's stream (nats-py names it OBJ_<bucket>).
SNAPSHOT_STREAM = f"OBJ_{SNAPSHOT_BUCKET}"
#: The scheduler's snapshots of ClusterState, which every reader of the cluster state uses.
CLUSTER = "scheduler"

MAGIC = b"CORRALSN"
#: Bump when the header or a stored state's layout changes incompatibly: an older corral then
#: refuses the new snapshots by name ("written by a newer corral"), and a newer one skips the old.
FORMAT = 4  # 3: this container, several snapshots by position; ClusterState.unended, Node.failed_seq, Job.not_before
# 4: the line key holds the job's claim (Job.claim, ClusterState.lines: issue #29)
# (Formats 1-2 were a bare msgpack ClusterState in one object, `scheduler.v<N>`: skipped, and deleted by the next save.)
#
# Not bumped for fields added with a default, which every version decodes (unknown fields are
# skipped, missing ones take their default): ClusterState.durations (learned run times) loads
# empty from an older snapshot and fills with new completions. A field that a reader derives
# decisions from and that only a full fold fills correctly (ClusterState.unended) is not such a
# field: it needs a bump.
#
# The fold's derived indexes (ClusterState.lines, unexplained, stopping, watch, ends,
# ends_changes/ends_dropped and the nodes_rev/alloc_rev counters) are stored, not rebuilt on
# load, on purpose. `lines` and `watch` are in the log's order (the order queues got a line,
# gangs came to need a look), which decide's heads and follow-ups follow; rebuilt from `jobs`
# they come out in another order (at a third of the positions of a simulated 800-job log), so
# a restarted scheduler could order its decisions unlike one that folded the log. The others are
# stored so that a restored state stays byte-equal to a full replay's (state_digest, the
# failover tests). A snapshot written before an index existed rebuilds it on load
# (ClusterState.__post_init__), so such snapshots still load.

#: Snapshots kept per name: a bad newest one leaves three to fall back on before the whole log.
KEEP = 4
#: Compressed bodies are kept only when they save more than this fraction.
_PAYS = 0.9
_PREFIX = struct.Struct(">8sII")
#: A snapshot read that delivers less than this many bytes a second (plus a fixed allowance) is
#: given up: an object deleted while read would otherwise never deliver its last chunk.
_READ_RATE = 5_000_000
_READ_ALLOWANCE_S = 30.0
_NAME_RE = re.compile(r"(?P<name>.+)\.(?P<seq>\d{15})")
_LEGACY_RE = re.compile(r"(?P<name>.+)\.v\d+")

#: The event types (and upcast tags) every corral that wrote format 3 before snapshots recorded their
#: skipped types decoded (f2e94a3 up to #30): a snapshot without the record may have skipped any other.
#: Frozen on purpose, never derived from EVENT_TAGS: a type added later is exactly one such a snapshot
#: may have skipped.
UNRECORDED_DECODED: frozenset[str] = frozenset({
    "CancelRequested", "Checkpointed", "ClusterConfigured", "GangReserved", "GangRestarted", "JobCancelled",
    "JobCompleted", "JobFailed", "JobRejected", "JobRequeued", "JobRunning", "JobSubmitted", "JobWaiting",
    "NodeCordoned", "NodeFailed", "NodeRecovered", "NodeRegistered", "NodeUncordoned", "Preempted",
    "PreemptionRequested", "QueueDefined", "QueueDeleted", "SchedulerElected", "WorkerExited", "WorkerStarted",
    "JobSubmitted.v0",
})

S = TypeVar("S")

Codec = Literal["msgpack", "msgpack+zlib"]


class Header(msgspec.Struct, frozen=True, kw_only=True):
    """What a snapshot says about itself (JSON, after the fixed prefix)."""

    format: int
    #: The writer's corral version (for the "written by a newer corral" message and forensics).
    corral: str
    #: The log position the state reflects.
    seq: int
    codec: Codec
    #: Bytes of the stored body and their sha256 (hex); `raw_length`: the msgpack's, uncompressed.
    length: int
    sha256: str
    raw_length: int
    #: Event types the fold up to `seq` skipped because its readers did not know them (sorted). None:
    #: not recorded (a writer before #30, or a fold that started from such a snapshot): see `suspect`.
    skipped: list[str] | None = None


def decoded_tags() -> frozenset[str]:
    """The event tags this corral decodes (its event types and the old tags it upcasts)."""
    return frozenset(EVENT_TAGS) | frozenset(UPCASTERS)


def suspect(header: Header, decodes: frozenset[str] | None = None) -> str | None:
    """Why a reader that decodes `decodes` (default: this corral's tags) must not use this snapshot: its
    fold skipped events of a type the reader folds (a rollback's snapshot). None: usable."""
    decodes = decoded_tags() if decodes is None else decodes
    writer = f"corral {header.corral}"
    if header.skipped is None:
        unknown = sorted(decodes - UNRECORDED_DECODED)
        if unknown:
            return (f"written by {writer} without a record of the event types its fold skipped; its writer may not "
                    f"have decoded {', '.join(unknown)}, which this corral folds")
        return None
    known = [t for t in header.skipped if t in decodes]
    if known:
        return (f"its fold skipped events of type {', '.join(known)} (written by {writer}, which could not decode "
                "them); this corral folds them")
    return None


@dataclass(frozen=True)
class Loaded(Generic[S]):
    """A snapshot's state and its header (what its fold skipped: a writer folding on carries it forward)."""

    state: S
    header: Header


class Unusable(Exception):
    """Why a snapshot cannot be used (the one line a reader logs before it falls back)."""


@functools.cache
def corral_version() -> str:
    try:
        return importlib.metadata.version("corral")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


_HEADER_DECODER = msgspec.json.Decoder(Header)


def encode_body(state: Any) -> bytes:
    """The state as msgpack: call it in the fold's own task (the fold mutates the state in place)."""
    return msgspec.msgpack.encode(state)


def pack(raw: bytes, seq: int, skipped: Collection[str] | None = ()) -> bytes:
    """A snapshot of the msgpack body `raw` of a state at `seq` (compressed if it pays); CPU only, thread-safe.

    `skipped`: the event types the fold up to `seq` could not decode (None: not known, module docstring).
    """
    body, codec = raw, "msgpack"
    if len(raw) > 4096:
        packed = zlib.compress(raw, 1)
        if len(packed) < _PAYS * len(raw):
            body, codec = packed, "msgpack+zlib"
    header = msgspec.json.encode(Header(format=FORMAT, corral=corral_version(), seq=seq, codec=codec,  # type: ignore[arg-type]
                                        length=len(body), sha256=hashlib.sha256(body).hexdigest(),
                                        raw_length=len(raw),
                                        skipped=None if skipped is None else sorted(set(skipped))))
    return b"".join((_PREFIX.pack(MAGIC, FORMAT, len(header)), header, body))


def encode(state: Any, skipped: Collection[str] | None = ()) -> bytes:
    """`state` (with a `seq`) as one snapshot."""
    return pack(encode_body(state), state.seq, skipped)


def read_header(data: bytes | memoryview) -> tuple[Header, memoryview]:
    """The header and the checked, still encoded body; Unusable if this is not a snapshot this corral reads."""
    view = memoryview(data)
    if len(view) < _PREFIX.size or bytes(view[:8]) != MAGIC:
        raise Unusable("not a corral snapshot (no CORRALSN header)")
    _, fmt, header_len = _PREFIX.unpack_from(view)
    end = _PREFIX.size + header_len
    if fmt > FORMAT:
        writer = _writer_of(view[_PREFIX.size:end])
        raise Unusable(f"written by a newer corral ({writer}format {fmt}; this corral reads <= {FORMAT})")
    if fmt < FORMAT:
        raise Unusable(f"written by an older corral (format {fmt}; this corral reads format {FORMAT})")
    if len(view) < end:
        raise Unusable(f"truncated: {len(view)} bytes, its header alone needs {end}")
    try:
        header = _HEADER_DECODER.decode(view[_PREFIX.size:end])
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise Unusable(f"unreadable header: {e}") from None
    body = view[end:]
    if header.format != fmt:
        raise Unusable(f"header says format {header.format}, its prefix {fmt}")
    if len(body) != header.length:
        what = "truncated" if len(body) < header.length else "longer than its header says"
        raise Unusable(f"{what}: body of {len(body)} bytes, header says {header.length}")
    if hashlib.sha256(body).hexdigest() != header.sha256:
        raise Unusable("checksum mismatch: the body is not what was written")
    return header, body


def unpack(header: Header, body: memoryview) -> bytes | memoryview:
    """The msgpack of a checked body (`read_header`); CPU only, thread-safe."""
    if header.codec == "msgpack":
        return body
    try:
        raw = zlib.decompressobj().decompress(body, header.raw_length + 1)
    except zlib.error as e:
        raise Unusable(f"body does not decompress: {e}") from None
    if len(raw) != header.raw_length:
        raise Unusable(f"body decompresses to {len(raw)} bytes, header says {header.raw_length}")
    return raw


def decode(data: bytes | memoryview, state_type: type[S]) -> tuple[Header, S]:
    """The header and the state of a snapshot; Unusable, saying why, for anything this corral cannot use."""
    header, body = read_header(data)
    return header, decode_state(header, unpack(header, body), state_type)


def decode_state(header: Header, raw: bytes | memoryview, state_type: type[S]) -> S:
    try:
        state = msgspec.msgpack.decode(raw, type=state_type)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise Unusable(f"body is not a {state_type.__name__}: {e}") from None
    seq = getattr(state, "seq", None)
    if seq != header.seq:
        raise Unusable(f"the state is at seq {seq}, its header says {header.seq}")
    return state


def _writer_of(header: memoryview) -> str:
    try:
        version = msgspec.json.decode(header).get("corral")
    except (msgspec.DecodeError, AttributeError):
        return ""
    return f"corral {version}, " if isinstance(version, str) else ""


def object_name(name: str, seq: int) -> str:
    return f"{name}.{seq:015d}"


class SnapshotStore:
    """The newest KEEP snapshots of one projection (`name`), by log position, in SNAPSHOT_BUCKET."""

    def __init__(self, js: JetStreamContext, name: str = CLUSTER, *, replicas: int = 1, keep: int = KEEP) -> None:
        if keep < 1:
            raise ValueError("keep at least one snapshot")
        self._js = js
        self._name = name
        self._replicas = replicas
        self._keep = keep
        self._store: Any = None

    async def _bucket(self, *, create: bool) -> Any:
        """The object store; None if it does not exist and `create` is false (readers never create it)."""
        if self._store is None:
            try:
                self._store = await self._js.object_store(SNAPSHOT_BUCKET)
            except BucketNotFoundError:
                if not create:
                    return None
                self._store = await self._js.create_object_store(SNAPSHOT_BUCKET, replicas=self._replicas)
        return self._store

    async def _names(self) -> dict[str, int | None]:
        """Every object of this projection: name -> its seq (None: a legacy, pre-format-3 snapshot)."""
        prefix = f"$O.{SNAPSHOT_BUCKET}.M."
        info = await self._js.stream_info(SNAPSHOT_STREAM, subjects_filter=f"{prefix}>")
        found: dict[str, int | None] = {}
        for subject in (info.state.subjects or {}):
            try:
                obj = base64.urlsafe_b64decode(subject[len(prefix):]).decode()
            except (ValueError, UnicodeDecodeError):
                continue
            if (m := _NAME_RE.fullmatch(obj)) is not None and m["name"] == self._name:
                found[obj] = int(m["seq"])
            elif (m := _LEGACY_RE.fullmatch(obj)) is not None and m["name"] == self._name:
                found[obj] = None
        return found

    async def seqs(self) -> list[int]:
        """Positions of the stored snapshots, newest first (not checked: `load` checks what it reads)."""
        if await self._bucket(create=False) is None:
            return []
        return sorted((s for s in (await self._names()).values() if s is not None), reverse=True)

    async def newest_seq(self) -> int:
        """The position of the newest stored snapshot; 0 if there is none."""
        seqs = await self.seqs()
        return seqs[0] if seqs else 0

    async def save(self, state: Any, skipped: Collection[str] | None = ()) -> int:
        """Store a snapshot of `state` at its `seq`, then drop all but the newest KEEP; returns its size in bytes.

        `skipped`: the event types its fold could not decode, from the log's start (a Follower's
        `skipped`); None when that is not known (module docstring).
        """
        seq = int(state.seq)
        raw = encode_body(state)  # now, in the fold's task: the fold goes on changing `state`
        skipped = None if skipped is None else sorted(set(skipped))  # (a copy: the fold goes on adding)
        data = await asyncio.to_thread(pack, raw, seq, skipped)  # zlib releases the GIL
        store = await self._bucket(create=True)
        await store.put(object_name(self._name, seq), data)
        try:
            await self._prune(store)
        except Exception as e:  # a snapshot too many is only space; the next save prunes again
            log.warning("snapshot_prune_failed", error=repr(e))
        return len(data)

    async def _prune(self, store: Any) -> None:
        names = await self._names()
        ours = sorted((n for n, s in names.items() if s is not None), key=lambda n: names[n] or 0, reverse=True)
        for obj in ours[self._keep:] + [n for n, s in names.items() if s is None]:
            with_tombstone = f"$O.{SNAPSHOT_BUCKET}.M.{base64.urlsafe_b64encode(obj.encode()).decode()}"
            try:
                await store.delete(obj)
            except NotFoundError:
                pass  # deleted already (another scheduler pruned too); its tombstone may be left
            # Drop the tombstone `delete` leaves, or the listing grows with every snapshot ever written.
            await self._js.purge_stream(SNAPSHOT_STREAM, subject=with_tombstone)

    async def load(self, state_type: type[S], at_most: int | None = None) -> S | None:
        """The newest usable snapshot at or before `at_most` (default: any); None: fold from the log.

        Each snapshot skipped gets one log line saying why; so does a store that cannot be read.
        """
        loaded = await self.load_with_header(state_type, at_most)
        return None if loaded is None else loaded.state

    async def load_with_header(self, state_type: type[S], at_most: int | None = None) -> Loaded[S] | None:
        """`load`, with the snapshot's header (a writer that folds on records what it skipped, `skipped`)."""
        try:
            store = await self._bucket(create=False)
            if store is None:
                return None
            names = await self._names()
        except Exception as e:  # no permission, the server away: the log is always a correct start
            log.warning("snapshots_unavailable", bucket=SNAPSHOT_BUCKET, error=str(e) or repr(e),
                        fallback="the log from its start")
            return None
        for obj, seq in sorted(names.items(), key=lambda kv: kv[1] or 0, reverse=True):
            if seq is None:
                log.info("snapshot_skipped", name=obj, reason="written by an older corral (format <= 2)")
                continue
            if at_most is not None and seq > at_most:
                continue
            try:
                return await self._read(store, obj, seq, state_type)
            except Unusable as e:
                reason = str(e)
            except Exception as e:  # unreadable for any other reason: deleted meanwhile, no permission, timeout
                reason = f"could not be read: {str(e) or repr(e)}"
            log.warning("snapshot_skipped", name=obj, seq=seq, reason=reason, fallback="an older snapshot or the log")
        return None

    async def _read(self, store: Any, obj: str, seq: int, state_type: type[S]) -> Loaded[S]:
        info = await store.get_info(obj)
        buf = io.BytesIO()
        # Into a buffer: without one nats-py 2.16 grows the result with `bytes +=` per chunk,
        # quadratic in the size (20 s for an 86 MB snapshot instead of well under 1 s).
        async with asyncio.timeout(_READ_ALLOWANCE_S + (info.size or 0) / _READ_RATE):
            await store.get(obj, writeinto=buf)
        header, body = read_header(buf.getbuffer())
        if header.seq != seq:
            raise Unusable(f"its header says seq {header.seq}, its name {seq}")
        if (why := suspect(header)) is not None:
            raise Unusable(why)
        raw = await asyncio.to_thread(unpack, header, body) if header.codec != "msgpack" else body
        return Loaded(decode_state(header, raw, state_type), header)
