"""A rank its agent cannot start for a reason a retry would meet again (its workdir is not on the node): the job
fails at once with the agent's words, restarts left or not (#31: "fails the job with a clear reason")."""

from __future__ import annotations

from orchestrator.core.model.state import UNSTARTABLE
from schemas.events import CancelRequested, GangRestarted, JobFailed, WorkerExited
from tests.core.harness import Sim, of_type

WHY = "workdir /home/alice/proj does not exist on node n1"


def unstartable(s: Sim, job_id: str, rank: int) -> None:
    job = s.job(job_id)
    node = job.placement[rank].node_id
    s.emit(WorkerExited(event_id=s.eid(), occurred_at=s.now, job_id=job_id, attempt=job.attempt, rank=rank,
                        node_id=node, exit_code=None, reason=UNSTARTABLE, log_tail=WHY))


def two_nodes() -> Sim:
    s = Sim()
    s.node("n0")
    s.node("n1")
    return s


def test_an_unstartable_rank_fails_a_gang_with_restarts_left_at_once_with_the_reason() -> None:
    s = two_nodes()
    s.submit("j", ranks=1, gpus_per_rank=8, restart_policy="gang", max_restarts=3)
    s.decide()
    unstartable(s, "j", 0)  # its agent found no workdir: never started
    events = s.decide()
    assert not of_type(events, GangRestarted)
    (failed,) = of_type(events, JobFailed)
    assert failed.reason == f"rank 0 cannot start: {WHY}"
    assert s.job("j").status == "failed" and s.holding("default") == 0


def test_the_other_ranks_are_stopped_first_then_it_fails_with_the_reason() -> None:
    s = two_nodes()
    s.submit("j", ranks=2, gpus_per_rank=8, max_restarts=3)
    s.decide()
    s.start("j")
    unstartable(s, "j", 1)
    (stop,) = of_type(s.decide(), CancelRequested)
    assert WHY in stop.reason
    s.exit("j", rank=0, code=None, reason="cancelled")
    (failed,) = of_type(s.decide(), JobFailed)
    assert failed.reason == f"rank 1 cannot start: {WHY}"


def test_an_ordinary_crash_still_restarts_the_gang() -> None:
    """The control: without UNSTARTABLE the same exit restarts (so the tests above test the new rule)."""
    s = two_nodes()
    s.submit("j", ranks=2, gpus_per_rank=8, max_restarts=3)
    s.decide()
    s.start("j")
    s.exit("j", rank=1, code=127, reason="crashed")
    assert of_type(s.decide(), GangRestarted)
