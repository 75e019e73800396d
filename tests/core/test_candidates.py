"""A cycle's preemption candidates, built positionally for speed, are the keyword-built records (core/context.py).

`AdmitContext.candidates` writes each `Candidate` in its field order with
`attained_service` and the work at risk since the newest checkpoint inlined;
`context.candidate_of` builds them the plain way, field by name (a few gangs' searches use it), on running gangs of mixed
sizes, priorities, stops (gang restarts and requeues from a failed node) and checkpoints.
"""

from __future__ import annotations

from hypothesis import event, given, settings
from hypothesis import strategies as st

from orchestrator.core.completeness import Certificate
from orchestrator.core.context import AdmitContext, candidate_of
from orchestrator.core.cycle import Cycle
from orchestrator.core.model.topology import topology_of
from orchestrator.core.tentative import tentative_plan
from orchestrator.policies import Candidate
from tests.core.harness import Sim
from tests.core.strategies import PROFILE


@given(
    gangs=st.lists(st.tuples(st.sampled_from(["a", "b"]), st.sampled_from([(1, 1), (1, 4), (2, 4), (1, 8)]),
                             st.integers(0, 2), st.booleans(), st.sampled_from([None, 600.0, 36_000.0])),
                   min_size=1, max_size=8),
    events=st.lists(st.tuples(st.sampled_from([30.0, 700.0]), st.sampled_from(["checkpoint", "restart", "fail", "none"]),
                              st.integers(0, 20)), min_size=1, max_size=6),
)
@settings(PROFILE, max_examples=PROFILE.max_examples * 2)
def test_candidates_are_the_keyword_built_records(
    gangs: list[tuple[str, tuple[int, int], int, bool, float | None]], events: list[tuple[float, str, int]],
) -> None:
    s = Sim()
    for n in range(4):
        s.node(f"n{n}")
    s.queue("a")
    s.queue("b")
    for i, (q, (ranks, g), prio, preemptible, limit) in enumerate(gangs):
        s.submit(f"r{i}", queue=q, ranks=ranks, gpus_per_rank=g, priority=prio, preemptible=preemptible,
                 checkpoint_dir="/ckpt", max_restarts=3, time_limit_s=limit)
    s.run()
    for tick, what, pick in events:
        s.tick(tick)
        active = sorted(s.state.active)
        if active and what != "none":
            jid = active[pick % len(active)]
            job = s.job(jid)
            if job.status == "running" and job.started == job.spec.ranks:
                if what == "checkpoint":
                    for rank in range(job.spec.ranks):  # (every rank's vote: the checkpoint is the gang's)
                        s.checkpoint(jid, step=pick, path=f"/ckpt/{pick}", rank=rank)
                elif what == "restart":  # a worker fails: the gang restarts (a new attempt, its restarts counted)
                    s.exit(jid, code=1, reason="failed")
                else:  # its node fails: requeued (a new attempt, an interruption), back once the node is
                    node = job.placement[0].node_id
                    s.fail_node(node)
                    s.run()
                    s.recover_node(node)
        s.run()
    s.tick(45.0)
    c = Cycle(state=s.state, now=s.now, epoch=s.epoch, policies=s.policies, topo=topology_of(s.state, s.memo),
              memo=s.memo)
    adm = AdmitContext(c, tentative_plan(c, []), Certificate())
    got = adm.candidates()
    assert got == [candidate_of(j, s.now) for j in adm._eligible()]
    assert all(type(x) is Candidate for x in got)
    event("a time limit" if any(x.expected_end < float("inf") for x in got) else "no time limit")
    event("interrupted" if any(x.interruptions for x in got) else "never interrupted")
    event("restarted" if any(s.job(x.job_id).restarts for x in got) else "never restarted")
    event("checkpoint of this attempt" if any(x.at_risk < x.gpus * (s.now - x.started_at) for x in got) else "none")
