"""Least attained service inside a queue (issue #42, opt-in `Policies.service_preemption`).

A pending job may stop a running job of its own queue that has had more service (a higher level of
policies/in_queue_service.py), of no higher priority, stopped fewer than 3 times, holding at most
max(8, the preemptor's GPUs) GPUs; never a job of another queue. Off (the default), none of it.
"""

from __future__ import annotations

from dataclasses import replace

import msgspec

from orchestrator.core.model.eligibility import ANY_GPU
from orchestrator.policies import DEFAULT_POLICIES
from orchestrator.policies.in_queue_service import (
    IN_QUEUE_SERVICE,
    SERVICE_LEVELS_GPU_S,
    run_time_key,
    service_line_key,
    service_rule,
    stopped_first_key,
)
from orchestrator.policies.placement import GangRequest
from orchestrator.policies.victims import STOPS_MAX, Candidate, PreemptionAsk
from schemas.events import GangReserved, PreemptionRequested
from tests.core.harness import Sim, of_type

ON = replace(DEFAULT_POLICIES, service_preemption=1)
#: 8 GPUs reach the first level (4 GPU-hours) after 1,800 s.
PAST_LEVEL_1_S = SERVICE_LEVELS_GPU_S[0] / 8 + 60


def _ask(gpus: int = 8, *, queue: str = "a", priority: int = 0, attained: float = 0.0) -> PreemptionAsk:
    ranks, per = (gpus // 8, 8) if gpus >= 8 else (1, gpus)
    return PreemptionAsk(req=GangRequest(job_id="p", ranks=ranks, gpus_per_rank=per, cls=ANY_GPU), queue=queue,
                         priority=priority, owed=False, now=10_000.0, min_runtime_s=600.0, attained=attained)


def _cand(gpus: int = 8, *, queue: str = "a", priority: int = 0, attained: float = SERVICE_LEVELS_GPU_S[0],
          interruptions: int = 0, started_at: float = 0.0, preemptible: bool = True) -> Candidate:
    return Candidate(job_id="v", attempt=1 + interruptions, queue=queue, priority=priority, preemptible=preemptible,
                     started_at=started_at, gpus=gpus, placement=(), attained=attained, interruptions=interruptions)


def test_the_rule_stops_only_more_served_jobs_of_its_own_queue_within_the_caps() -> None:
    why = IN_QUEUE_SERVICE.reason
    assert why(_ask(), _cand(), {}) == "service"
    assert why(_ask(), _cand(queue="b"), {}) is None  # never another queue's job
    assert why(_ask(priority=0), _cand(priority=1), {}) is None  # never a more important one
    assert why(_ask(priority=1), _cand(priority=0), {}) == "service"
    assert why(_ask(), _cand(attained=SERVICE_LEVELS_GPU_S[0] - 1), {}) is None  # the same level (0)
    assert why(_ask(attained=SERVICE_LEVELS_GPU_S[0]), _cand(), {}) is None  # the same level (1)
    assert why(_ask(attained=SERVICE_LEVELS_GPU_S[0]), _cand(attained=SERVICE_LEVELS_GPU_S[1]), {}) == "service"
    assert why(_ask(), _cand(interruptions=STOPS_MAX - 1, started_at=0.0), {}) == "service"
    assert why(_ask(), _cand(interruptions=STOPS_MAX), {}) is None  # never past 3 stops
    assert why(_ask(), _cand(started_at=10_000.0 - 599), {}) is None  # protected: min_runtime_s
    assert why(_ask(), _cand(preemptible=False), {}) is None
    # A victim holds at most max(8, the preemptor's GPUs) GPUs.
    assert why(_ask(1), _cand(8), {}) == "service"
    assert why(_ask(1), _cand(9), {}) is None
    assert why(_ask(8), _cand(16), {}) is None
    assert why(_ask(16), _cand(16), {}) == "service"
    assert why(_ask(16), _cand(24), {}) is None
    # Never bigger than the fixed size when victims may not grow with the preemptor.
    assert service_rule(8, up_to_preemptor=False).reason(_ask(16), _cand(16), {}) is None
    assert service_rule(16, up_to_preemptor=False).reason(_ask(1), _cand(16), {}) == "service"
    assert service_rule(8, True) is IN_QUEUE_SERVICE  # one record per setting: the searches' memos key on it


def _long_then_short(s: Sim, *, long_queue: str = "a", long_priority: int = 0, long_gpus: int = 8,
                     short_gpus: int = 8) -> list:
    s.node("n0")
    if long_gpus > 8:
        s.node("n1")
    s.queue("a")
    s.queue("b")
    s.submit("long", queue=long_queue, gpus_per_rank=8, ranks=long_gpus // 8, priority=long_priority)
    s.run()
    s.tick(PAST_LEVEL_1_S * 8 / long_gpus)
    s.submit("short", queue="a", gpus_per_rank=short_gpus)
    return s.decide()


def test_a_new_job_stops_a_more_served_job_of_its_queue_and_starts_on_its_gpus() -> None:
    s = Sim(min_runtime_s=600.0, policies=ON)
    events = _long_then_short(s)
    (p,) = of_type(events, PreemptionRequested)
    assert p.job_id == "long" and p.preemptor_job_id == "short" and "less service" in p.reason
    s.exit("long", code=None, reason="preempted")
    s.decide()
    (g,) = of_type(s.decide(), GangReserved)
    assert g.job_id == "short"
    # "long" rejoined its line with its service (level 1): it does not stop "short" (level 0) back.
    s.start("short")
    s.tick(PAST_LEVEL_1_S / 2)
    assert not of_type(s.decide(), PreemptionRequested)


def test_off_by_default() -> None:
    s = Sim(min_runtime_s=600.0)
    assert not of_type(_long_then_short(s), PreemptionRequested)


def test_never_a_job_of_another_queue() -> None:
    s = Sim(min_runtime_s=600.0, policies=ON)
    assert not of_type(_long_then_short(s, long_queue="b"), PreemptionRequested)


def test_never_a_job_of_higher_priority() -> None:
    s = Sim(min_runtime_s=600.0, policies=ON)
    assert not of_type(_long_then_short(s, long_priority=1), PreemptionRequested)


def test_never_a_victim_bigger_than_eight_gpus_or_the_preemptor() -> None:
    s = Sim(min_runtime_s=600.0, policies=ON)
    assert not of_type(_long_then_short(s, long_gpus=16, short_gpus=8), PreemptionRequested)


def test_never_a_job_stopped_three_times() -> None:
    """Each stop lets a fresh short job stop "long" again, until it was stopped STOPS_MAX times."""
    s = Sim(min_runtime_s=600.0, policies=ON)
    s.node("n0")
    s.queue("a")
    s.submit("long", queue="a", gpus_per_rank=8)
    s.run()
    stops = 0
    for i in range(STOPS_MAX + 1):
        # Past the first level and past its protection (600 s doubled with each stop).
        s.tick(max(PAST_LEVEL_1_S, 600.0 * 2 ** stops + 60))
        s.submit(f"short{i}", queue="a", gpus_per_rank=8)
        found = [p.job_id for p in of_type(s.decide(), PreemptionRequested)]
        if i < STOPS_MAX:
            assert found == ["long"], i
            stops += 1
            s.exit("long", code=None, reason="preempted")
            s.decide()
            s.run()  # short{i} starts
            s.tick(60)
            s.finish(f"short{i}")
            s.run()  # long starts again
            assert s.job("long").status == "running"
        else:
            assert found == []
    assert stops == STOPS_MAX


def test_the_line_puts_less_served_jobs_first_within_a_priority() -> None:
    s = Sim()
    s.queue("a")
    s.submit("served", queue="a", gpus_per_rank=1, time_limit_s=60.0)
    s.submit("new", queue="a", gpus_per_rank=8, time_limit_s=36_000.0)
    s.submit("urgent", queue="a", gpus_per_rank=8, time_limit_s=36_000.0, priority=1)
    served = msgspec.structs.replace(s.job("served"), attained_s=SERVICE_LEVELS_GPU_S[0])
    jobs = [served, s.job("new"), s.job("urgent")]
    assert [j.job_id for j in sorted(jobs, key=service_line_key)] == ["urgent", "new", "served"]
    assert [j.job_id for j in sorted(jobs, key=lambda j: j.line_key)] == ["urgent", "served", "new"]
    stopped = msgspec.structs.replace(s.job("new"), job_id="stopped", attempt=2)  # preempted once
    assert [j.job_id for j in sorted([*jobs, stopped], key=stopped_first_key)] == ["urgent", "stopped", "served", "new"]
    # By run time: the 8-GPU job of 10 h (claim 80 GPU-h) goes before a 1-GPU job of 20 h (20 GPU-h).
    s.submit("long1", queue="a", gpus_per_rank=1, time_limit_s=72_000.0)
    by_gpu_hours = sorted([s.job("new"), s.job("long1")], key=lambda j: j.line_key)
    assert [j.job_id for j in by_gpu_hours] == ["long1", "new"]
    assert [j.job_id for j in sorted(by_gpu_hours, key=run_time_key)] == ["new", "long1"]


def test_the_line_orders_apply_through_policies() -> None:
    """line_order 3 (run time): a node of 8 GPUs frees; the 8-GPU job of 1 h starts before the 1-GPU job of 4 h."""
    for order, first in ((0, "small"), (3, "big")):
        s = Sim(policies=replace(DEFAULT_POLICIES, line_order=order))
        s.node("n0")
        s.queue("a")
        s.submit("blocker", queue="a", gpus_per_rank=8)
        s.run()
        s.submit("small", queue="a", gpus_per_rank=1, time_limit_s=4 * 3600.0)
        s.submit("big", queue="a", gpus_per_rank=8, time_limit_s=3600.0)
        s.decide()
        s.finish("blocker")
        started = [g.job_id for g in of_type(s.decide(), GangReserved)]
        assert started[:1] == [first], (order, started)


def test_alike_hopeless_searches_do_not_spend_the_budget_of_later_queues() -> None:
    """Queue a (ranked first: weight 4) has three alike 16-GPU heads whose service search is hopeless (its only
    more-served job holds 8 GPUs, the other node runs a job that is not preemptible); queue b's 8-GPU head can
    stop b's more-served job. With 2 searches a cycle, a's first head spends one; the alike heads after it
    are told from it, so b's head still gets the second (before, queues late in the order got none)."""
    s = Sim(min_runtime_s=600.0, policies=replace(ON, preemption_searches=2))
    for n in ("n0", "n1", "n2"):
        s.node(n)
    s.queue("a", weight=4.0)
    s.queue("b")
    s.submit("a-served", queue="a", gpus_per_rank=8)
    s.submit("a-pinned", queue="a", gpus_per_rank=8, preemptible=False)
    s.submit("b-served", queue="b", gpus_per_rank=8)
    s.run()
    s.tick(PAST_LEVEL_1_S)
    for i in range(3):
        s.submit(f"a-new{i}", queue="a", gpus_per_rank=8, ranks=2)
    s.submit("b-new", queue="b", gpus_per_rank=8)
    assert [(p.job_id, p.preemptor_job_id) for p in of_type(s.decide(), PreemptionRequested)] == [("b-served", "b-new")]
