"""One encoder/decoder pair for every event, and the upcaster chain.

Decoding never raises: an unknown tag or a malformed payload becomes an
`Unknown` carrying the raw bytes and the error, which folds to "no change".
The wire format is JSON so `nats sub corral.>` stays readable for operators.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import msgspec

from schemas.events import EVENT_TAGS, AnyEvent, Event, Unknown

#: old tag -> function turning its payload dict into a newer payload (which may
#: carry a newer tag). Applied repeatedly until a known tag comes out.
Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


def _job_submitted_v0(d: dict[str, Any]) -> dict[str, Any]:
    """v0 (pre-release) named the GPU count `gpus` and had no ranks."""
    spec = dict(d.get("spec", {}))
    if "gpus" in spec:
        spec["gpus_per_rank"] = spec.pop("gpus")
        spec.setdefault("ranks", 1)
    return {**d, "type": "JobSubmitted", "spec": spec}


UPCASTERS: Mapping[str, Upcaster] = MappingProxyType({"JobSubmitted.v0": _job_submitted_v0})


class _Peek(msgspec.Struct):
    type: str | None = None


#: Longest tag an Unknown keeps: real tags are short, and a hostile one must not grow logs and labels.
MAX_TAG_CHARS = 64


class Codec:
    def __init__(self, upcasters: Mapping[str, Upcaster] | None = None) -> None:
        self._enc = msgspec.json.Encoder()
        self._dec = msgspec.json.Decoder(AnyEvent)
        self._peek = msgspec.json.Decoder(_Peek)
        self._raw = msgspec.json.Decoder(dict[str, Any])
        self._upcasters = UPCASTERS if upcasters is None else upcasters

    def encode(self, event: Event) -> bytes:
        return self._enc.encode(event)

    def decode(self, raw: bytes | bytearray | memoryview) -> AnyEvent | Unknown:
        """The event in `raw`, or `Unknown` saying why not: never raises, whatever the bytes.

        msgspec raises DecodeError/ValidationError for bad JSON or fields, but
        UnicodeDecodeError for invalid UTF-8 inside a string: one message from
        any publisher would stop every reader, so anything the fast path raises
        goes to the slow path. The try costs nothing while no exception flies.
        """
        try:
            event: AnyEvent = self._dec.decode(raw)
            return event
        except Exception as e:
            return self._slow_decode(bytes(raw), e)

    def _slow_decode(self, raw: bytes, first: Exception) -> AnyEvent | Unknown:
        try:
            return self._classified(raw, first)
        except Exception as e:  # decoding is total: what the slow path trips on makes the message unreadable
            return Unknown(raw=raw, error=f"{type(e).__name__}: {e}", reason="malformed")

    def _tag(self, raw: bytes) -> str | None:
        try:
            tag = self._peek.decode(raw).type
        except Exception:
            return None
        return tag if tag is None or len(tag) <= MAX_TAG_CHARS else tag[:MAX_TAG_CHARS] + "..."

    def _classified(self, raw: bytes, first: Exception) -> AnyEvent | Unknown:
        tag = self._tag(raw)
        if isinstance(first, UnicodeDecodeError):
            return Unknown(raw=raw, error=_utf8_problem(raw, first), type=tag, reason="invalid_utf8")
        if tag is not None and tag in self._upcasters:
            return self._upcast(raw, tag)
        if tag is None:
            return Unknown(raw=raw, error=f"not a corral event: {first}", reason="malformed")
        if tag not in EVENT_TAGS:
            return Unknown(raw=raw, error=f"unknown event type {tag!r}", type=tag, reason="unknown_type")
        return Unknown(raw=raw, error=f"{tag}: {first}", type=tag, reason="invalid_fields")

    def _upcast(self, raw: bytes, tag: str) -> AnyEvent | Unknown:
        try:
            payload = self._raw.decode(raw)
            for _ in range(32):  # an upcaster chain longer than this is a cycle
                t = payload.get("type")
                if t in EVENT_TAGS:
                    upcast: AnyEvent = msgspec.convert(payload, AnyEvent)
                    return upcast
                up = self._upcasters.get(t)  # type: ignore[arg-type]
                if up is None:
                    break
                payload = up(payload)
            error = f"upcasting {tag} did not reach a known type"
        except Exception as e:
            error = f"upcasting {tag}: {e}"
        return Unknown(raw=raw, error=error, type=tag, reason="upcast_failed")


def _utf8_problem(raw: bytes, first: UnicodeDecodeError) -> str:
    """Where the message stops being UTF-8: its byte offset (msgspec's error counts from the string's start)."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"invalid UTF-8 at byte {e.start} (0x{raw[e.start]:02x})"
    return f"invalid UTF-8: {first.reason}"


#: Shared instance; encoders and decoders are reusable and thread-safe to read.
CODEC = Codec()
encode = CODEC.encode
decode = CODEC.decode
