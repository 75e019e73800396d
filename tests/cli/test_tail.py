"""`corral tail`: each filter, start positions, --json, and following live."""

from __future__ import annotations

import datetime as dt
import json
import os
import queue
import signal
import subprocess
import threading
import time

from events.subjects import matches
from orchestrator.cli.tail import TailFilter, _overlap
from schemas import EVENT_TAGS, GangReserved, WorkerExited, WorkerStarted, entity_of
from tests.cli.conftest import CORRAL, ROOT, Preemption, Up, corral, job, log_of, state_of, submit, wait_state


def tail(url: str, *args: str) -> list[dict]:
    """`corral tail --no-follow --json ARGS` as parsed objects."""
    out = corral("tail", "--no-follow", "--json", *args, url=url).stdout
    return [json.loads(line) for line in out.splitlines()]


def test_job_filter(cluster: Up, preemption: Preemption) -> None:
    victim = preemption.victims[0]
    events = tail(cluster.url, "--job", victim)
    assert events and all(e["subject"].startswith(f"corral.job.{victim}.") for e in events)
    assert events[0]["type"] == "JobSubmitted" and events[-1]["type"] == "JobCompleted"
    assert events == sorted(events, key=lambda e: e["seq"])
    # The job's own events; the scheduler's orders to nodes about it (WorkAssigned/WorkChanged) are node events.
    expected = [env.seq for env in log_of(cluster.url) if entity_of(env.event) == ("job", victim)]
    assert [e["seq"] for e in events] == expected
    # Human lines: one per event, seq and type readable.
    lines = corral("tail", "--no-follow", "--job", victim, url=cluster.url).stdout.splitlines()
    assert len(lines) == len(events)
    assert f"#{events[0]['seq']}" in lines[0] and "JobSubmitted" in lines[0] and victim in lines[0]


def test_node_filter_includes_the_job_events_that_name_the_node(cluster: Up, preemption: Preemption) -> None:
    events = tail(cluster.url, "--node", "node-1")
    assert any(e["type"] == "NodeRegistered" and e["event"]["node_id"] == "node-1" for e in events)
    for e in events:
        ev = e["event"]
        if e["type"] == "GangReserved":
            assert "node-1" in {r["node_id"] for r in ev["ranks"]}
        else:
            assert ev["node_id"] == "node-1", e
    expected = [env.seq for env in log_of(cluster.url)
                if (isinstance(env.event, GangReserved) and "node-1" in {r.node_id for r in env.event.ranks})
                or (isinstance(env.event, (WorkerStarted, WorkerExited)) and env.event.node_id == "node-1")
                or env.subject.startswith("corral.node.node-1.")]
    assert [e["seq"] for e in events] == expected


def test_queue_filter_matches_jobs_by_their_queue(cluster: Up, preemption: Preemption) -> None:
    events = tail(cluster.url, "--queue", "prod")
    assert any(e["type"] == "QueueDefined" for e in events)
    jobs = {e["event"]["job_id"] for e in events if "job_id" in e["event"]}
    assert preemption.preemptor in jobs
    assert not jobs & set(preemption.victims)  # research jobs are not prod's
    assert all(e["event"].get("queue", "prod") == "prod" for e in events if e["type"] == "QueueDefined")


def test_type_filter_narrows_entities(cluster: Up, preemption: Preemption) -> None:
    events = tail(cluster.url, "--type", "Preempted,PreemptionRequested")
    assert {e["type"] for e in events} == {"Preempted", "PreemptionRequested"}
    assert {e["event"]["job_id"] for e in events} >= set(preemption.victims)
    only = tail(cluster.url, "--type", "JobRunning", "--queue", "prod", "--job", preemption.victims[0])
    assert {e["type"] for e in only} == {"JobRunning"}
    assert {e["event"]["job_id"] for e in only} >= {preemption.preemptor, preemption.victims[0]}


def test_from_seq_and_since(cluster: Up, preemption: Preemption) -> None:
    url = cluster.url
    everything = tail(url)
    assert [e["seq"] for e in everything] == list(range(1, everything[-1]["seq"] + 1))
    middle = everything[len(everything) // 2]
    assert tail(url, "--from-seq", str(middle["seq"]))[0]["seq"] == middle["seq"]
    # --since a duration ago covers the whole (young) log; --since the middle event's time starts there.
    assert tail(url, "--since", "1h")[0]["seq"] == 1
    when = dt.datetime.fromtimestamp(middle["time"]).isoformat()
    since = tail(url, "--since", when)
    assert since[0]["seq"] <= middle["seq"] and since[0]["time"] >= middle["time"] - 1e-3
    assert tail(url, "--since", "2099-01-01T00:00:00") == []
    assert tail(url, "--from-seq", "999999") == []


def test_follow_prints_live_events_and_stops_on_ctrl_c(cluster: Up) -> None:
    env = {**os.environ, "CORRAL_NATS_URL": cluster.url, "CORRAL_LOG_LEVEL": "info"}
    # From the next sequence, not "from now": a CLI that takes 2 s to start on a loaded machine
    # would otherwise miss the submit (tests/test_bus.py covers a tail from now).
    start = max((env_.seq for env_ in log_of(cluster.url)), default=0) + 1
    proc = subprocess.Popen([*CORRAL, "tail", "--job", "tail-live", "--from-seq", str(start)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stdout or ()], daemon=True).start()
    seen: list[str] = []
    try:
        submit(cluster.url, {"tail-live": job("live", steps=5)})
        deadline = time.monotonic() + 40
        while not any("JobCompleted" in ln for ln in seen):
            left = deadline - time.monotonic()
            try:
                seen.append(lines.get(timeout=max(0.1, left)))
            except queue.Empty:
                status = state_of(cluster.url).jobs["tail-live"].status
                raise AssertionError(f"tail printed {seen}; the job is {status}") from None
        assert "JobSubmitted" in seen[0] and all("tail-live" in ln for ln in seen)
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=15)
    assert proc.returncode == 130 and "Traceback" not in err, err


def test_filter_subjects_never_overlap_and_cover_what_is_wanted() -> None:
    """JetStream refuses overlapping filter subjects; the server-side filter must be a superset."""
    cases = [
        TailFilter(jobs=frozenset({"j1"}), nodes=frozenset({"n1"})),
        TailFilter(jobs=frozenset({"j1"}), queues=frozenset({"q"}), types=frozenset({"JobRunning"})),
        TailFilter(nodes=frozenset({"n1", "n2"}), types=frozenset({"WorkerStarted", "NodeFailed"})),
        TailFilter(queues=frozenset({"q"})),
        TailFilter(types=frozenset({"JobWaiting"})),
    ]
    for flt in cases:
        subjects = flt.subjects()
        for i, a in enumerate(subjects):
            for b in subjects[i + 1:]:
                assert not _overlap(a, b), (flt, a, b)
        for kind, ident in [("job", "j1"), ("job", "j2"), ("node", "n1"), ("queue", "q")]:
            for tag in EVENT_TAGS:
                subject = f"corral.{kind}.{ident}.{tag}"
                wanted_job = kind == "job" and ((flt.jobs and ident in flt.jobs) or flt.queues)
                if wanted_job and (not flt.types or tag in flt.types):
                    assert matches(subjects, subject), (flt, subject)


def test_tail_job_prints_its_history_then_follows(cluster: Up) -> None:
    """#31: like `kubectl logs -f`: a running job's events so far, then the ones that come."""
    url = cluster.url
    submit(url, {"tail-hist": job("hist", steps=300)})
    wait_state(url, lambda s: s.jobs["tail-hist"].status == "running", 40, "tail-hist to run")
    env = {**os.environ, "CORRAL_NATS_URL": url, "CORRAL_LOG_LEVEL": "warning"}
    proc = subprocess.Popen([*CORRAL, "tail", "--job", "tail-hist"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stdout or ()], daemon=True).start()
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 40
        while not any("JobCompleted" in ln for ln in seen):
            try:
                seen.append(lines.get(timeout=max(0.1, deadline - time.monotonic())))
            except queue.Empty:
                raise AssertionError(f"tail printed {seen}") from None
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=15)
    assert proc.returncode == 130 and "Traceback" not in err, err
    expected = [e.seq for e in log_of(url) if entity_of(e.event) == ("job", "tail-hist")]  # not its orders to nodes
    assert [int(ln.split()[1].lstrip("#")) for ln in seen] == expected[:len(seen)]
    assert "JobSubmitted" in seen[0] and "JobRunning" in "".join(seen)
