"""The submit-time queue rule against the scheduler's (#35): one deliberate difference, pinned here.

`corral submit` refuses a queue name that is not defined once any queue is (orchestrator/cli/jobs.py:
`queue_refusal`); the scheduler sends it to the default queue (orchestrator/core/model/usage.py:
`resolve_queue`) and rejects it only when there is no default queue either (`never_fits`, the rule of
its reject stage). So: whatever the scheduler rejects for its queue, the CLI refuses; the CLI refuses
more only for an unknown name while the default queue is defined. No server: states from folded events.
"""

from __future__ import annotations

import itertools

from orchestrator.cli.jobs import queue_refusal
from orchestrator.core.model.state import ClusterState
from orchestrator.core.model.usage import resolve_queue
from orchestrator.core.reject import never_fits
from schemas.events import ClusterConfigured, QueueDefined
from schemas.jobspec import JobSpec
from tests.core.harness import Sim

NAMES = ("research", "prod", "default", "batch", "typo")


def _state(queues: tuple[str, ...], default_queue: str) -> ClusterState:
    sim = Sim()  # no nodes: never_fits then judges the queue only
    sim.emit(ClusterConfigured(event_id=sim.eid(), occurred_at=sim.now, default_queue=default_queue))
    for q in queues:
        sim.emit(QueueDefined(event_id=sim.eid(), occurred_at=sim.now, queue=q))
    return sim.state


def _scheduler_rejects(state: ClusterState, queue: str) -> bool:
    return any("unknown queue" in r for r in never_fits(state, JobSpec(name="j", queue=queue)))


def test_a_typo_is_refused_at_submit_while_the_scheduler_would_run_it_in_the_default_queue() -> None:
    state = _state(("research", "default"), "default")
    assert resolve_queue(state, "reserch") == "default"
    assert not _scheduler_rejects(state, "reserch")
    refused = queue_refusal(state, "reserch")
    assert refused is not None and "unknown queue 'reserch'" in refused and "default, research" in refused


def test_both_rules_agree_everywhere_else() -> None:
    """Over queue sets, default queues and names: the CLI refuses exactly what the scheduler rejects, plus an
    unknown name while the default queue is defined (the spec's default name then runs there)."""
    checked = 0
    for n in range(5):
        for queues in itertools.combinations(("research", "prod", "default", "batch"), n):
            for default_queue, name in itertools.product(("default", "batch"), NAMES):
                state = _state(queues, default_queue)
                refused = queue_refusal(state, name) is not None
                rejected = _scheduler_rejects(state, name)
                only_cli = bool(queues) and name not in queues and name != "default" and default_queue in queues
                assert not rejected or refused, (queues, default_queue, name)
                assert refused == (rejected or only_cli), (queues, default_queue, name, refused, rejected)
                checked += 1
    assert checked == 16 * 2 * len(NAMES)


def test_without_queues_every_name_runs() -> None:
    state = _state((), "default")
    assert queue_refusal(state, "anything") is None and not _scheduler_rejects(state, "anything")


def test_a_job_naming_no_queue_without_a_default_queue_is_told_how_to_get_one() -> None:
    """#41: the README's quick start defines queues; `corral run` without -q then needs `default` (or -q)."""
    refused = queue_refusal(_state(("research", "prod"), "default"), "default")
    assert refused is not None
    assert "a job that names no queue runs in the default queue 'default', which is not defined" in refused
    assert "prod, research" in refused and "-q QUEUE" in refused and "`corral queue set default`" in refused
