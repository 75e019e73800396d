"""Subjects and filters: one entity per subject token, filters that never overlap."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from events.subjects import (
    ALL,
    InvalidId,
    covers,
    filters,
    id_from,
    job_filter,
    matches,
    node_filter,
    normalize_filters,
    queue_filter,
    subject_for,
    type_filters,
    valid_id,
)
from schemas import (
    ClusterConfigured,
    JobRunning,
    NodeFailed,
    QueueDefined,
    SchedulerElected,
)

T0 = 1_750_000_000.0


def test_subject_for_each_entity() -> None:
    assert subject_for(JobRunning(event_id="e", occurred_at=T0, job_id="j-1a", attempt=1)) == (
        "corral.job.j-1a.JobRunning")
    assert subject_for(NodeFailed(event_id="e", occurred_at=T0, node_id="gpu_07", incarnation="1")) == (
        "corral.node.gpu_07.NodeFailed")
    assert subject_for(QueueDefined(event_id="e", occurred_at=T0, queue="research")) == (
        "corral.queue.research.QueueDefined")
    assert subject_for(SchedulerElected(event_id="e", occurred_at=T0, epoch=2, scheduler_id="a.b")) == (
        "corral.sched.SchedulerElected")
    assert subject_for(ClusterConfigured(event_id="e", occurred_at=T0)) == "corral.sched.ClusterConfigured"


@pytest.mark.parametrize("bad", ["", "a.b", "a*", "a>", "a b", "a\tb", "-lead", "_lead", "x" * 129, "é", "a/b"])
def test_ids_that_would_break_a_subject_are_refused(bad: str) -> None:
    assert not valid_id(bad)
    with pytest.raises(InvalidId):
        subject_for(JobRunning(event_id="e", occurred_at=T0, job_id=bad, attempt=1))
    with pytest.raises(InvalidId):
        job_filter(bad)


@pytest.mark.parametrize("good", ["j-0123456789", "a", "A_b-9", "x" * 128, "7"])
def test_valid_ids(good: str) -> None:
    assert valid_id(good)
    assert job_filter(good) == f"corral.job.{good}.>"


@given(st.text(max_size=200))
def test_id_from_makes_a_valid_id_or_refuses(text: str) -> None:
    try:
        out = id_from(text)
    except InvalidId:
        assert not any(c.isascii() and c.isalnum() for c in text)
    else:
        assert valid_id(out)


def test_id_from_hostnames() -> None:
    assert id_from("gpu-07.cluster.local") == "gpu-07-cluster-local"
    assert id_from("  node 3 ") == "node-3"


def test_filters() -> None:
    assert filters() == [ALL]
    assert node_filter("n1") == "corral.node.n1.>" and queue_filter("q") == "corral.queue.q.>"
    assert filters(jobs=["j1", "j2"]) == ["corral.job.j1.>", "corral.job.j2.>"]
    assert filters(types=["JobRunning"]) == type_filters("JobRunning") == [
        "corral.*.*.JobRunning", "corral.sched.JobRunning"]
    assert filters(jobs=["j1"], nodes=["n1"], types=["JobRunning", "NodeFailed"]) == [
        "corral.job.j1.JobRunning", "corral.job.j1.NodeFailed", "corral.node.n1.JobRunning",
        "corral.node.n1.NodeFailed"]
    with pytest.raises(ValueError, match="unknown event type"):
        filters(types=["JobTeleported"])


def test_normalize_drops_covered_filters() -> None:
    assert normalize_filters(None) == [ALL]
    assert normalize_filters(["corral.job.j1.>", ALL, "corral.job.j1.>"]) == [ALL]
    assert normalize_filters(["corral.*.*.JobRunning", "corral.job.j1.JobRunning", "corral.sched.X"]) == [
        "corral.*.*.JobRunning", "corral.sched.X"]


@pytest.mark.parametrize(
    ("pattern", "subject", "expected"),
    [
        ("corral.>", "corral.job.j1.JobRunning", True),
        ("corral.>", "corral", False),
        ("corral.job.*.JobRunning", "corral.job.j1.JobRunning", True),
        ("corral.job.*.JobRunning", "corral.job.j1.JobFailed", False),
        ("corral.*.*.X", "corral.sched.X", False),
        ("corral.job.j1.>", "corral.job.j1.*", True),
        ("corral.job.*.X", "corral.job.>", False),
    ],
)
def test_covers(pattern: str, subject: str, expected: bool) -> None:
    assert covers(pattern, subject) is expected


def test_matches_mirrors_server_side_filtering() -> None:
    fs = filters(types=["SchedulerElected"])
    assert matches(fs, "corral.sched.SchedulerElected")
    assert not matches(fs, "corral.job.j1.JobRunning")
