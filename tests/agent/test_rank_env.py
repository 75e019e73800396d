"""Rank environments for multi-node gangs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import structlog
from structlog.testing import LogCapture

from events.bus import Bus
from nodeagent.agent import Agent, AgentConfig
from nodeagent.rank_env import ignored_spec_env, node_order, rank_env
from nodeagent.runtime.simulated import SimulatedRuntime
from schemas.events import GangReserved, RankPlacement
from schemas.jobspec import JobSpec
from tests.core.harness import Sim, inventory

ADDR = {"n1": "10.0.0.1", "n2": "10.0.0.2", "n3": "10.0.0.3"}


def _gang(*placements: tuple[int, str, tuple[int, ...]], port: int = 29611, attempt: int = 2) -> GangReserved:
    ranks = tuple(RankPlacement(rank=r, node_id=n, gpus=g) for r, n, g in placements)
    return GangReserved(
        event_id="e", occurred_at=0.0, job_id="j1", attempt=attempt, epoch=1, ranks=ranks, master_port=port
    )


def _env(g: GangReserved, rank: int, **kw: Any) -> dict[str, str]:
    return rank_env(g.ranks, rank, job_id=g.job_id, attempt=g.attempt, master_port=g.master_port, **kw)


SPEC = JobSpec(name="t", ranks=4, gpus_per_rank=2, checkpoint_dir="/ckpt/j1", env={"FOO": "bar"})


def test_two_nodes_two_ranks_each() -> None:
    g = _gang((0, "n2", (0, 1)), (1, "n2", (2, 3)), (2, "n1", (4, 5)), (3, "n1", (6, 7)))
    envs = {r: _env(g, r, spec=SPEC, node_addresses=ADDR) for r in range(4)}
    assert node_order(g.ranks) == ("n2", "n1")  # rank 0's node first, whatever its name sorts as
    assert all(e["MASTER_ADDR"] == "10.0.0.2" and e["MASTER_PORT"] == "29611" for e in envs.values())
    assert all(e["WORLD_SIZE"] == "4" and e["LOCAL_WORLD_SIZE"] == "2" for e in envs.values())
    assert [envs[r]["NODE_RANK"] for r in range(4)] == ["0", "0", "1", "1"]
    assert [envs[r]["LOCAL_RANK"] for r in range(4)] == ["0", "1", "0", "1"]
    assert [envs[r]["RANK"] for r in range(4)] == ["0", "1", "2", "3"]
    assert envs[3]["CUDA_VISIBLE_DEVICES"] == "6,7" == envs[3]["NVIDIA_VISIBLE_DEVICES"]
    assert envs[3]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    e = envs[2]
    assert (e["CORRAL_JOB_ID"], e["CORRAL_ATTEMPT"], e["CORRAL_CHECKPOINT_DIR"]) == ("j1", "2", "/ckpt/j1")
    assert e["CORRAL_CHECKPOINT_SIGNAL"] == "SIGUSR1" and e["FOO"] == "bar"
    assert "CORRAL_RESUME_FROM" not in e


def test_uneven_ranks_per_node_and_gpus() -> None:
    g = _gang((0, "n1", (0,)), (1, "n1", (1,)), (2, "n1", (2,)), (3, "n3", (5, 6, 7)))
    e3 = _env(g, 3, spec=SPEC, node_addresses={"n1": "h1"})  # only rank 0's address is needed
    assert (e3["NODE_RANK"], e3["LOCAL_RANK"], e3["LOCAL_WORLD_SIZE"]) == ("1", "0", "1")
    assert e3["CUDA_VISIBLE_DEVICES"] == "5,6,7" and e3["MASTER_ADDR"] == "h1"
    e2 = _env(g, 2, spec=SPEC, node_addresses=ADDR)
    assert (e2["NODE_RANK"], e2["LOCAL_RANK"], e2["LOCAL_WORLD_SIZE"]) == ("0", "2", "3")


def test_placements_out_of_order_are_sorted_by_rank() -> None:
    g = _gang((3, "n1", (3,)), (1, "n2", (1,)), (0, "n2", (0,)), (2, "n1", (2,)))
    e = _env(g, 2, spec=SPEC, node_addresses=ADDR)
    assert (e["NODE_RANK"], e["LOCAL_RANK"], e["MASTER_ADDR"]) == ("1", "0", "10.0.0.2")


def test_resume_and_overrides() -> None:
    g = _gang((0, "n1", (0,)))
    e = _env(g, 0, spec=SPEC, node_addresses=ADDR, resume_from="/ckpt/j1/step-10.state", checkpoint_dir="/x")
    assert e["CORRAL_RESUME_FROM"] == "/ckpt/j1/step-10.state" and e["CORRAL_CHECKPOINT_DIR"] == "/x"
    no_ckpt = _env(g, 0, spec=JobSpec(name="t"), node_addresses=ADDR)
    assert "CORRAL_CHECKPOINT_DIR" not in no_ckpt


def test_spec_env_cannot_override_rank_or_corral_vars() -> None:
    spec = JobSpec(
        name="t",
        env={
            "RANK": "7",
            "CORRAL_JOB_ID": "evil",
            "CORRAL_RESUME_FROM": "/x",
            "CUDA_VISIBLE_DEVICES": "0,1,2,3",
            "OMP_NUM_THREADS": "4",
        },
    )
    e = _env(_gang((0, "n1", (2,))), 0, spec=spec, node_addresses=ADDR)
    assert e["RANK"] == "0" and e["CORRAL_JOB_ID"] == "j1" and e["CUDA_VISIBLE_DEVICES"] == "2"
    assert "CORRAL_RESUME_FROM" not in e and e["OMP_NUM_THREADS"] == "4"
    assert ignored_spec_env(spec) == ("CORRAL_JOB_ID", "CORRAL_RESUME_FROM", "CUDA_VISIBLE_DEVICES", "RANK")


def test_uuid_and_isolated_gpu_ids() -> None:
    g = _gang((0, "n1", (4, 5)))
    uuids = {4: "GPU-aaaa", 5: "GPU-bbbb"}
    e = _env(g, 0, spec=SPEC, node_addresses=ADDR, gpu_uuids=uuids)
    assert e["CUDA_VISIBLE_DEVICES"] == "GPU-aaaa,GPU-bbbb" == e["NVIDIA_VISIBLE_DEVICES"]
    c = _env(g, 0, spec=SPEC, node_addresses=ADDR, isolated_gpus=True)
    assert c["CUDA_VISIBLE_DEVICES"] == "0,1" and c["NVIDIA_VISIBLE_DEVICES"] == "4,5"
    cpu = _env(_gang((0, "n1", ())), 0, spec=SPEC, node_addresses=ADDR)
    assert cpu["CUDA_VISIBLE_DEVICES"] == "" and cpu["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_errors_name_the_problem() -> None:
    g = _gang((0, "n1", (0,)), (1, "n2", (0,)))
    with pytest.raises(ValueError, match="rank 5"):
        _env(g, 5, spec=SPEC, node_addresses=ADDR)
    with pytest.raises(ValueError, match="no address for node 'n1'"):
        _env(g, 1, spec=SPEC, node_addresses={"n2": "x"})


async def test_the_agent_warns_once_per_attempt_of_the_spec_env_it_overrides(
    bus: Bus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job's env that sets RANK (or any key corral sets) is dropped; the agent says so, once, not per rank."""
    import nodeagent.agent

    # The agent's own logger, not structlog.testing.capture_logs: an earlier test's configure_logging
    # (cached loggers, a level filter) would hide what capture_logs installs.
    capture = LogCapture()
    monkeypatch.setattr(nodeagent.agent, "log", structlog.wrap_logger(None, processors=[capture],
                                                                      wrapper_class=structlog.BoundLogger,
                                                                      cache_logger_on_first_use=False))
    sim = Sim()
    sim.node("n0")
    sim.submit("A", ranks=2, gpus_per_rank=1, command=("sleep", "3600"), env={"RANK": "7", "OMP_NUM_THREADS": "1"})
    sim.submit("B", command=("sleep", "3600"), env={"OMP_NUM_THREADS": "1"})
    sim.decide()
    await bus.append_many(sim.log)
    agent = Agent(bus, AgentConfig(node_id="n0", data_dir=tmp_path), inventory(), SimulatedRuntime())
    await agent.follower.catch_up()
    try:
        await agent.reconcile()
        assert len(agent.workers) == 3
    finally:
        await agent.stop_workers(0.1)
    warned = [e for e in capture.entries if e["event"] == "spec_env_ignored"]
    assert [(e["job_id"], e["attempt"], e["keys"]) for e in warned] == [("A", 1, ["RANK"])]
