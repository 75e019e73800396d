"""The wire format of a job's stdin: what `corral run` sends rank 0's agent, and its answer (msgpack).

Input is not an event: the bytes a user types or pipes are not scheduling
facts, so they go over core NATS request/reply to the agent of the node
running rank 0 (events.subjects.stdin_subject: `corral-stdin.<node>.<job>`),
never into the log. One request carries at most STDIN_CHUNK bytes, and the
next one is sent only after the answer: at most one chunk is in flight, and
an agent whose worker does not read takes what fits in the worker's pipe
(`taken`) instead of buffering more; the sender waits and sends the rest.
`seq` numbers the requests, so one sent again after a lost answer is
answered as before, not written twice.

Every request carries the job's key (JobSpec.interactive: the log holds its
SHA-256 only); an agent writes only for a request whose key matches, only to
rank 0 of the job's current attempt, and only while that worker runs.
"""

from __future__ import annotations

import hashlib

import msgspec

#: The most bytes one request carries (the agent splits them into frames for the worker's pipe).
STDIN_CHUNK = 64 * 1024


class StdinChunk(msgspec.Struct, frozen=True, kw_only=True):
    job_id: str
    #: The attempt the sender believes is current; a stale one is refused (`wrong_attempt`).
    attempt: int
    key: str
    #: 1, 2, ...: a chunk with a `seq` already written is acknowledged again, not written twice.
    seq: int
    data: bytes = b""
    #: The sender's stdin ended: rank 0's stdin is closed after `data` (a pty gets ^D).
    eof: bool = False
    #: The sender's terminal size (`--pty`), rows x columns; 0: unchanged.
    rows: int = 0
    cols: int = 0


class StdinAck(msgspec.Struct, frozen=True, kw_only=True):
    #: "" when written (all or part); else why not: `not_running` (not started yet), `wrong_attempt`, `ended`
    #: (rank 0 of this attempt is over: a newer attempt's may take input), or a refusal (bad key, no input).
    error: str = ""
    #: The worker is gone for good (ended, or a newer attempt): stop sending to this one.
    closed: bool = False
    #: The request answered.
    seq: int = 0
    #: Bytes of `data` written; fewer than sent: the worker does not read now, send the rest later (and the
    #: end of input only with the last of it).
    taken: int = 0


NOT_RUNNING = "not_running"
WRONG_ATTEMPT = "wrong_attempt"
ENDED = "ended"

_enc = msgspec.msgpack.Encoder()
_chunk = msgspec.msgpack.Decoder(StdinChunk)
_ack = msgspec.msgpack.Decoder(StdinAck)


def key_hash(key: str) -> str:
    """What the job spec records of the key (JobSpec.interactive.key_sha256)."""
    return hashlib.sha256(key.encode()).hexdigest()


def encode_stdin(obj: StdinChunk | StdinAck) -> bytes:
    return _enc.encode(obj)


def decode_stdin_chunk(data: bytes) -> StdinChunk:
    """Raises msgspec.DecodeError (or ValidationError) on anything else."""
    return _chunk.decode(data)


def decode_stdin_ack(data: bytes) -> StdinAck:
    return _ack.decode(data)
