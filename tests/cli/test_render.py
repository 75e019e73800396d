"""Every event type of the schemas' union prints something in every renderer.

The renderers match exhaustively (`assert_never`), so mypy refuses a new type
nobody renders; this test refuses a case that renders it as nothing. The
samples are the golden log's lines, which hold one of every type
(tests/test_golden.py fails when a type lacks one).
"""

from __future__ import annotations

from pathlib import Path

from events.bus import Envelope
from events.subjects import subject_for
from orchestrator.cli.render import essentials, line
from orchestrator.cli.timeline import job_timeline
from schemas import EVENT_TYPES, Unknown, decode, tag_of
from schemas.events import WorkAssigned, WorkChanged

GOLDEN = Path(__file__).parents[1] / "golden" / "v1_events.jsonl"
#: The golden log's most told job: its unreadable lines are filed under its subjects.
JOB = "j-3f9a1c2b7d"


def _golden() -> list[Envelope]:
    out = []
    for seq, raw in enumerate(GOLDEN.read_bytes().splitlines(), start=1):
        ev = decode(raw)
        subject = f"corral.job.{JOB}.Unknown" if isinstance(ev, Unknown) else subject_for(ev)
        out.append(Envelope(seq, subject, 1.8e9 + seq, ev))
    return out


ENVELOPES = _golden()


def test_the_samples_hold_every_event_type() -> None:
    assert {type(e.event) for e in ENVELOPES} >= {*EVENT_TYPES, Unknown}


def test_every_event_type_has_a_tail_line_with_its_facts() -> None:
    for env in ENVELOPES:
        what = tag_of(env.event) if not isinstance(env.event, Unknown) else "Unknown"
        assert essentials(env.event).strip(), f"{what} prints no facts"
        assert line(env).strip() and "\n" not in line(env)


def test_every_job_event_type_has_a_story_line() -> None:
    """`corral explain`: each type about a job is told in that job's story, never as an empty line."""
    # WorkAssigned/WorkChanged name a job but are a node's orders (its slice of the job's facts, derived from
    # them): the job's story tells the facts themselves.
    job_types = {t for t in EVENT_TYPES if "job_id" in t.__struct_fields__ and t not in (WorkAssigned, WorkChanged)}
    told: set[str] = set()
    for job_id in sorted({e.event.job_id for e in ENVELOPES if hasattr(e.event, "job_id")}):
        for entry in job_timeline(ENVELOPES, job_id):
            assert entry.text.strip(), f"{entry.type} at {entry.seq} is an empty line in {job_id}'s story"
            told.add(entry.type)
    assert told >= {t.__struct_config__.tag for t in job_types} | {"Unknown"}
