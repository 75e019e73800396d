"""The fold of dataset staging (#33): warm nodes, each attempt's staging phase, and a failed staging ending
the attempt through the ordinary restart path."""

from __future__ import annotations

from orchestrator.core.model.state import FREE
from orchestrator.core.staging import staged
from schemas.datasets import Dataset
from schemas.events import (
    CachedDataset,
    DatasetEvicted,
    DatasetFailed,
    DatasetReady,
    DatasetStaging,
    GangRestarted,
    JobFailed,
    NodeDatasets,
)
from tests.core.harness import Sim, of_type

PILE = Dataset(name="pile", source="http://127.0.0.1:8000/pile.tar", mount="/data/pile")
TOK = Dataset(name="tok", source="/shared/tok", mount="/data/tok")


def gang(**spec: object) -> Sim:
    """A 2-node gang with two datasets, reserved (not started)."""
    s = Sim()
    s.node("n0")
    s.node("n1")
    s.submit("j", ranks=2, gpus_per_rank=8, datasets=(PILE, TOK), **spec)
    s.decide()
    assert s.job("j").status == "reserved"
    return s


def ready(s: Sim, node: str, d: Dataset, *, attempt: int = 1, cached: bool = False) -> None:
    s.emit(DatasetReady(event_id=s.eid(), occurred_at=s.now, job_id="j", attempt=attempt, node_id=node,
                        dataset=d.name, key=d.key, size_bytes=1000, cached=cached,
                        staged_bytes=0 if cached else 1000))


def test_the_gang_is_staged_only_once_every_node_holds_every_dataset() -> None:
    s = gang()
    assert not staged(s.job("j"))
    s.emit(DatasetStaging(event_id=s.eid(), occurred_at=s.now, job_id="j", attempt=1, node_id="n0", dataset="pile",
                          key=PILE.key, bytes_done=10, bytes_total=1000))
    s.tick(5)
    ready(s, "n0", PILE)
    ready(s, "n0", TOK)
    ready(s, "n1", PILE)
    assert not staged(s.job("j"))  # n1 still lacks tok
    ready(s, "n1", PILE)  # a duplicate counts once
    assert not staged(s.job("j"))
    s.tick(3)
    ready(s, "n1", TOK, cached=True)
    job = s.job("j")
    assert staged(job)
    assert job.staging is not None and job.staging.ready_at - job.staging.started_at == 8
    assert sorted(s.state.nodes["n1"].datasets) == sorted((PILE.key, TOK.key))


def test_reports_of_another_attempt_node_or_dataset_change_nothing() -> None:
    s = gang()
    other = Dataset(name="other", source="/x", mount="/y")
    ready(s, "n0", other)
    ready(s, "n0", PILE, attempt=2)
    s.node("n2")
    ready(s, "n2", PILE)
    assert s.job("j").staging is None
    assert s.state.nodes["n2"].datasets == (PILE.key,)  # but n2 does hold it: warm for a later job


def test_a_job_without_datasets_is_staged() -> None:
    s = Sim()
    s.node("n0")
    s.submit("j", ranks=1, gpus_per_rank=8)
    s.decide()
    assert staged(s.job("j"))


def test_a_failed_staging_restarts_the_gang_with_the_reason_and_the_new_attempt_stages_again() -> None:
    s = gang(max_restarts=2)
    ready(s, "n0", PILE)
    s.emit(DatasetFailed(event_id=s.eid(), occurred_at=s.now, job_id="j", attempt=1, node_id="n1", dataset="pile",
                         reason="digest mismatch"))
    (restart,) = of_type(s.decide(), GangRestarted)
    assert "dataset pile on n1: digest mismatch" in restart.reason
    job = s.job("j")
    assert job.attempt == 2 and not staged(job)
    for node in ("n0", "n1"):
        for d in (PILE, TOK):
            ready(s, node, d, attempt=2)
    assert staged(s.job("j"))


def test_a_failed_staging_without_restarts_left_fails_the_job_saying_why() -> None:
    s = gang(max_restarts=0)
    s.emit(DatasetFailed(event_id=s.eid(), occurred_at=s.now, job_id="j", attempt=1, node_id="n0", dataset="tok",
                         reason="source /shared/tok does not exist"))
    (failed,) = of_type(s.decide(), JobFailed)
    assert failed.reason.startswith("dataset tok on n0: source /shared/tok does not exist")


def test_the_cache_contents_follow_the_nodes_reports() -> None:
    s = gang()
    s.emit(NodeDatasets(event_id=s.eid(), occurred_at=s.now, node_id="n0",
                        datasets=(CachedDataset(key="src-b", size_bytes=5), CachedDataset(key="src-a", size_bytes=3))))
    assert s.state.nodes["n0"].datasets == ("src-a", "src-b")
    s.emit(DatasetEvicted(event_id=s.eid(), occurred_at=s.now, node_id="n0", key="src-a", size_bytes=3))
    assert s.state.nodes["n0"].datasets == ("src-b",)
    s.emit(NodeDatasets(event_id=s.eid(), occurred_at=s.now, node_id="nowhere", datasets=()))
    assert "nowhere" not in s.state.nodes


def test_staged_at_time_zero_is_staged() -> None:
    """A simulated clock starts at 0: ready is a fact of the fold, not a nonzero time."""
    s = Sim(now=0.0)
    s.node("n0")
    s.submit("j", ranks=1, gpus_per_rank=8, datasets=(PILE,))
    s.decide()
    ready(s, "n0", PILE)
    job = s.job("j")
    assert staged(job) and job.staging is not None and job.staging.ready_at == 0.0


def test_a_permanent_staging_failure_fails_the_job_once_never_on_another_node() -> None:
    """A hostile or oversized archive fails the same way anywhere (#39): however many restarts the spec allows
    and free nodes there are, the job fails once with the agent's reason, and its GPUs go back."""
    s = gang(max_restarts=3)
    s.node("n2")
    s.node("n3")  # two idle nodes the gang could be placed on again
    ready(s, "n0", PILE)
    why = "http://x/bomb.tar.gz: the archive unpacks to more than 1000 bytes (--dataset-max-bytes)"
    s.emit(DatasetFailed(event_id=s.eid(), occurred_at=s.now, job_id="j", attempt=1, node_id="n1", dataset="pile",
                         reason=why, permanent=True))
    # the other node's report of the same attempt comes later: nothing more
    s.emit(DatasetFailed(event_id=s.eid(), occurred_at=s.now, job_id="j", attempt=1, node_id="n0", dataset="tok",
                         reason="stopped", permanent=False))
    events = s.decide()
    for _ in range(3):
        s.tick(60)
        events += s.decide()
    (failed,) = of_type(events, JobFailed)
    assert failed.reason.startswith(f"dataset pile on n1: {why}") and "not restarted" in failed.reason
    assert not of_type(events, GangRestarted)
    job = s.job("j")
    assert job.status == "failed" and job.attempt == 1 and job.end_reason == failed.reason
    assert not [e for e in s.log if isinstance(e, JobFailed) and e is not failed], "failed once"
    assert all(owner == FREE for owners in s.state.owners.values() for owner in owners), "its GPUs went back"


def test_a_transient_failure_first_is_restarted_even_if_a_permanent_one_follows_in_that_attempt() -> None:
    """The attempt's first DatasetFailed decides (its reason is the attempt's failure); the next attempt stages
    afresh and a permanent failure there fails the job."""
    s = gang(max_restarts=3)
    s.emit(DatasetFailed(event_id=s.eid(), occurred_at=s.now, job_id="j", attempt=1, node_id="n0", dataset="pile",
                         reason="cannot fetch: connection refused"))
    s.emit(DatasetFailed(event_id=s.eid(), occurred_at=s.now, job_id="j", attempt=1, node_id="n1", dataset="pile",
                         reason="refused: member '/etc/x' is an absolute path", permanent=True))
    (restart,) = of_type(s.decide(), GangRestarted)
    assert "connection refused" in restart.reason
    s.tick(60)
    s.decide()
    job = s.job("j")
    assert job.attempt == 2
    s.emit(DatasetFailed(event_id=s.eid(), occurred_at=s.now, job_id="j", attempt=2, node_id=job.placement[0].node_id,
                         dataset="pile", reason="refused: member '/etc/x' is an absolute path", permanent=True))
    (failed,) = of_type(s.decide(), JobFailed)
    assert "is an absolute path" in failed.reason and s.job("j").attempt == 2
