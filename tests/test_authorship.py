"""An event counts only where its subject, its type and its entity agree (events/authorship.py, issue #39)."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.nats.permissions import covers, role_permissions
from events.authorship import AUTHORS, judged, read_event
from events.logfile import read_events
from events.subjects import subject_for
from orchestrator.core.decide import decide
from orchestrator.core.evolve import evolve, fold
from schemas import EVENT_TAGS, CancelRequested, GpuUnhealthy, JobCompleted, Unknown, encode
from schemas.events import REFUSED, JobRejected, WorkerStarted

GOLDEN = Path(__file__).with_name("golden") / "v1_events.jsonl"


def test_every_type_has_an_author() -> None:
    authored = {t for tags in AUTHORS.values() for t in tags}
    assert authored == set(EVENT_TAGS)


def _gpu_fault(node: str = "n2") -> GpuUnhealthy:
    return GpuUnhealthy(event_id="x", occurred_at=1.0, node_id=node, gpu_index=0, reason="xid 79")


def test_an_event_on_its_own_subject_counts() -> None:
    e = _gpu_fault()
    assert judged(subject_for(e), e) is e


@pytest.mark.parametrize("subject", [
    "corral.job.j1.JobSubmitted",  # a client's own subject
    "corral.node.n1.GpuUnhealthy",  # another node's agent's own subject
    "corral.node.n2.GpuHealthy",  # the right entity, another type
    "corral.node.n2.GpuUnhealthy.n2",
    "corral.sched.GpuUnhealthy",
    "corral.unknown",
])
def test_an_event_on_another_subject_is_refused(subject: str) -> None:
    got = judged(subject, _gpu_fault())
    assert isinstance(got, Unknown) and got.reason == REFUSED and got.type == "GpuUnhealthy"
    assert "corral.node.n2.GpuUnhealthy" in got.error


def test_a_report_counts_with_its_node_or_in_the_old_form_only() -> None:
    e = WorkerStarted(event_id="w", occurred_at=1.0, job_id="j1", attempt=1, rank=0, node_id="n1",  # type: ignore[call-arg]
                      worker_id="w0")
    assert judged("corral.job.j1.WorkerStarted.n1", e) is e
    assert judged("corral.job.j1.WorkerStarted", e) is e  # (a log written before #40)
    assert isinstance(judged("corral.job.j1.WorkerStarted.n2", e), Unknown)
    assert isinstance(judged("corral.job.j2.WorkerStarted.n1", e), Unknown)


def test_a_refused_event_folds_as_no_change_and_is_counted() -> None:
    done = JobCompleted(event_id="c", occurred_at=1.0, job_id="j1", attempt=1)  # type: ignore[call-arg]
    got = read_event("corral.job.j1.JobSubmitted", encode(done))
    assert isinstance(got, Unknown) and got.reason == REFUSED
    s = evolve(fold([]), got)
    assert (s.refused_events, s.unknown_events, s.jobs) == (1, 0, {})


def test_an_unreadable_or_refused_submission_is_rejected_with_its_reason() -> None:
    bad = read_event("corral.job.j9.JobSubmitted", b'{"type":"JobSubmitted","job_id":"j9","spec":{"ranks":"x"}}')
    assert isinstance(bad, Unknown) and bad.submitted_as == "j9"
    cancel = CancelRequested(event_id="k", occurred_at=1.0, job_id="j8")  # type: ignore[call-arg]
    refused = read_event("corral.job.j7.JobSubmitted", encode(cancel))
    assert isinstance(refused, Unknown) and refused.submitted_as == "j7"
    s = fold([bad, refused])
    out = [e for e in decide(s, 10.0, epoch=0) if isinstance(e, JobRejected)]
    assert {e.job_id for e in out} == {"j9", "j7"}
    assert all(e.reasons and "submission" in e.reasons[0] for e in out)
    for e in out:
        evolve(s, e)
    assert not s.unreadable_submissions
    assert not [e for e in decide(s, 11.0, epoch=0) if isinstance(e, JobRejected)]


def test_golden_log_folds_as_before() -> None:
    """Every event of the committed golden log is on its own subject: the check changes nothing in it."""
    judged_events = list(read_events(GOLDEN))
    refused = [e for e in judged_events if isinstance(e, Unknown) and e.reason == REFUSED]
    assert not refused, [e.error for e in refused]


def _may_publish(role: str, subject: str) -> bool:
    user = "agent-n1" if role == "agent" else role
    perms = role_permissions(role, user, "n1" if role == "agent" else None)
    return any(covers(p, subject) for p in perms["publish"]["allow"])


@pytest.mark.parametrize("tag", sorted(EVENT_TAGS))
def test_the_rendered_permissions_let_a_role_publish_only_the_types_it_authors(tag: str) -> None:
    """Client and agent credentials can put a type on its own subject only if AUTHORS says they author it."""
    for role in ("client", "agent"):
        for subject in (f"corral.job.j1.{tag}", f"corral.node.n1.{tag}", f"corral.node.n2.{tag}",
                        f"corral.job.j1.{tag}.n1", f"corral.job.j1.{tag}.n2", f"corral.sched.{tag}"):
            if _may_publish(role, subject):
                assert tag in AUTHORS[role], (role, subject)
                assert ".n2" not in subject or role != "agent", subject
