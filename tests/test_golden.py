"""The committed golden log decodes with today's code: old events stay readable forever.

tests/golden/v1_events.jsonl was written by tests/golden/make_golden.py and is
read here as committed (never regenerated), so a change that breaks reading
an old event (a renamed field, a changed type, a dropped tag) fails here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from schemas import EVENT_TAGS, EVENT_TYPES, JobSubmitted, Unknown, decode, tag_of

GOLDEN = Path(__file__).with_name("golden") / "v1_events.jsonl"
LINES = GOLDEN.read_bytes().splitlines()


def _payload(line: bytes) -> dict[str, Any] | None:
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


#: The lines make_golden.py wrote to be unreadable or old on purpose (plus one that is not JSON at all).
SPECIAL_IDS = {"teleport:j-1", "running:j-3:1", "submit:j-0ld5ub0000"}


def _current_lines() -> list[bytes]:
    """Lines of the current catalogue: valid JSON with a known tag, not one of the special cases."""
    return [ln for ln in LINES if (p := _payload(ln)) is not None and p.get("type") in EVENT_TAGS
            and p.get("event_id") not in SPECIAL_IDS]


def test_every_line_decodes_without_raising() -> None:
    assert len(LINES) >= len(EVENT_TYPES) + 4
    for line in LINES:
        decode(line)  # must not raise, whatever the line holds


@pytest.mark.parametrize("line", _current_lines(), ids=lambda ln: json.loads(ln)["type"])
def test_known_lines_decode_to_the_same_values(line: bytes) -> None:
    """Every field the old writer wrote reads back as the same value under the same name."""
    raw = json.loads(line)
    event = decode(line)
    assert not isinstance(event, Unknown), f"a {raw['type']} written by older code no longer decodes: {event.error}"
    assert tag_of(event) == raw["type"]
    now = json.loads(msgspec.json.encode(event))
    assert _written_part(now, raw) == raw


def _written_part(now: Any, old: Any) -> Any:
    """`now` cut down to the keys `old` has, at every depth: fields added later (with defaults) are fine."""
    if isinstance(old, dict) and isinstance(now, dict):
        return {k: _written_part(now[k], v) if k in now else "<missing>" for k, v in old.items()}
    if isinstance(old, list) and isinstance(now, list) and len(old) == len(now):
        return [_written_part(n, o) for n, o in zip(now, old, strict=True)]
    return now


def test_every_event_type_has_a_golden_line() -> None:
    """Fails when an event type is added without one: run tests/golden/make_golden.py (it appends)."""
    covered = {tag_of(decode(line)) for line in _current_lines()}
    missing = sorted(set(EVENT_TAGS) - covered)
    assert not missing, f"no golden line for {missing}: add samples to make_golden.py and run it"


def test_unknown_and_corrupt_lines_become_unknown() -> None:
    unknown = [decode(line) for line in LINES if isinstance(decode(line), Unknown)]
    by_type = {u.type: u for u in unknown if isinstance(u, Unknown)}
    assert set(by_type) >= {"JobTeleported", "JobRunning", None}
    assert by_type["JobTeleported"].error and by_type["JobTeleported"].raw.startswith(b'{"type":"JobTeleported"')
    assert "occurred_at" in by_type["JobRunning"].error  # wrong field type, reported
    assert by_type[None].raw.endswith(b'"job_id":"j-')  # the truncated line, kept raw


def test_the_v0_submission_is_upcast() -> None:
    (line,) = [ln for ln in LINES if (p := _payload(ln)) and p.get("type") == "JobSubmitted.v0"]
    event = decode(line)
    assert isinstance(event, JobSubmitted)
    assert event.job_id == "j-0ld5ub0000" and event.submitted_by == "carol"
    assert (event.spec.name, event.spec.ranks, event.spec.gpus_per_rank) == ("resnet50", 1, 4)
