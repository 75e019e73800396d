"""One encoder/decoder pair for every event, and the upcaster chain.

Decoding never raises: an unknown tag or a malformed payload becomes an
`Unknown` carrying the raw bytes and the error, which folds to "no change".
The wire format is JSON so `nats sub corral.>` stays readable for operators.
"""

from __future__ import annotations

from collections.abc import Callable
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


UPCASTERS: dict[str, Upcaster] = {"JobSubmitted.v0": _job_submitted_v0}


class _Peek(msgspec.Struct):
    type: str | None = None


class Codec:
    def __init__(self, upcasters: dict[str, Upcaster] | None = None) -> None:
        self._enc = msgspec.json.Encoder()
        self._dec = msgspec.json.Decoder(AnyEvent)
        self._peek = msgspec.json.Decoder(_Peek)
        self._raw = msgspec.json.Decoder(dict[str, Any])
        self._upcasters = UPCASTERS if upcasters is None else upcasters

    def encode(self, event: Event) -> bytes:
        return self._enc.encode(event)

    def decode(self, raw: bytes | memoryview) -> AnyEvent | Unknown:
        try:
            event: AnyEvent = self._dec.decode(raw)
            return event
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            return self._slow_decode(bytes(raw), e)

    def _slow_decode(self, raw: bytes, first: Exception) -> AnyEvent | Unknown:
        try:
            tag = self._peek.decode(raw).type
        except (msgspec.DecodeError, msgspec.ValidationError):
            tag = None
        if tag is None or tag not in self._upcasters:
            return Unknown(raw=raw, error=str(first), type=tag)
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
            return Unknown(raw=raw, error=f"upcasting {tag} did not reach a known type", type=tag)
        except Exception as e:
            return Unknown(raw=raw, error=f"upcasting {tag}: {e}", type=tag)


#: Shared instance; encoders and decoders are reusable and thread-safe to read.
CODEC = Codec()
encode = CODEC.encode
decode = CODEC.decode
