"""A gang's life after placement: running, completion, crashes, restarts, node loss, cancel, time limit."""

from __future__ import annotations

from orchestrator.core.model.facts import SETTLE_S
from orchestrator.core.model.state import SCHEDULER
from schemas.events import (
    CancelRequested,
    GangReserved,
    GangRestarted,
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobRejected,
    JobRequeued,
    JobRunning,
    JobWaiting,
)
from tests.core.harness import Sim, of_type


def two_node_sim() -> Sim:
    s = Sim()
    s.node("n0")
    s.node("n1")
    return s


def test_running_then_completed_releases_gpus() -> None:
    s = two_node_sim()
    s.submit("j", ranks=2, gpus_per_rank=8)
    s.decide()
    assert s.job("j").status == "reserved"
    s.start("j")
    (r,) = of_type(s.decide(), JobRunning)
    assert r.attempt == 1 and s.job("j").status == "running"
    s.exit("j", rank=0)
    assert not s.decide()  # rank 1 still running
    s.exit("j", rank=1)
    assert of_type(s.decide(), JobCompleted)
    assert s.job("j").status == "completed"
    assert all(o == "" for owners in s.state.owners.values() for o in owners)
    assert s.holding("default") == 0


def test_gang_restart_then_max_restarts_fails() -> None:
    s = two_node_sim()
    s.submit("j", ranks=2, gpus_per_rank=8, max_restarts=1)
    s.run()
    gpus = s.job("j").placement
    s.exit("j", rank=1, code=1, reason="crashed")
    (r,) = of_type(s.decide(), GangRestarted)
    assert r.attempt == 2 and s.job("j").attempt == 2 and s.job("j").restarts == 1
    assert s.job("j").placement == gpus  # same GPUs
    s.start("j")
    s.decide()
    s.exit("j", rank=0, code=137, reason="killed")
    (stop,) = of_type(s.decide(), CancelRequested)  # rank 1 still alive: stop it first
    assert stop.requested_by == SCHEDULER
    s.exit("j", rank=1, code=None, reason="cancelled")
    (f,) = of_type(s.decide(), JobFailed)
    assert "no restarts left" in f.reason and s.job("j").status == "failed"
    assert s.holding("default") == 0


def test_restart_policy_never_and_rank() -> None:
    s = two_node_sim()
    s.submit("never", gpus_per_rank=1, restart_policy="never")
    s.submit("rank", gpus_per_rank=1, restart_policy="rank")
    s.run()
    s.exit("never", code=2, reason="crashed")
    s.exit("rank", code=2, reason="crashed", will_restart=True)  # the agent restarts it itself
    events = s.decide()
    assert [e.job_id for e in of_type(events, JobFailed)] == ["never"]
    s.start("rank")
    s.exit("rank", code=2, reason="crashed", will_restart=False)  # the agent gave up
    (f,) = of_type(s.decide(), JobFailed)
    assert f.job_id == "rank" and "gave up" in f.reason


def test_failed_node_requeues_its_gangs_from_their_checkpoint() -> None:
    s = two_node_sim()
    s.submit("j", ranks=2, gpus_per_rank=8)
    s.run()
    s.checkpoint("j", step=100, path="/ckpt/100")
    s.fail_node("n1")
    (rq,) = of_type(s.decide(), JobRequeued)
    assert rq.attempt == 2 and rq.resume_from == "/ckpt/100" and "n1" in rq.reason
    job = s.job("j")
    assert job.status == "pending" and job.attempt == 2 and job.resume_from == "/ckpt/100"
    assert s.decide() == [] or not of_type(s.decide(), GangReserved)  # one node left: cannot fit
    s.recover_node("n1")
    (g,) = of_type(s.decide(), GangReserved)
    assert g.attempt == 2


def test_ranks_stopped_by_a_shutdown_requeue_from_the_checkpoint_with_restarts_unspent() -> None:
    """A graceful stop of a node (`corral up`'s Ctrl-C, `corral agent`'s SIGTERM) is no crash: the gang is
    requeued from its newest checkpoint, reason "shutdown", and its `max_restarts` stay whole."""
    s = two_node_sim()
    s.submit("j", ranks=2, gpus_per_rank=8, max_restarts=1)
    s.run()
    s.checkpoint("j", step=40, path="/ckpt/40")
    s.exit("j", rank=0, code=0, reason="shutdown")  # the shutdown's checkpoint, then exit 0
    s.exit("j", rank=1, code=None, reason="shutdown")
    (rq,) = of_type(s.decide(), JobRequeued)
    assert rq.attempt == 2 and rq.resume_from == "/ckpt/40" and rq.reason.startswith("shutdown:")
    job = s.job("j")
    assert (job.status, job.restarts, job.failure, job.shutdown) == ("pending", 0, "", "")
    (g,) = of_type(s.run(), GangReserved)
    assert g.attempt == 2 and s.job("j").resume_from == "/ckpt/40"
    s.exit("j", rank=1, code=1, reason="crashed")  # its one restart is still there to spend
    (r,) = of_type(s.decide(), GangRestarted)
    assert r.attempt == 3 and s.job("j").restarts == 1


def test_cancel_pending_and_running() -> None:
    s = Sim()
    s.node("n0", gpus=1)
    s.submit("run", gpus_per_rank=1, grace_period_s=30)
    s.submit("wait", gpus_per_rank=1)
    s.run()
    s.cancel("wait")
    s.cancel("run")
    events = s.decide()
    assert [e.job_id for e in of_type(events, JobCancelled)] == ["wait"]  # pending: at once
    assert s.job("run").status == "running"  # running: workers are stopped by the agent first
    s.tick(10)
    assert not of_type(s.decide(), JobCancelled)
    s.exit("run", code=None, reason="cancelled")
    (c,) = of_type(s.decide(), JobCancelled)
    assert c.job_id == "run" and s.job("run").status == "cancelled"


def test_cancel_gives_up_waiting_after_grace_and_margin() -> None:
    s = Sim()
    s.node("n0", gpus=1)
    s.submit("run", gpus_per_rank=1, grace_period_s=30)
    s.run()
    s.cancel("run")
    s.tick(30 + s.policies.stop_margin_s - 1)
    assert not of_type(s.decide(), JobCancelled)
    s.tick(1)
    assert of_type(s.decide(), JobCancelled)


def test_time_limit_stops_then_fails() -> None:
    s = Sim()
    s.node("n0", gpus=1)
    s.submit("j", gpus_per_rank=1, time_limit_s=60, grace_period_s=5)
    s.run()
    s.tick(59)
    assert not s.decide()
    s.tick(1)
    (stop,) = of_type(s.decide(), CancelRequested)
    assert stop.requested_by == SCHEDULER and "time limit" in stop.reason
    assert s.job("j").stop is not None and s.job("j").stop.fail  # type: ignore[union-attr]
    s.exit("j", code=None, reason="cancelled")
    (f,) = of_type(s.decide(), JobFailed)
    assert f.reason == "time limit 60s exceeded" and s.job("j").status == "failed"


def test_rejections_say_why() -> None:
    s = Sim(levels=("leaf",))
    s.node("n0", labels={"leaf": "l0"})
    s.node("n1", labels={"leaf": "l1"})
    s.queue("default")
    s.queue("research", limit_gpus=8)
    s.tick(SETTLE_S)  # capacity is judged once no node has joined for a while
    s.submit("too-big", ranks=3, gpus_per_rank=8)
    s.submit("bad-model", gpu_model="B200")
    s.submit("bad-level", topology=("rack", "require"))
    s.submit("one-leaf", ranks=2, gpus_per_rank=8, topology=("leaf", "require"))
    s.submit("over-limit", queue="research", ranks=2, gpus_per_rank=8)
    s.submit("rank-too-wide", gpus_per_rank=16)
    s.submit("unknown-queue-ok", queue="nope")
    reasons = {e.job_id: e.reasons for e in of_type(s.decide(), JobRejected)}
    assert reasons["too-big"] == ("needs 24 GPUs (3x8), the whole cluster has 16",)
    assert reasons["bad-model"][0].startswith("no cluster node has a B200 GPU; it has: H100")
    assert reasons["bad-level"][0] == "unknown topology level 'rack'; this cluster has: leaf, node"
    assert reasons["one-leaf"] == ("needs 16 GPUs (2x8) in one leaf, the largest leaf has 8",)
    assert reasons["over-limit"] == ("needs 16 GPUs, more than queue research's limit 8",)
    assert reasons["rank-too-wide"] == ("a rank needs 16 GPUs, the largest node has 8",)
    assert "unknown-queue-ok" not in reasons  # runs in the default queue
    assert s.job("unknown-queue-ok").queue == "default"


def test_job_submitted_while_nodes_still_join_waits_instead_of_being_rejected() -> None:
    """`corral up` and fresh clusters: submissions race node registration; capacity is no verdict yet."""
    s = Sim()
    s.node("n0")
    s.submit("big", ranks=2, gpus_per_rank=8)
    events = s.decide()
    assert not of_type(events, JobRejected)
    s.node("n1")
    s.tick(1)
    (reserved,) = of_type(s.decide(), GangReserved)
    assert reserved.job_id == "big" and len({p.node_id for p in reserved.ranks}) == 2


def test_unknown_queue_without_default_is_rejected() -> None:
    s = Sim()
    s.node("n0")
    s.queue("a")
    s.submit("j", queue="b")
    (r,) = of_type(s.decide(), JobRejected)
    assert "unknown queue 'b'" in r.reasons[0]


def test_waiting_reason_only_when_it_changes() -> None:
    s = Sim()
    s.node("n0", gpus=2)
    s.submit("a", gpus_per_rank=2)
    s.submit("b", gpus_per_rank=2)
    s.run()
    assert s.job("b").waiting is not None
    assert not of_type(s.decide(), JobWaiting)  # nothing changed
    assert s.state.jobs["b"].waiting.code in ("capacity", "backfill_head")  # type: ignore[union-attr]


def test_gang_on_a_gpu_that_disappeared_is_requeued() -> None:
    from schemas.events import NodeRegistered
    from tests.core.harness import inventory

    s = Sim()
    s.node("n0")
    s.submit("j", gpus_per_rank=8)
    s.run()
    s.emit(NodeRegistered(event_id=s.eid(), occurred_at=s.now, node_id="n0", incarnation="i2", address="10.0.0.1",
                          inventory=inventory(4)))  # the agent restarted and sees only 4 GPUs now
    (rq,) = of_type(s.decide(), JobRequeued)
    assert rq.job_id == "j" and s.job("j").status == "pending"
    assert s.state.owners["n0"] == ("",) * 4 and s.holding("default") == 0
