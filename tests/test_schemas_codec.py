"""Property tests of the codec: every event round-trips; no input makes decode raise.

Strategies are derived from msgspec's own type info, so a field added to an
event is generated here without touching this file. Floats are finite: JSON
has no NaN or infinity (msgspec writes them as null), and the events' floats
are times and durations, never NaN.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas import EVENT_TAGS, EVENT_TYPES, Event, Unknown, decode, encode

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
FLOATS = st.floats(allow_nan=False, allow_infinity=False)
SMALL = {"max_size": 4}


def strategy(t: mi.Type) -> st.SearchStrategy[Any]:
    """A strategy for values of msgspec type `t` (the subset events use)."""
    match t:
        case mi.StructType():
            return st.builds(t.cls, **{f.name: strategy(f.type) for f in t.fields})
        case mi.StrType():
            return st.text(**SMALL)
        case mi.BoolType():
            return st.booleans()
        case mi.IntType():
            return INT64
        case mi.FloatType():
            return FLOATS
        case mi.NoneType():
            return st.none()
        case mi.LiteralType():
            return st.sampled_from(t.values)
        case mi.UnionType():
            return st.one_of(*(strategy(x) for x in t.types))
        case mi.VarTupleType():
            return st.lists(strategy(t.item_type), **SMALL).map(tuple)
        case mi.TupleType():
            return st.tuples(*(strategy(x) for x in t.item_types))
        case mi.ListType():
            return st.lists(strategy(t.item_type), **SMALL)
        case mi.DictType():
            return st.dictionaries(strategy(t.key_type), strategy(t.value_type), **SMALL)
        case mi.BytesType():
            return st.binary(**SMALL)
    raise NotImplementedError(f"no strategy for {t!r}: extend tests/test_schemas_codec.py")


@pytest.mark.parametrize("cls", EVENT_TYPES, ids=lambda c: c.__name__)
@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_event_round_trips(cls: type[Event], data: st.DataObject) -> None:
    event = data.draw(strategy(mi.type_info(cls)))
    assert type(event) is cls
    assert decode(encode(event)) == event


@given(st.binary(max_size=512))
def test_arbitrary_bytes_never_raise(raw: bytes) -> None:
    out = decode(raw)
    assert isinstance(out, Unknown) or type(out) in EVENT_TYPES


JSON = st.recursive(
    st.none() | st.booleans() | INT64 | FLOATS | st.text(**SMALL),
    lambda inner: st.lists(inner, **SMALL) | st.dictionaries(st.text(**SMALL), inner, **SMALL),
    max_leaves=20,
)
TAGS = st.sampled_from([*EVENT_TAGS, "JobSubmitted.v0", "Nope", ""]) | st.text(max_size=10)
FIELDS = st.sampled_from(sorted({f.name for cls in EVENT_TYPES for f in msgspec.structs.fields(cls)})) | st.text(
    max_size=8)


@given(st.dictionaries(FIELDS, JSON, max_size=8), TAGS | st.none() | JSON)
def test_arbitrary_json_objects_never_raise(obj: dict[str, Any], tag: Any) -> None:
    """Objects shaped like events (real tags, real field names, wrong values) included."""
    if tag is not None:
        obj = {**obj, "type": tag}
    out = decode(json.dumps(obj).encode())
    assert isinstance(out, Unknown) or type(out) in EVENT_TYPES


@given(st.dictionaries(st.sampled_from(["name", "gpus", "ranks", "queue", "image"]), JSON, max_size=5))
def test_v0_submissions_with_any_spec_never_raise(spec: dict[str, Any]) -> None:
    raw = json.dumps({"type": "JobSubmitted.v0", "event_id": "e", "occurred_at": 1.0, "job_id": "j", "spec": spec})
    out = decode(raw.encode())
    assert isinstance(out, Unknown) or out.spec.gpus_per_rank == spec.get("gpus", 1)  # type: ignore[union-attr]


@given(JSON)
def test_any_json_value_never_raises(value: Any) -> None:
    out = decode(json.dumps(value).encode())
    assert isinstance(out, Unknown)
