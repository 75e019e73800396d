"""The wire format of `corral logs`: a request to a node's agent and its answer (msgpack).

Logs are not events: a worker's output stays on its node, and `corral logs`
asks that node's agent for it over NATS request/reply
(events.subjects.log_subject), one chunk at a time. A request names the
worker (job, attempt, rank, and the rank's restart generation, -1: the
newest) and a byte range; the answer carries at most `limit` bytes from
`offset`, the log's size, and whether the worker still runs, so a reader
streams a large log in chunks and `-f` polls for what was appended.
"""

from __future__ import annotations

import msgspec

#: Bytes per chunk when the request does not say, and the most an agent sends in one answer
#: (NATS's default max_payload is 1 MiB).
LOG_CHUNK = 64 * 1024
LOG_CHUNK_MAX = 512 * 1024


class LogRequest(msgspec.Struct, frozen=True, kw_only=True):
    job_id: str
    attempt: int
    rank: int
    #: The rank's worker generation (a `rank` restart policy restarts it in place); -1: the newest.
    restarts: int = -1
    offset: int = 0
    limit: int = LOG_CHUNK


class LogChunk(msgspec.Struct, frozen=True, kw_only=True):
    #: "" or why there is nothing to read (no such worker on this node, a bad request).
    error: str = ""
    #: Where the agent keeps it: a file on the node, or `docker:<container>`.
    path: str = ""
    restarts: int = 0
    offset: int = 0
    #: Where the next chunk starts: `offset + len(data)`.
    next: int = 0
    #: The log's size now; a reader is at the end when `next >= size`.
    size: int = 0
    #: Whether the worker still runs (more may be written).
    running: bool = False
    data: bytes = b""


_enc = msgspec.msgpack.Encoder()
_req = msgspec.msgpack.Decoder(LogRequest)
_chunk = msgspec.msgpack.Decoder(LogChunk)


def encode_log(obj: LogRequest | LogChunk) -> bytes:
    return _enc.encode(obj)


def decode_log_request(data: bytes) -> LogRequest:
    """Raises msgspec.DecodeError (or ValidationError) on anything else."""
    return _req.decode(data)


def decode_log_chunk(data: bytes) -> LogChunk:
    return _chunk.decode(data)
