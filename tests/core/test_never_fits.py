"""`never_fits`: what `corral submit` refuses is what the scheduler's stage 3 would reject, by the same rule."""

from __future__ import annotations

import msgspec

from orchestrator.core.model.facts import SETTLE_S
from orchestrator.core.reject import never_fits
from schemas.events import JobRejected, JobWaiting
from schemas.jobspec import JobSpec, Topology
from tests.core.harness import Sim, of_type


def _cluster() -> Sim:
    s = Sim(levels=("leaf",))
    s.node("n0", labels={"leaf": "l0"})
    s.node("n1", labels={"leaf": "l1"})
    return s


SPECS = {
    "too-big": JobSpec(name="too-big", ranks=3, gpus_per_rank=8),
    "bad-model": JobSpec(name="bad-model", gpu_model="B200"),
    "too-little-memory": JobSpec(name="too-little-memory", min_gpu_memory_mib=200_000),
    "one-leaf": JobSpec(name="one-leaf", ranks=2, gpus_per_rank=8, topology=Topology(level="leaf", mode="require")),
    "rank-too-wide": JobSpec(name="rank-too-wide", gpus_per_rank=16),
}


def test_submit_verdict_matches_the_schedulers_rejection() -> None:
    s = _cluster()
    s.tick(SETTLE_S)
    verdicts = {name: never_fits(s.state, spec) for name, spec in SPECS.items()}
    for name, spec in SPECS.items():
        s.submit(name, **_fields(spec))
    rejected = {e.job_id: e.reasons for e in of_type(s.decide(), JobRejected)}
    assert rejected == verdicts
    assert verdicts["too-big"] == ("needs 24 GPUs (3x8), the whole cluster has 16",)
    assert verdicts["bad-model"][0].startswith("no cluster node has a B200 GPU; it has: H100")
    assert verdicts["too-little-memory"][0].startswith("no cluster node has a GPU with >= 200000 MiB")
    assert verdicts["one-leaf"] == ("needs 16 GPUs (2x8) in one leaf, the largest leaf has 8",)
    assert verdicts["rank-too-wide"] == ("a rank needs 16 GPUs, the largest node has 8",)
    assert never_fits(s.state, JobSpec(name="fits", ranks=2, gpus_per_rank=8)) == ()


def test_submit_judges_the_registered_nodes_even_before_the_cluster_settled() -> None:
    """The scheduler postpones its verdict while nodes join; the submitter is told now (and may say
    --allow-future-nodes); with no node at all there is nothing to judge."""
    s = Sim()
    assert never_fits(s.state, SPECS["too-big"]) == ()
    s.node("n0")
    assert never_fits(s.state, SPECS["too-big"]) == ("needs 24 GPUs (3x8), the whole cluster has 8",)


def test_allow_future_nodes_waits_for_capacity_instead_of_a_rejection() -> None:
    s = _cluster()
    s.queue("default")
    s.queue("small", limit_gpus=4)
    s.tick(SETTLE_S)
    s.submit("later", ranks=3, gpus_per_rank=8, allow_future_nodes=True)
    s.submit("over-limit", queue="small", ranks=3, gpus_per_rank=8, allow_future_nodes=True)
    assert never_fits(s.state, JobSpec(name="later", ranks=3, gpus_per_rank=8, allow_future_nodes=True)) == ()
    events = s.decide()
    rejected = {e.job_id: e.reasons for e in of_type(events, JobRejected)}
    # Nodes may join; a queue's limit is no matter of nodes.
    assert rejected == {"over-limit": ("needs 24 GPUs, more than queue small's limit 4",)}
    (waiting,) = [e for e in of_type(events, JobWaiting) if e.job_id == "later"]
    assert s.job("later").status == "pending" and waiting.code == "capacity", waiting
    s.node("n2", labels={"leaf": "l2"})
    s.tick(1)
    s.decide()
    assert s.job("later").status == "reserved"


def _fields(spec: JobSpec) -> dict[str, object]:
    import msgspec

    out = msgspec.structs.asdict(spec)
    topo = out.pop("topology")
    if topo is not None:
        out["topology"] = (topo.level, topo.mode)
    return out


def test_a_spec_without_the_flag_encodes_as_before_it_existed() -> None:
    plain = JobSpec(name="j")
    assert b"allow_future_nodes" not in msgspec.json.encode(plain)  # the simulator's and old logs keep their bytes
    assert not plain.waits_for_nodes
    said = msgspec.json.decode(b'{"name":"j","allow_future_nodes":true}', type=JobSpec)
    assert said.waits_for_nodes and b'"allow_future_nodes":true' in msgspec.json.encode(said)
    assert not msgspec.json.decode(b'{"name":"j","allow_future_nodes":false}', type=JobSpec).waits_for_nodes
