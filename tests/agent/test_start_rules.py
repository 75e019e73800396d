"""The agent's decisions without processes or a server (nodeagent/start_rules.py): states from folded events."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
from msgspec.structs import replace

from nodeagent.start_rules import backoff_left, blocked, held_gpus, next_generation, on_faulty_gpu, restarts_rank
from orchestrator.core.node_view import node_view_of
from orchestrator.core.node_work import Intent, WorkerKey, rank_intent
from schemas.events import GpuUnhealthy
from tests.core.harness import Sim


@dataclass
class Worker:
    """A tracked worker as the rules see it (agent.py's `Tracked` has these and more)."""

    gpus: tuple[int, ...]
    ending: str | None = None
    exited: bool = False
    gpus_unknown: bool = False


def _running(job_id: str = "j1", ranks: int = 2, restart_policy: str = "rank") -> Sim:
    """One node n1 of 4 GPUs, `job_id` (`ranks` x 1 GPU) reserved and started on it."""
    sim = Sim()
    sim.node("n1", gpus=4)
    sim.submit(job_id, ranks=ranks, gpus_per_rank=1, restart_policy=restart_policy, max_restarts=3)
    sim.run()
    assert sim.job(job_id).status == "running", sim.job(job_id)
    return sim


def test_a_gang_restart_backoff_runs_until_not_before_on_the_log_clock() -> None:
    job = replace(_running().job("j1"), not_before=1_010.0)
    attempt = job.attempt
    assert backoff_left(job, attempt, log_now=1_004.0, tick_s=0.5) == 6.0
    assert backoff_left(job, attempt, log_now=1_010.0, tick_s=0.5) is None, "over at not_before"
    assert backoff_left(job, attempt, log_now=None, tick_s=0.5) == 0.5, "no log clock yet: one more tick, never cut short"
    assert backoff_left(job, attempt + 1, log_now=1_004.0, tick_s=0.5) is None, "another attempt's backoff is not ours"
    assert backoff_left(replace(job, not_before=0.0), attempt, log_now=None, tick_s=0.5) is None, "no restart backoff"
    assert backoff_left(None, attempt, log_now=None, tick_s=0.5) is None, "a job the fold does not know"


def test_the_generation_after_a_restarting_rank_comes_from_the_log() -> None:
    sim = _running()
    attempt = sim.job("j1").attempt
    node = sim.job("j1").placement[1].node_id
    assert next_generation(node_view_of(sim.state, node), ("j1", attempt, 1)) == 0
    sim.exit("j1", rank=1, code=1, reason="crashed", will_restart=True)
    assert sim.state.ranks["j1"][1].status == "restarting"
    view = node_view_of(sim.state, node)
    assert next_generation(view, ("j1", attempt, 1)) == 1
    assert next_generation(view, ("j1", attempt, 0)) == 0, "the other rank runs on"
    assert next_generation(view, ("nope", 1, 0)) == 0


def test_gpus_held_by_workers_on_their_way_out() -> None:
    work: dict[WorkerKey, Intent] = {("j2", 1, 0): "run", ("j3", 1, 0): "run"}
    wanted = Worker(gpus=(0,))
    assert held_gpus({("j2", 1, 0): wanted}, work) == set(), "a wanted worker's GPUs are its own"
    stale = Worker(gpus=(1, 2))  # not in the work: a superseded attempt, a requeued gang
    stopping = Worker(gpus=(3,), ending="killed")  # in the work, but being stopped
    assert held_gpus({("j1", 1, 0): stale, ("j3", 1, 0): stopping}, work) == {1, 2, 3}
    gone = Worker(gpus=(1, 2), exited=True)
    assert held_gpus({("j1", 1, 0): gone}, work) == set(), "an ended worker holds nothing"
    adopted = Worker(gpus=(), gpus_unknown=True)
    assert held_gpus({("j1", 1, 0): stale, ("j0", 1, 0): adopted}, work) is None, "unknown: all of them"


@pytest.mark.parametrize(("held", "gpus", "waits"), [
    (set(), (0, 1), False), ({2}, (0, 1), False), ({1, 2}, (0, 1), True), (None, (0, 1), True), (None, (), True),
])
def test_a_new_worker_waits_for_its_gpus(held: set[int] | None, gpus: tuple[int, ...], waits: bool) -> None:
    assert blocked(held, gpus) is waits


def test_a_crashed_rank_restarts_only_by_its_rule() -> None:
    sim = _running()
    key: WorkerKey = ("j1", sim.job("j1").attempt, 0)
    intent = rank_intent(sim.state, "n1", key)
    assert intent == "run"
    base = dict(ending=None, exit_reason="crashed", restart_policy="rank", restarts=0, max_restarts=3,
                intent=intent, faulty_gpu=False)
    assert restarts_rank(**base)  # type: ignore[arg-type]
    assert restarts_rank(**{**base, "exit_reason": "killed"})  # type: ignore[arg-type]
    for change in ({"ending": "preempted"}, {"ending": "cancelled"}, {"ending": "killed"},
                   {"exit_reason": "completed"}, {"exit_reason": "lost"}, {"restart_policy": "gang"},
                   {"restart_policy": "never"}, {"restarts": 3}, {"intent": "checkpoint"}, {"intent": None},
                   {"faulty_gpu": True}):
        assert not restarts_rank(**{**base, **change}), change  # type: ignore[arg-type]


def test_every_condition_of_the_restart_rule_matters() -> None:
    """Exhaustive over the rule's inputs: a restart needs all six conditions at once."""
    for ending, reason, policy, restarts, intent, faulty in itertools.product(
            (None, "preempted"), ("crashed", "killed", "completed"), ("rank", "gang"), (2, 3),
            ("run", "stop", None), (False, True)):
        want = (ending is None and reason != "completed" and policy == "rank" and restarts < 3 and intent == "run"
                and not faulty)
        assert restarts_rank(ending=ending, exit_reason=reason, restart_policy=policy, restarts=restarts,
                             max_restarts=3, intent=intent, faulty_gpu=faulty) is want  # type: ignore[arg-type]


def test_a_worker_on_a_gpu_the_fold_marks_faulty() -> None:
    sim = _running()
    assert not on_faulty_gpu(sim.state.nodes["n1"], (0, 1))
    sim.emit(GpuUnhealthy(event_id=sim.eid(), occurred_at=sim.now, node_id="n1", gpu_index=1, reason="Xid 79"))
    node = sim.state.nodes["n1"]
    assert on_faulty_gpu(node, (0, 1)) and on_faulty_gpu(node, (1,))
    assert not on_faulty_gpu(node, (2, 3)), "its other GPUs are fine"
    assert not on_faulty_gpu(None, (1,)), "a node the fold does not know"
