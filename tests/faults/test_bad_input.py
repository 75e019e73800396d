"""Malformed, hostile and invalid input: every reader logs and continues, garbage changes nothing.

DESIGN.md: "Decoding must never crash a reader: an unknown tag or a malformed
payload becomes an Unknown value that folds to 'no change'", and evolve
validates every decision against the state at its log position.

Most cases run in-process (>= 10,000 generated per run: decode + evolve +
decide, then the invariants on the resulting state); a sample goes through a
real nats-server, published raw into corral.> subjects, to the running
scheduler and agents (test_garbage_through_the_server).
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import msgspec
import nats.errors
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from events.bus import Bus
from events.sdk import Client
from events.server import NatsServer
from events.snapshots import SnapshotStore
from orchestrator.core.decide import decide
from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import ClusterState, snapshot
from schemas import (
    GangReserved,
    JobRejected,
    JobSpec,
    JobSubmitted,
    Unknown,
    decode,
    encode,
)
from schemas.events import ClusterConfigured, NodeRegistered, SchedulerElected
from schemas.heartbeat import HEARTBEAT_BUCKET
from schemas.jobspec import Topology
from tests.faults.badinput import (
    BASE,
    EVENTS,
    GARBAGE,
    JOBS,
    LATER,
    NOBODY_EVENTS,
    NOW,
    fold_and_decide,
    fresh,
    normalized,
    server_garbage,
)
from tests.faults.logcheck import check_log, read_log
from tests.faults.services import agent_proc, logged_starts, observer, scheduler_proc, stop_all, until
from tests.stored import fold_stored, stored

FAST = {"deadline": None, "database": None, "suppress_health_check": [HealthCheck.too_slow,
                                                                        HealthCheck.data_too_large]}

# --- in-process: decode + evolve + decide -------------------------------------------------------


@settings(max_examples=4000, **FAST)
@given(GARBAGE)
def test_garbage_bytes_fold_to_no_change(raw: bytes) -> None:
    """Fault: random bytes, random JSON, tagged dicts of random fields, real events with a field of the
    wrong type, a field missing, an extra field, an unknown tag. Check: decode never raises; what it
    cannot read folds to no change (snapshot equal but for the position and the unknown counter); what
    it can read keeps invariants 1 and 2 and decide runs on it."""
    event = decode(raw)
    state = fresh()
    if isinstance(event, Unknown):
        evolve(state, event, state.seq + 1)
        assert state.unknown_events == BASE.unknown_events + 1
        assert normalized(state, BASE) == snapshot(BASE)
    else:
        fold_and_decide(state, event)


@settings(max_examples=2500, **FAST)
@given(EVENTS)
def test_hostile_events_keep_the_fold_sound(event: object) -> None:
    """Fault: every event type, decodable but with hostile values: ids of jobs and nodes that exist and
    that do not, ranks of 10^9 and -1, int64 extremes, epochs old and new, times from -1e308 to 1e308,
    GPU lists out of range, odd inventories, queue cycles, unknown topology levels. Check: evolve and
    decide never raise; invariants 1 and 2 and the owner table hold after the event and after folding
    decide's answer; the event survives its own wire round trip."""
    assert decode(encode(event)) == event  # type: ignore[arg-type]
    fold_and_decide(fresh(), event)


@settings(max_examples=1000, **FAST)
@given(NOBODY_EVENTS)
def test_events_about_unknown_jobs_and_nodes_change_nothing(event: object) -> None:
    """Fault: well-formed events (worker reports, decisions, cancels, cordons...) about jobs or nodes the
    log never saw. Check: no change but the position (and the void counter for decisions)."""
    state = fresh()
    evolve(state, event, state.seq + 1)  # type: ignore[arg-type]
    assert normalized(state, BASE) == snapshot(BASE)


SPECS = st.builds(JobSpec, name=st.text(max_size=8), queue=st.sampled_from(["prod", "research", "nope"]),
                  ranks=st.integers(-2, 20), gpus_per_rank=st.integers(-2, 20), priority=st.integers(-5, 5),
                  command=st.just(("sleep", "1")))


@settings(max_examples=1000, **FAST)
@given(st.sampled_from(JOBS), SPECS)
def test_duplicate_submit_changes_nothing(job_id: str, spec: JobSpec) -> None:
    """Fault: a second JobSubmitted for an existing job (a retry past the dedupe window, or a client
    reusing an id) with a different spec. Check: no change but the position."""
    state = fresh()
    evolve(state, JobSubmitted(event_id=f"again:{job_id}", occurred_at=NOW, job_id=job_id, spec=spec),
           state.seq + 1)
    assert normalized(state, BASE) == snapshot(BASE)


#: Specs a submitter can get past decoding (a client that skips parse_jobspec, a raw publish) that can
#: never run here: each must come back as JobRejected with its reasons.
UNRUNNABLE = st.one_of(
    st.builds(JobSpec, name=st.just("neg"), ranks=st.integers(-(10**9), 0), gpus_per_rank=st.integers(0, 8),
              queue=st.just("prod")),
    st.builds(JobSpec, name=st.just("neggpu"), ranks=st.integers(1, 4), gpus_per_rank=st.integers(-(10**9), -1),
              queue=st.just("prod")),
    st.builds(JobSpec, name=st.just("wide"), ranks=st.just(1), gpus_per_rank=st.integers(9, 10**9),
              queue=st.just("prod")),
    st.builds(JobSpec, name=st.just("huge"), ranks=st.integers(5, 10**9), gpus_per_rank=st.integers(8, 64),
              queue=st.just("research")),
    st.builds(JobSpec, name=st.just("queue"), queue=st.text(min_size=1, max_size=8).filter(
        lambda q: q not in ("prod", "research"))),
    st.builds(JobSpec, name=st.just("level"), queue=st.just("prod"), topology=st.builds(
        Topology, level=st.text(max_size=8).filter(lambda v: v not in ("node", "leaf", "block", "cluster")),
        mode=st.sampled_from(["require", "prefer"]))),
    st.builds(JobSpec, name=st.just("model"), queue=st.just("prod"), gpu_model=st.sampled_from(["B200", "A100"])),
    st.builds(JobSpec, name=st.just("memory"), queue=st.just("prod"), min_gpu_memory_mib=st.integers(81921, 2**40)),
)


@settings(max_examples=1500, **FAST)
@given(UNRUNNABLE)
def test_unrunnable_submit_gets_rejected_with_reasons(spec: JobSpec) -> None:
    """Fault: a decodable JobSubmitted that can never run (non-positive ranks, negative GPUs, a rank wider
    than any node, a gang larger than the cluster, an unknown queue, an unknown topology level or GPU
    model, too much memory). Check: the next decide answers JobRejected for it, with a reason, and never
    reserves it; the rest of the cluster is untouched by that answer."""
    state = fresh()
    decisions = fold_and_decide(state, JobSubmitted(event_id="submit:bad", occurred_at=NOW, job_id="bad",
                                                    spec=spec))
    mine = [d for d in decisions if getattr(d, "job_id", None) == "bad"]
    assert not [d for d in mine if isinstance(d, GangReserved)]
    rejected = [d for d in mine if isinstance(d, JobRejected)]
    assert len(rejected) == 1 and all(r.strip() for r in rejected[0].reasons), mine
    assert state.jobs["bad"].status == "rejected"


VALIDATOR_ONLY = {
    "negative time limit": {"time_limit_s": -1.0},
    "zero time limit": {"time_limit_s": 0.0},
    "negative grace": {"grace_period_s": -5.0},
    "negative max_restarts": {"max_restarts": -1},
    "priority out of range": {"priority": 10**9},
    "empty name": {"name": ""},
    "empty GPU model": {"gpu_model": ""},
    "reserved env": {"env": {"CORRAL_JOB_ID": "spoofed"}},
    "unknown checkpoint signal": {"checkpoint_signal": "SIGKILL"},
    "relative mount": {"mounts": [{"source": "data", "target": "/data"}]},
    "more CPU ranks than MAX_RANKS": {"ranks": 70_000, "gpus_per_rank": 0},
}


@pytest.mark.parametrize("fields", [pytest.param(v, id=k) for k, v in VALIDATOR_ONLY.items()])
def test_invalid_spec_gets_rejected(fields: dict[str, object]) -> None:
    """Fault: a decodable JobSubmitted whose spec schemas.jobspec_problems calls invalid.
    Check: JobRejected with a reason, never a reservation."""
    spec = msgspec.convert({"name": "bad", "queue": "prod", "command": ["sleep", "1"], **fields}, JobSpec)
    state = fresh()
    evolve(state, JobSubmitted(event_id="submit:bad", occurred_at=NOW, job_id="bad", spec=spec), state.seq + 1)
    decisions = decide(state, LATER, epoch=state.epoch)
    mine = [d for d in decisions if getattr(d, "job_id", None) == "bad"]
    assert any(isinstance(d, JobRejected) for d in mine), [type(d).__name__ for d in mine]


def test_unrunnable_submit_during_cluster_start_is_rejected_later() -> None:
    """Fault: a 1x9-GPU job on 8-GPU nodes, submitted one second after the nodes registered.
    Check: once the cluster has settled, decide rejects it (it can never run here)."""
    from orchestrator.core.model.facts import SETTLE_S

    s = ClusterState()
    for e in (ClusterConfigured(event_id="c", occurred_at=NOW, topology_levels=("block", "leaf")),
              SchedulerElected(event_id="e", occurred_at=NOW, epoch=1, scheduler_id="s1"),
              NodeRegistered(event_id="r", occurred_at=NOW, node_id="n0", incarnation="i", address="a",
                             inventory=BASE.nodes["n0"].inventory),
              JobSubmitted(event_id="x", occurred_at=NOW + 1, job_id="wide", spec=JobSpec(
                  name="wide", ranks=1, gpus_per_rank=9, command=("sleep", "1")))):
        evolve(s, e)
    seen: list[str] = []
    for t in (NOW + 2, NOW + SETTLE_S + 5, NOW + 10 * SETTLE_S):
        for d in decide(s, t, epoch=1):
            seen.append(type(d).__name__)
            evolve(s, d)
    assert s.jobs["wide"].status == "rejected", seen


def test_case_count_meets_the_acceptance_bar() -> None:
    """The acceptance bar for this suite: >= 10,000 generated in-process cases per run."""
    tests = [test_garbage_bytes_fold_to_no_change, test_hostile_events_keep_the_fold_sound,
             test_events_about_unknown_jobs_and_nodes_change_nothing, test_duplicate_submit_changes_nothing,
             test_unrunnable_submit_gets_rejected_with_reasons]
    assert sum(t._hypothesis_internal_use_settings.max_examples for t in tests) >= 10_000  # type: ignore[attr-defined]


# --- through a real nats-server, to the running services --------------------------------------------

SUBJECTS = ["corral.job.zz-1.JobSubmitted", "corral.job.run.WorkerStarted", "corral.node.n0.NodeFailed",
            "corral.node.zz-9.NodeRegistered", "corral.sched.SchedulerElected", "corral.queue.prod.QueueDefined",
            "corral.x", "corral.job.a.b.c.d", "corral.job.zz-2.Nope"]

#: Decodable submits that can never run, published raw (no client-side validation): each gets JobRejected.
#: (Capacity verdicts wait until the cluster has settled, so these are shape, topology and range problems.)
INVALID_SUBMITS = {
    "neg-ranks": {"ranks": -3}, "zero-ranks": {"ranks": 0}, "neg-gpus": {"gpus_per_rank": -8},
    "bad-level": {"topology": {"level": "rack", "mode": "require"}},
    "bad-level-prefer": {"topology": {"level": "", "mode": "prefer"}},
}


def _raw_submit(job_id: str, fields: dict[str, object]) -> bytes:
    spec = {"name": job_id, "command": ["sleep", "0.1"], **fields}
    return json.dumps({"type": "JobSubmitted", "event_id": f"submit:{job_id}", "occurred_at": 1.0,
                       "job_id": job_id, "spec": spec}).encode()


@pytest.mark.slow
async def test_garbage_through_the_server(nats_server: NatsServer, bus: Bus, tmp_path: Path) -> None:
    """Fault: 300 generated payloads (undecodable ones and well-formed events about jobs and nodes that do
    not exist; badinput.server_garbage, seeded) published raw into corral.> subjects, plus payloads just under max_payload (1 MiB), one
    over it, garbage heartbeats in the KV bucket, and decodable-but-invalid JobSubmitted events, while a
    `corral scheduler` and two `corral agent` processes (simulated runtime) run.
    Check: every service is still alive and working (a gang spanning both nodes completes after the
    garbage; a 1 MiB but valid submit runs too); each invalid submit gets JobRejected with its reason;
    folding the log without the garbage gives the same state as with it (but for position and
    counters); the scheduler's own state at its clean stop equals a fresh replay, byte for byte; no
    worker started twice; whole-log invariants hold."""
    rng = random.Random(20261130)
    garbage = server_garbage(rng, 300)
    url = nats_server.url
    procs = [scheduler_proc(url, "s1", tmp_path, heartbeat_timeout=30.0)]
    procs += [agent_proc(url, f"n{i}", tmp_path, index=i) for i in range(2)]
    good = JobSpec(name="good", ranks=2, gpus_per_rank=8, command=("sleep", "0.2"))
    garbage_seqs: set[int] = set()
    async with observer(bus) as f:
        try:
            await until(f, lambda s: s.epoch >= 1 and len(s.nodes) == 2, 60, "a leader and two nodes", alive=procs)
            client = Client(bus)
            await client.submit(good, job_id="before")
            await until(f, lambda s: s.jobs["before"].status == "completed", 30, "a gang before the garbage",
                        alive=procs)

            for raw in garbage:
                ack = await bus.js.publish(rng.choice(SUBJECTS), raw)
                garbage_seqs.add(ack.seq)
            near = bus.nc.max_payload - 4096
            for _ in range(3):
                ack = await bus.js.publish("corral.job.zz-big.JobSubmitted", rng.randbytes(near))
                garbage_seqs.add(ack.seq)
            ack = await bus.js.publish("corral.job.zz-big.Nope", json.dumps({"type": "Nope", "x": "y" * near}).encode())
            garbage_seqs.add(ack.seq)
            with pytest.raises(nats.errors.MaxPayloadError):
                await bus.js.publish("corral.job.zz-big.JobSubmitted", b"x" * (bus.nc.max_payload + 1))
            kv = await bus.kv(HEARTBEAT_BUCKET)
            for key, value in (("n0", b"{not json"), ("ghost", b'{"node_id": 5}'), ("n1", rng.randbytes(64))):
                await kv.put(key, value)

            big_env = JobSpec(name="bigenv", ranks=1, gpus_per_rank=1, command=("sleep", "0.1"),
                              env={"BLOB": "x" * (near - 2048)})
            await client.submit(big_env, job_id="bigenv")
            for job_id, fields in INVALID_SUBMITS.items():
                await bus.js.publish(f"corral.job.{job_id}.JobSubmitted", _raw_submit(job_id, fields))
            await client.submit(good, job_id="after")
            await until(f, lambda s: all(s.jobs.get(j) is not None and s.jobs[j].status in ("completed", "rejected")
                                         for j in ["after", "bigenv", *INVALID_SUBMITS]), 60,
                        "the good jobs to complete and the invalid ones to be rejected", alive=procs)
            await asyncio.sleep(1.0)  # heartbeats keep coming although garbage was put among them
            alive = [p.poll() is None for p in procs]
        finally:
            codes = stop_all(procs)
    assert alive == [True, True, True], f"a reader died of garbage (scheduler, n0, n1): {alive}"
    assert codes[0] == 0, "the scheduler did not stop cleanly (its snapshot is compared below)"

    events = await read_log(bus)
    final = check_log(events, jobs=["before", "after", "bigenv", *INVALID_SUBMITS])
    assert {j: final.jobs[j].status for j in ("before", "after", "bigenv")} == dict.fromkeys(
        ("before", "after", "bigenv"), "completed")
    for job_id in INVALID_SUBMITS:
        job = final.jobs[job_id]
        assert job.status == "rejected" and job.end_reason.strip(), (job_id, job.status, job.end_reason)
    assert not any(n.failed for n in final.nodes.values()), "garbage heartbeats failed a node"
    assert final.unknown_events >= sum(isinstance(decode(raw), Unknown) for raw in garbage)

    without = ClusterState()
    for seq, event in events:
        if seq not in garbage_seqs:
            evolve(without, event, seq)
    assert normalized(final, without) == snapshot(without), "garbage changed the state"

    live = await SnapshotStore(bus.js).load(ClusterState)
    assert live is not None and live.seq >= max(garbage_seqs)
    replayed = fold_stored(await stored(bus), live.seq)  # the scheduler dates events by the stream (#30)
    assert snapshot(replayed) == snapshot(live), "the scheduler's state differs from a replay of the log"
    twice = {k: n for k, n in logged_starts(tmp_path.glob("agent-*.log")).items() if n > 1}
    assert not twice, twice
