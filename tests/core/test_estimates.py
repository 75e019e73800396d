"""Run times learned from the log (#20 point 5, acceptance 3): the fold's history, the estimate, backfill's use."""

from __future__ import annotations

from dataclasses import replace

from orchestrator.core.evolve import evolve
from orchestrator.core.model.estimates import (
    KEYS_KEPT,
    MIN_SAME_NAME,
    MIN_SAME_SIZE,
    SAMPLES_KEPT,
    expected_start,
    gpus_key,
    job_key,
    learned_estimate,
    line_place,
    queue_key,
    record,
    told_estimate,
    user_gpus_key,
)
from orchestrator.core.model.state import ClusterState, Job, Waiting, restore, snapshot
from orchestrator.policies import DEFAULT_POLICIES
from schemas.events import JobCompleted, JobSubmitted, JobWaiting
from schemas.jobspec import JobSpec
from tests.core.harness import Sim, of_type


def _submit(s: Sim, job_id: str, name: str, user: str = "alice", **spec: object) -> None:
    s.emit(JobSubmitted(event_id=s.eid(), occurred_at=s.now, job_id=job_id, submitted_by=user,
                        spec=JobSpec(name=name, **spec)))  # type: ignore[arg-type]


def _run(s: Sim, job_id: str, seconds: float) -> None:
    """Start `job_id` now (it must fit), let it run `seconds`, complete it."""
    s.run()
    assert s.job(job_id).status == "running"
    s.tick(seconds)
    s.finish(job_id)
    completed = of_type(s.decide(), JobCompleted)
    assert [e.job_id for e in completed] == [job_id]


def test_the_estimate_converges_to_the_run_time_of_a_queues_identical_jobs() -> None:
    """Every job of queue `q` is `train` by alice, 600 s: from the queue's fallback to the job's own key, to 600 s."""
    s = Sim()
    s.node("n0")
    s.queue("q")
    _submit(s, "warm", "prep", queue="q", gpus_per_rank=1)  # another name of the queue: 60 s
    _run(s, "warm", 60)
    seen = []
    for i in range(12):
        _submit(s, f"t{i}", "train", queue="q", gpus_per_rank=2)
        est = learned_estimate(s.state, s.job(f"t{i}"), "q")
        assert est is not None
        seen.append((est.source, est.samples, round(est.seconds)))
        _run(s, f"t{i}", 600)
    # No history of `train` yet: the queue's median (60 s); then its own runs, the median settling at 600.
    assert seen[0] == ("queue", 1, 60)
    assert seen[1] == ("job", 1, 600)
    assert seen[-1] == ("job", SAMPLES_KEPT, 600)
    assert [n for _, n, _ in seen[1:]] == [min(i, SAMPLES_KEPT) for i in range(1, 12)]  # bounded
    # Another user's job of the same name has no history of its own: its size's in the queue (train's 600 s).
    _submit(s, "other", "train", user="bob", queue="q", gpus_per_rank=2)
    est = learned_estimate(s.state, s.job("other"), "q")
    assert est is not None and (est.source, est.samples, est.seconds) == ("gpus", SAMPLES_KEPT, 600)
    # A size the queue never ran: the queue's.
    _submit(s, "wide", "train", user="bob", queue="q", gpus_per_rank=4)
    est = learned_estimate(s.state, s.job("wide"), "q")
    assert est is not None and (est.source, est.samples, est.seconds) == ("queue", SAMPLES_KEPT, 600)


def test_a_noisy_run_time_is_learned_as_the_median_of_recent_runs() -> None:
    s = Sim()
    s.node("n0")
    for i, seconds in enumerate([500, 700, 10_000, 600, 650]):  # one outlier
        _submit(s, f"j{i}", "eval", gpus_per_rank=1)
        _run(s, f"j{i}", seconds)
    _submit(s, "next", "eval", gpus_per_rank=1)
    est = learned_estimate(s.state, s.job("next"), "default")
    assert est is not None and (est.source, est.samples, est.seconds) == ("job", 5, 650)


def test_only_completed_runs_count_and_a_preempted_jobs_earlier_attempts_do() -> None:
    s = Sim()
    s.node("n0")
    _submit(s, "c", "x", gpus_per_rank=1)
    s.agents(s.decide())
    s.tick(100)
    s.cancel("c")
    s.run()
    s.finish("c")
    s.run()
    assert s.job("c").status == "cancelled"
    assert learned_estimate(s.state, s.job("c"), "default") is None
    # A run of 300 s in two attempts: 100 s, then (requeued) 200 s.
    durations: dict[str, tuple[float, ...]] = {}
    job = Job(job_id="p", spec=JobSpec(name="x", gpus_per_rank=4), submitted_at=0.0, queue="default", status="running",
              gpus=4, attained_s=4 * 100.0, reserved_at=1000.0, submitted_by="alice")
    record(durations, job, 1200.0)
    assert durations == {job_key("default", "alice", "x"): (300.0,), user_gpus_key("default", "alice", 4): (300.0,),
                         gpus_key("default", 4): (300.0,), queue_key("default"): (300.0,)}


def test_history_is_bounded_in_samples_and_keys_and_survives_snapshot_and_copy() -> None:
    state = ClusterState()
    for i in range(KEYS_KEPT + 50):
        job = Job(job_id=f"j{i}", spec=JobSpec(name=f"n{i}", gpus_per_rank=1), submitted_at=0.0, queue="q",
                  status="running", gpus=1, reserved_at=0.0, submitted_by="u")
        record(state.durations, job, float(i + 1))
    assert len(state.durations) == KEYS_KEPT
    assert len(state.durations[queue_key("q")]) == SAMPLES_KEPT  # updated by every run: never dropped
    assert job_key("q", "u", "n0") not in state.durations  # the least recently updated left first
    assert restore(snapshot(state)).durations == state.durations
    assert state.copy().durations == state.durations
    # The fold records a completion on a copy without touching the original.
    s = Sim()
    s.node("n0")
    _submit(s, "a", "x", gpus_per_rank=1)
    s.agents(s.decide())
    s.tick(50)
    s.finish("a")
    before = s.state.copy()
    done = s.decide()
    copy = before.copy()
    for e in done:
        evolve(copy, e)  # type: ignore[arg-type]
    assert before.durations == {} and copy.durations == s.state.durations != {}


def test_a_backfill_plan_without_time_limits_names_the_gangs_it_waits_for() -> None:
    """Gangs without time limits block a big gang: its reservation names them (`behind`), and its start is told
    from their learned run times as of the moment it is asked -- never a moment already past (#41)."""
    s = Sim(policies=replace(DEFAULT_POLICIES, reserve_after_s=0.0))  # (a young gang holds one too, as before #29)
    s.node("n0")
    for i in range(2):  # history: `w` ran 1,000 s twice
        _submit(s, f"h{i}", "w", gpus_per_rank=8)
        _run(s, f"h{i}", 1000)
    _submit(s, "w1", "w", gpus_per_rank=4)
    _submit(s, "w2", "w", gpus_per_rank=4)
    s.run()
    t0 = s.now
    s.tick(300)
    _submit(s, "big", "big", gpus_per_rank=8)
    waits = {e.job_id: e for e in of_type(s.decide(), JobWaiting)}
    assert waits["big"].code == "backfill_head"
    assert waits["big"].message == "a reservation for 8 GPUs: holding 0 free"
    assert waits["big"].behind == ("w1", "w2") and "t=" not in waits["big"].message
    start = expected_start(s.state, s.job("big"), s.now)
    assert start is not None and start.at == t0 + 1000
    assert start.why == ("when job w2 ends by its estimate, ~1000 s, median of 2 runs of name 'w' of alice in "
                         "queue default")
    # Overdue by the estimate: not known, never "now" told again every minute nor a moment already past.
    s.tick(2400)
    start = expected_start(s.state, s.job("big"), s.now)
    assert start is not None and start.at is None and "has outrun its estimate" in start.why


def test_a_queued_jobs_first_reason_tells_its_expected_run_time() -> None:
    s = Sim(policies=replace(DEFAULT_POLICIES, heads_per_queue=1))
    s.node("n0")
    for i in range(MIN_SAME_SIZE):
        _submit(s, f"h{i}", "w", gpus_per_rank=8)
        _run(s, f"h{i}", 1000)
    _submit(s, "w1", "w", gpus_per_rank=8)
    s.run()
    for jid in ("b1", "b2"):
        _submit(s, jid, "w", gpus_per_rank=8)
    _submit(s, "other", "x", gpus_per_rank=8)
    _submit(s, "stranger", "w", user="bob", gpus_per_rank=8)
    waits = {e.job_id: e for e in of_type(s.decide(), JobWaiting)}
    assert waits["b2"].code == "queued"
    assert waits["b2"].message == (
        "in queue default behind jobs that go first; expected to run ~1000 s, median of 3 runs of name 'w' of alice"
        " in queue default"
    )
    # No history under its name: its user's jobs of its size in its queue.
    assert waits["other"].message.endswith("expected to run ~1000 s, median of 3 runs of 8-GPU jobs of alice in "
                                           "queue default")
    # Another user's: nothing like it ran, so nothing is told (not alice's numbers).
    assert waits["stranger"].message == "in queue default behind jobs that go first"


def test_without_history_the_start_is_not_known() -> None:
    s = Sim(policies=replace(DEFAULT_POLICIES, reserve_after_s=0.0))  # (a young gang holds one too, as before #29)
    s.node("n0")
    _submit(s, "w1", "w", gpus_per_rank=8)
    s.agents(s.decide())
    s.tick(10)
    _submit(s, "big", "big", gpus_per_rank=8)
    waits = {e.job_id: e for e in of_type(s.decide(), JobWaiting)}
    assert waits["big"].message == "a reservation for 8 GPUs: holding 0 free" and waits["big"].behind == ("w1",)
    start = expected_start(s.state, s.job("big"), s.now)
    assert start is not None and start.at is None
    assert start.why == ("not known: job w1, whose GPUs it waits for, has neither a time limit nor a run-time "
                         "estimate (too few completed runs like it)")


def test_unrelated_tiny_jobs_teach_nothing_about_a_job() -> None:
    """#31/#41: six ~0 s runs of another name (or another user's) in the queue: a new job's run time is not known,
    so the job waiting behind it is told no start at all (not its own submit time)."""
    s = Sim()
    s.node("n0")
    for i in range(6):  # queue history: six runs of another name, ~0 s each
        _submit(s, f"quick{i}", "quick", user="bob", gpus_per_rank=8)
        _run(s, f"quick{i}", 0.2)
    _submit(s, "long", "long", gpus_per_rank=8)
    assert told_estimate(s.state, s.job("long"), "default") is None
    assert learned_estimate(s.state, s.job("long"), "default") is not None  # (ordering still reads it)
    s.run()
    assert s.job("long").status == "running"
    s.tick(30)
    _submit(s, "next", "next", gpus_per_rank=8)
    waits = {e.job_id: e for e in of_type(s.decide(), JobWaiting)}
    assert waits["next"].behind == ("long",)
    start = expected_start(s.state, s.job("next"), s.now)
    assert start is not None and start.at is None


def test_one_run_of_a_name_is_not_enough_and_two_are() -> None:
    state = ClusterState()
    job = Job(job_id="n", spec=JobSpec(name="x", gpus_per_rank=2), submitted_at=0.0, queue="q", submitted_by="al")
    done = Job(job_id="d", spec=JobSpec(name="x", gpus_per_rank=2), submitted_at=0.0, queue="q", status="running",
               gpus=2, reserved_at=0.0, submitted_by="al")
    record(state.durations, done, 100.0)
    assert told_estimate(state, job, "q") is None
    record(state.durations, done, 300.0)
    est = told_estimate(state, job, "q")
    assert est is not None and (est.source, est.samples, est.seconds) == ("job", MIN_SAME_NAME, 200.0)


def test_exactly_one_reservation_holder_of_a_queue_is_first_in_line() -> None:
    """#41: two holders of one queue's reservations (Policies.reservations = 2) both said "first in line". The
    place is told from the state as it is (`line_place`), not written into the log where it goes stale."""
    s = Sim(policies=replace(DEFAULT_POLICIES, reserve_after_s=0.0, reservations=3))
    for n in ("n0", "n1", "n2"):
        s.node(n)
    s.queue("default")
    s.queue("other")
    for jid in ("r0", "r1", "r2"):
        _submit(s, jid, "w", gpus_per_rank=8, time_limit_s=1000)
    s.run()
    for jid in ("big1", "big2"):
        _submit(s, jid, "big", gpus_per_rank=8)
        s.tick(1)
    _submit(s, "elsewhere", "big", gpus_per_rank=8, queue="other")
    s.decide()
    holders = [j for j in ("big1", "big2", "elsewhere") if (w := s.job(j).waiting) and w.code == "backfill_head"]
    assert holders == ["big1", "big2", "elsewhere"], holders
    places = {jid: line_place(s.state, s.job(jid)) for jid in ("big1", "big2")}
    assert places == {"big1": "first in line", "big2": "next in line after big1"}
    assert all("first in line" not in (s.job(j).waiting or Waiting(code="", message="")).message for j in holders)
    assert line_place(s.state, s.job("elsewhere")) == "first in line"  # another queue's line has its own first
    assert line_place(s.state, s.job("r0")) is None  # running: no place in line
    _one_first_per_queue(s)
    # Both are told when they start, by their time-limited reservations, as of now and never before it.
    for jid in ("big1", "big2"):
        start = expected_start(s.state, s.job(jid), s.now)
        assert start is not None and start.at is not None and start.at >= s.now
        assert "by its time limit" in start.why
    # One gang ends and a holder starts: the places are told afresh, with no event written for them.
    s.tick(1100)
    s.finish("r0")
    s.run()
    assert any(s.job(j).status != "pending" for j in holders)
    _one_first_per_queue(s)


def _one_first_per_queue(s: Sim) -> None:
    firsts: dict[str, list[str]] = {}
    for jid in s.state.holders:
        job = s.job(jid)
        place = line_place(s.state, job)
        if place is not None:
            queue = job.spec.queue
            firsts.setdefault(queue, [])
            if place == "first in line":
                firsts[queue].append(jid)
    assert all(len(v) == 1 for v in firsts.values()), firsts


def test_an_expected_start_is_never_a_moment_already_past() -> None:
    """#41: a reservation behind a gang past its time limit (being killed) starts now, not at the limit's moment;
    behind gangs that have all ended, and nothing told since, it is not known; a job holding none has none."""
    state = ClusterState()
    spec = JobSpec(name="w", gpus_per_rank=8, time_limit_s=100)
    state.jobs["late"] = Job(job_id="late", spec=spec, submitted_at=0.0, queue="default", status="running", gpus=8,
                             reserved_at=0.0, submitted_by="al")
    state.jobs["done"] = Job(job_id="done", spec=spec, submitted_at=0.0, queue="default", status="completed",
                             submitted_by="al")
    wait = Job(job_id="big", spec=JobSpec(name="big", gpus_per_rank=8), submitted_at=0.0,
               waiting=Waiting(code="backfill_head", message="a reservation for 8 GPUs: holding 0 free",
                               behind=("late",)))
    start = expected_start(state, wait, 5000.0)
    assert start is not None and start.at == 5000.0 and "job late, whose GPUs it waits for, is past its time limit" in start.why
    gone = replace_waiting(wait, ("done",))
    start = expected_start(state, gone, 5000.0)
    assert start is not None and start.at is None and "have ended" in start.why
    assert expected_start(state, state.jobs["late"], 5000.0) is None


def replace_waiting(job: Job, behind: tuple[str, ...]) -> Job:
    import msgspec

    assert job.waiting is not None
    return msgspec.structs.replace(job, waiting=msgspec.structs.replace(job.waiting, behind=behind))
