"""GPU health in the pure core: an unhealthy GPU is never placed, its gang is requeued from its checkpoint
without spending restarts, and a node drains by policy (issue #32)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.core.evolve import fold
from orchestrator.core.model.state import HOLDING, snapshot
from schemas.events import (
    ClusterConfigured,
    GangReserved,
    GpuHealthy,
    GpuUnhealthy,
    JobRequeued,
    NodeHealthChecked,
    RankPlacement,
)
from tests.core.harness import DGX1_LINKS, Sim, of_type
from tests.core.strategies import PROFILE, tight_ops
from tests.core.test_properties import apply_op, build, check_invariants, play_agents


def sick(s: Sim, node: str, gpu: int, *, xid: int | None = 79, severity: str = "fatal") -> None:
    s.emit(GpuUnhealthy(event_id=s.eid(), occurred_at=s.now, node_id=node, gpu_index=gpu, gpu_uuid=f"GPU-{gpu}",
                        reason=f"Xid {xid}", xid=xid, severity=severity))


def well(s: Sim, node: str, gpu: int) -> None:
    s.emit(GpuHealthy(event_id=s.eid(), occurred_at=s.now, node_id=node, gpu_index=gpu, source="operator"))


def gpus_of(s: Sim, job_id: str) -> set[tuple[str, int]]:
    return {(rp.node_id, g) for rp in s.job(job_id).placement for g in rp.gpus}


def test_an_unhealthy_gpu_is_never_placed_and_the_other_seven_still_are() -> None:
    s = Sim()
    s.node("n0")
    sick(s, "n0", 3)
    s.submit("big", gpus_per_rank=8)
    for i in range(7):
        s.submit(f"one{i}", gpus_per_rank=1)
    s.run()
    assert s.job("big").status == "pending"
    placed = set().union(*(gpus_of(s, f"one{i}") for i in range(7)))
    assert placed == {("n0", g) for g in range(8) if g != 3}


def test_a_warning_changes_nothing() -> None:
    s = Sim()
    s.node("n0", gpus=1)
    sick(s, "n0", 0, xid=None, severity="warning")
    assert s.state.nodes["n0"].gpu_faults == ()
    s.submit("j", gpus_per_rank=1)
    s.run()
    assert s.job("j").status == "running"


def test_a_reservation_naming_an_unhealthy_gpu_is_void() -> None:
    s = Sim()
    s.node("n0", gpus=2)
    s.submit("j", gpus_per_rank=1)
    sick(s, "n0", 0)
    voids = s.state.voids
    s.emit(GangReserved(event_id=s.eid(), occurred_at=s.now, job_id="j", attempt=1, epoch=1,
                        ranks=(RankPlacement(rank=0, node_id="n0", gpus=(0,)),)))
    assert s.state.voids == voids + 1 and "unhealthy" in s.state.last_void
    assert s.job("j").status == "pending"


def test_a_gang_on_a_gpu_that_fails_is_requeued_from_its_checkpoint_without_spending_restarts() -> None:
    s = Sim()
    s.node("n0")
    s.node("n1")
    s.submit("gang", gpus_per_rank=8, restart_policy="gang", max_restarts=1, checkpoint_dir="/ckpt")
    s.run()
    job = s.job("gang")
    assert job.status == "running"
    node = job.placement[0].node_id
    s.checkpoint("gang", step=40, path="/ckpt/gang/40")
    sick(s, node, 3)
    events = s.decide()
    (requeued,) = of_type(events, JobRequeued)
    assert requeued.resume_from == "/ckpt/gang/40"
    assert f"GPU {node}:3 (GPU-3) unhealthy: Xid 79" in requeued.reason
    s.agents(events)
    s.run()
    job = s.job("gang")
    assert job.status == "running" and job.attempt == 2 and job.restarts == 0
    assert job.resume_from == "/ckpt/gang/40"
    assert {rp.node_id for rp in job.placement} == {"n1" if node == "n0" else "n0"}
    # The faulty GPU takes no work until undrained; the node's other seven do.
    for i in range(8):
        s.submit(f"one{i}", gpus_per_rank=1)
    s.run()
    assert s.job("one7").status == "pending"
    assert (node, 3) not in set().union(*(gpus_of(s, f"one{i}") for i in range(7)))
    well(s, node, 3)
    s.run()
    assert gpus_of(s, "one7") == {(node, 3)}


def test_two_unhealthy_gpus_drain_the_node_and_one_healthy_brings_it_back() -> None:
    s = Sim()
    s.node("n0")
    s.submit("run", gpus_per_rank=2)
    s.run()
    sick(s, "n0", 5)
    assert s.state.nodes["n0"].schedulable
    sick(s, "n0", 6)
    node = s.state.nodes["n0"]
    assert not node.schedulable and "2 unhealthy GPUs (5,6)" in node.drained
    assert s.job("run").status == "running"  # drained for new work only
    s.submit("new", gpus_per_rank=1)
    s.run()
    assert s.job("new").status == "pending"
    well(s, "n0", 6)
    assert s.state.nodes["n0"].schedulable
    s.run()
    assert s.job("new").status == "running"


def test_the_threshold_is_a_cluster_setting() -> None:
    s = Sim()
    s.node("n0")
    sick(s, "n0", 1)
    assert s.state.nodes["n0"].schedulable
    s.emit(ClusterConfigured(event_id=s.eid(), occurred_at=s.now, drain_unhealthy_gpus=1))
    assert not s.state.nodes["n0"].schedulable
    s.emit(ClusterConfigured(event_id=s.eid(), occurred_at=s.now, drain_unhealthy_gpus=0))
    assert s.state.nodes["n0"].schedulable  # 0: never by count


def test_a_failed_health_check_drains_with_its_output_and_a_pass_brings_the_node_back() -> None:
    s = Sim()
    s.node("n0", gpus=1)
    s.emit(NodeHealthChecked(event_id=s.eid(), occurred_at=s.now, node_id="n0", ok=False, exit_code=1,
                             output="ib0 down\n"))
    assert s.state.nodes["n0"].drained == "health check failed: ib0 down"
    s.submit("j", gpus_per_rank=1)
    s.run()
    assert s.job("j").status == "pending"
    s.emit(NodeHealthChecked(event_id=s.eid(), occurred_at=s.now, node_id="n0", ok=True, exit_code=0))
    s.run()
    assert s.job("j").status == "running"


def test_nvlink_placement_accounts_for_the_lost_gpu() -> None:
    """On a DGX-1 hybrid cube mesh a 4-GPU job takes a fully linked quad; with GPU 0 out it takes the other one."""
    s = Sim()
    s.node("n0", links=DGX1_LINKS)
    sick(s, "n0", 0)
    s.submit("quad", gpus_per_rank=4)
    s.run()
    assert gpus_of(s, "quad") == {("n0", g) for g in (4, 5, 6, 7)}


def test_a_preempting_gang_on_a_failed_gpu_ends_as_preempted() -> None:
    s = Sim()
    s.node("n0", gpus=1)
    s.submit("low", gpus_per_rank=1, priority=0)
    s.run()
    s.tick(100)
    s.submit("high", gpus_per_rank=1, priority=5)
    s.decide()  # asks "low" to checkpoint and leave
    assert s.job("low").status == "preempting"
    sick(s, "n0", 0)
    s.decide()
    assert s.job("low").status == "pending" and s.job("low").restarts == 0
    assert s.job("high").status == "pending"  # nowhere to go: the only GPU is out


_gpu_ops = st.one_of(
    tight_ops,
    st.tuples(st.just("gpu_sick"), st.integers(0, 1000), st.integers(0, 7)),
    st.tuples(st.just("gpu_well"), st.integers(0, 1000), st.integers(0, 7)),
)


@given(node_count=st.integers(1, 3), script=st.lists(_gpu_ops, min_size=10, max_size=80))
@PROFILE
def test_no_placement_ever_on_an_unhealthy_gpu(node_count: int, script: list[tuple[Any, ...]]) -> None:
    cluster = [{"node_id": f"n{i}", "gpus": 8, "model": "H100", "memory_mib": 81920, "labels": {}, "links": ()}
               for i in range(node_count)]
    qs = [{"name": "a", "weight": 1.0, "guaranteed_gpus": 4, "limit_gpus": None, "parent": None},
          {"name": "b", "weight": 1.0, "guaranteed_gpus": 0, "limit_gpus": None, "parent": None}]
    s = build(cluster, qs, (), min_runtime_s=0.0)
    counter = [0]
    placed_on_sick: list[str] = []
    emit = s.emit

    def checked_emit(event: Any) -> None:
        if isinstance(event, GangReserved):
            bad = {(n, f.index) for n, node in s.state.nodes.items() for f in node.gpu_faults}
            emit(event)
            job = s.state.jobs.get(event.job_id)
            if job is not None and job.status in HOLDING and job.attempt == event.attempt and job.placement == event.ranks:
                placed_on_sick.extend(f"{event.job_id}@{n}/{g}" for rp in event.ranks for g in rp.gpus
                                      if (n := rp.node_id, g) in bad)
        else:
            emit(event)

    s.emit = checked_emit  # type: ignore[method-assign]
    for op in script:
        if op[0] in ("gpu_sick", "gpu_well"):
            nid = f"n{op[1] % node_count}"
            (sick if op[0] == "gpu_sick" else well)(s, nid, op[2])
        else:
            apply_op(s, op, counter)
        check_invariants(s.state)
        assert not placed_on_sick
        for jid in s.state.active:  # a gang that holds a faulty GPU is marked for its requeue
            job = s.state.jobs[jid]
            faults = {(n, f.index) for n, node in s.state.nodes.items() for f in node.gpu_faults}
            if gpus_of(s, jid) & faults:
                assert job.gpu_fault, jid
    for _ in range(3):  # settle: every gang on a faulty GPU leaves it
        s.decide()
        play_agents(s)
    faults = {(n, f.index) for n, node in s.state.nodes.items() for f in node.gpu_faults}
    for jid in s.state.active:
        assert not (gpus_of(s, jid) & faults) or s.state.jobs[jid].stop is not None, jid
    assert snapshot(fold(s.log)) == snapshot(s.state)


def test_usage_by_state_counts_the_gpu_hours_an_attempt_ended_by_a_gpu_fault_held() -> None:
    from orchestrator.core.accounting import GPU_FAULT, GpuTime
    from orchestrator.core.model.state import ClusterState

    s = Sim()
    s.node("n0")
    s.node("n1")
    s.submit("gang", gpus_per_rank=8)
    s.run()
    node = s.job("gang").placement[0].node_id
    s.tick(3600)
    sick(s, node, 3)
    s.run()
    assert s.job("gang").attempt == 2
    t = GpuTime(by="state")
    state = ClusterState()
    for e in s.log:
        state = t.fold(state, e)
    assert t.accounts[GPU_FAULT].gpu_seconds == 8 * 3600
    assert t.accounts[GPU_FAULT].reservations == 1
