"""The scheduler's staging metrics (#33): each node's DatasetReady counted once, cache hits apart, and the
staging phase's length observed when the last node became ready (orchestrator/scheduler/metrics.py)."""

from __future__ import annotations

from events.bus import Envelope
from events.follow import Follower
from events.subjects import subject_for
from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import ClusterState
from orchestrator.scheduler.metrics import DATASET_BYTES_STAGED, DATASETS_READY, STAGING_SECONDS, count_outcomes
from schemas.datasets import Dataset
from schemas.events import DatasetReady
from tests.core.harness import Sim

PILE = Dataset(name="pile", source="http://h/pile.tar", mount="/d")


def _value(metric: object, name: str, **labels: str) -> float:
    for family in metric.collect():  # type: ignore[attr-defined]
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


def test_ready_datasets_and_the_staging_phase_are_counted_once() -> None:
    s = Sim(now=100.0)
    s.node("n0")
    s.node("n1")
    s.queue("mq")
    s.submit("j", queue="mq", ranks=2, gpus_per_rank=8, datasets=(PILE,))
    s.decide()

    def ready(node: str, at: float, cached: bool) -> DatasetReady:
        return DatasetReady(event_id=s.eid(), occurred_at=at, job_id="j", attempt=1, node_id=node, dataset="pile",
                            key=PILE.key, size_bytes=10, cached=cached, staged_bytes=0 if cached else 12)

    s.log += [ready("n0", 103.0, False), ready("n0", 104.0, False), ready("n1", 107.5, True)]
    follower = Follower(None, evolve, ClusterState())  # type: ignore[arg-type]
    count_outcomes(follower)
    before = (_value(DATASETS_READY, "corral_datasets_ready_total", cached="false"),
              _value(DATASETS_READY, "corral_datasets_ready_total", cached="true"),
              _value(DATASET_BYTES_STAGED, "corral_dataset_bytes_staged_total"),
              _value(STAGING_SECONDS, "corral_staging_seconds_count", queue="mq"),
              _value(STAGING_SECONDS, "corral_staging_seconds_sum", queue="mq"))
    for seq, e in enumerate(s.log, start=1):
        follower.apply(Envelope(seq, subject_for(e), e.occurred_at, e))
    after = (_value(DATASETS_READY, "corral_datasets_ready_total", cached="false"),
             _value(DATASETS_READY, "corral_datasets_ready_total", cached="true"),
             _value(DATASET_BYTES_STAGED, "corral_dataset_bytes_staged_total"),
             _value(STAGING_SECONDS, "corral_staging_seconds_count", queue="mq"),
             _value(STAGING_SECONDS, "corral_staging_seconds_sum", queue="mq"))
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 1, 12, 1, 4.5]
