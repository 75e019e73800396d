"""Admission's shortcuts for heads their queue's limit blocks decide exactly as the full judgment (issue #42, sim speed).

Three shortcuts give a head the verdict `heads.judge` would reach, without judging it:
- the quota verdict of a head that its queue's limit blocks and that can stop nobody, kept per (queue,
  GPUs, priority, plan charges) (`admit_one`; only under the default `Policies.request`);
- a starving gang's verdict shared with an alike gang whose attained service differs, where the search and
  its rule do not read it (`PreemptionRule.reads_attained`; only under the default `Policies.victims`);
- a starving gang at its limit whose starvation victims cannot free its quota, told so from the cycle's
  kept pool instead of a search (`AdmitContext.victim_pool`, `PreemptionRule.reason_reads`).
The same policies with wrappers that switch them off (a request function and a victims function that are
not the defaults' objects, a starvation rule that says it reads everything) must emit the same events on
every state: queues at their limit (limit = guarantee, as bench/sim_speed.py's isolated trace), big gangs
of mixed shapes, priorities and attained service past a short starvation bound, a small search budget.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core.decide import decide_cycle
from orchestrator.core.model.memo import Memo
from orchestrator.core.model.state import Job, restore, snapshot
from orchestrator.policies import DEFAULT_POLICIES, Candidate, Policies, PreemptionAsk, PreemptionRule
from orchestrator.policies.placement import GangRequest, request_of
from orchestrator.policies.victims import find_victims
from tests.core.harness import Sim
from tests.core.strategies import PROFILE


def _request(job: Job) -> GangRequest:
    return request_of(job)


def _victims(ask: PreemptionAsk, cands: object, *rest: object) -> list[Candidate] | None:
    return find_victims(ask, cands, *rest)  # type: ignore[arg-type]


def without_shortcuts(pol: Policies) -> Policies:
    """The same decisions by definition, with every shortcut's precondition false."""
    rule: PreemptionRule = pol.starvation_rule._replace(reads_attained=True, reason_reads=None)
    return replace(pol, request=_request, victims=_victims, starvation_rule=rule)


gangs = st.tuples(st.sampled_from(["a", "b"]), st.sampled_from([(1, 1), (1, 4), (1, 8), (2, 8), (3, 4), (2, 6)]),
                  st.integers(0, 2), st.booleans())


@given(
    running=st.lists(gangs, min_size=1, max_size=8),
    waiting=st.lists(gangs, min_size=1, max_size=14),
    limits=st.tuples(st.sampled_from([8, 16, 24]), st.sampled_from([8, 16, 24, None])),
    searches=st.sampled_from([1, 2, 8]),
    min_runtime=st.sampled_from([0.0, 300.0]),
    steps=st.lists(st.tuples(st.sampled_from([60.0, 400.0, 2000.0]), st.integers(0, 20)), min_size=2, max_size=6),
)
@settings(PROFILE, max_examples=PROFILE.max_examples * 3)
def test_shortcuts_decide_as_the_full_judgment(
    running: list[tuple[str, tuple[int, int], int, bool]], waiting: list[tuple[str, tuple[int, int], int, bool]],
    limits: tuple[int, int | None], searches: int, min_runtime: float, steps: list[tuple[float, int]],
) -> None:
    fast = replace(DEFAULT_POLICIES, starvation_bound_s=900.0, starvation_bound_floor_s=120.0,
                   preemption_searches=searches)
    slow = without_shortcuts(fast)
    s = Sim(min_runtime_s=min_runtime, policies=fast)
    for n in range(4):
        s.node(f"n{n}")
    s.queue("a", limit_gpus=limits[0], guaranteed_gpus=limits[0])
    s.queue("b", limit_gpus=limits[1], guaranteed_gpus=limits[1] or 0)
    for i, (q, (ranks, g), prio, preemptible) in enumerate(running):
        s.submit(f"r{i}", queue=q, ranks=ranks, gpus_per_rank=g, priority=prio, preemptible=preemptible,
                 checkpoint_dir="/ckpt")
        s.run(cycles=2)
    for i, (q, (ranks, g), prio, preemptible) in enumerate(waiting):
        s.submit(f"w{i}", queue=q, ranks=ranks, gpus_per_rank=g, priority=prio, preemptible=preemptible,
                 checkpoint_dir="/ckpt")
    for tick, pick in steps:
        s.tick(tick)
        for _ in range(3):
            # Both cold (this compares the cycle's shortcuts, not the memos kept between cycles); the events
            # and whether the admission was complete (a refused search makes it not: the next call admits).
            full = decide_cycle(restore(snapshot(s.state)), s.now, epoch=s.epoch, policies=slow)
            quick = decide_cycle(restore(snapshot(s.state)), s.now, epoch=s.epoch, policies=fast)
            assert quick == full
            s.memo = Memo()
            events = s.decide()
            assert events == quick.events
            s.agents(events)
        active = sorted(s.state.active)
        if active and pick % 3 == 0:  # a gang ends: its queue frees quota
            jid = active[pick % len(active)]
            job = s.job(jid)
            if job.status in ("running", "reserved") and job.started == job.spec.ranks:
                s.finish(jid)
