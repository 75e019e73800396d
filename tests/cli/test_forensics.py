"""replay --at and explain answer from the log alone, and agree with an in-process fold of it."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from orchestrator.cli.views import gpu_map
from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import FREE, ClusterState
from schemas import GangReserved, Preempted, PreemptionRequested
from tests.cli.conftest import Preemption, Up, corral, corral_json, log_of


def fold_to(url: str, seq: int) -> ClusterState:
    state = ClusterState()
    for env in log_of(url):
        if env.seq > seq:
            break
        evolve(state, env.event, env.seq)
    return state


def test_replay_at_a_past_seq_is_the_state_the_scheduler_had(cluster: Up, preemption: Preemption) -> None:
    url = cluster.url
    log = log_of(url)
    # The moment the first victim yielded: the preemptor still pending, GPUs earmarked for it.
    at = next(env for env in log if isinstance(env.event, Preempted) and env.event.job_id in preemption.victims)
    expected = fold_to(url, at.seq)
    view = corral_json("replay", "--at", str(at.seq), url=url)

    assert view["seq"] == at.seq == view["at"]["seq"]
    assert abs(view["at"]["time"] - at.stream_time) < 1e-3
    owners = {n["node_id"]: [o or FREE for o in n["owners"]] for n in view["nodes"]}
    assert owners == {nid: list(o) for nid, o in expected.owners.items()}
    usage = {q["queue"]: q["gpus"] for q in view["queues"]}
    assert usage == {q: u.gpus for q, u in expected.usage.items()} | {
        q: 0 for q in usage if q not in expected.usage}
    assert [p["job_id"] for p in view["pending"]] == list(expected.pending)
    for p in view["pending"]:
        w = expected.jobs[p["job_id"]].waiting
        assert (p["code"], p["message"]) == ((w.code, w.message) if w else (None, None))
    assert "pre-urgent" in expected.pending  # the preemptor was still waiting then
    assert view["jobs"]["preempting"] == sum(j.status == "preempting" for j in expected.jobs.values())

    # The same moment by time, and the human rendering of it.
    # (Events appended in one batch are microseconds apart: by time, the state includes all of
    # them up to that instant.)
    when = dt.datetime.fromtimestamp(at.stream_time + 1e-4).isoformat()
    by_time = max(env.seq for env in log if env.stream_time <= dt.datetime.fromisoformat(when).timestamp())
    assert by_time >= at.seq
    assert corral_json("replay", "--at", when, url=url)["seq"] == by_time
    text = corral("replay", "--at", f"#{at.seq}", "--no-snapshot", url=url).stdout
    assert text.startswith(f"cluster at #{at.seq} ")
    for nid, o in expected.owners.items():
        assert f"{nid}  " in text and gpu_map(o) in text
    assert "pre-urgent" in text and "PENDING" in text and "QUEUES" in text


def test_replay_at_the_end_matches_queues(cluster: Up, preemption: Preemption) -> None:
    view = corral_json("replay", url=cluster.url)
    queues = corral_json("queues", url=cluster.url)
    if view["seq"] == queues["seq"]:  # nothing appended in between
        assert view["queues"] == queues["queues"]


def test_explain_shows_the_preemption_chain(cluster: Up, preemption: Preemption) -> None:
    url = cluster.url
    victim = preemption.victims[0]
    story = corral_json("explain", victim, url=url)
    assert story["status"] == "completed" and story["attempt"] == 2
    types = [e["type"] for e in story["timeline"]]
    # submitted -> reserved -> running -> preemption requested -> (checkpoint) -> preempted -> reserved again
    # -> running again, resumed from the checkpoint -> completed
    order = ["JobSubmitted", "GangReserved", "JobRunning", "PreemptionRequested", "Preempted", "GangReserved",
             "JobRunning", "JobCompleted"]
    it = iter(types)
    assert all(t in it for t in order), types
    assert "Checkpointed" in types
    req = next(e for e in story["timeline"] if e["type"] == "PreemptionRequested")
    assert req["event"]["preemptor_job_id"] == preemption.preemptor
    assert "pre-urgent (urgent, queue prod, priority 100)" in req["text"]
    assert req["event"]["reason"] in req["text"] and req["event"]["reason"]
    ckpt = next(e for e in story["timeline"] if e["type"] == "Checkpointed")["event"]["path"]
    resumed = [e for e in story["timeline"] if e["type"] == "JobRunning"][-1]
    assert f"resumed from {ckpt}" in resumed["text"]
    assert not any(e["void"] for e in story["timeline"])

    text = corral("explain", victim, url=url).stdout
    assert text.splitlines()[0].startswith(f"{victim} (") and "preempted 1x" in text.splitlines()[0]
    assert f"preemption requested by {preemption.preemptor}" in text
    assert f"preempted: GPUs yielded to {preemption.preemptor}; requeued as attempt 2 (its place in line is now), resumes from {ckpt}" in text


def test_explain_the_preemptor_names_its_victims(cluster: Up, preemption: Preemption) -> None:
    story = corral_json("explain", preemption.preemptor, url=cluster.url)
    texts = [e["text"] for e in story["timeline"]]
    for victim in preemption.victims:
        assert any(t.startswith(f"preempting {victim} ") and "to make room" in t for t in texts), texts
        assert f"{victim} yielded its GPUs for this job" in texts
    waits = [e for e in story["timeline"] if e["type"] == "JobWaiting"]
    assert waits and any(e["event"]["code"] == "preempting" for e in waits)
    reserved = next(e for e in story["timeline"] if e["type"] == "GangReserved")
    assert reserved["text"].startswith("reserved attempt 1 on node-")
    assert story["timeline"][-1]["type"] == "JobCompleted"


def test_a_log_exported_with_tail_reads_like_the_stream(cluster: Up, preemption: Preemption, tmp_path: Path) -> None:
    """`corral tail --no-follow --json > FILE`, then `--log FILE`: the same answers away from the cluster.

    And the export is a what-if input: `corral sim --from-log` re-runs its jobs under another policy.
    """
    url = cluster.url
    export = tmp_path / "cluster.jsonl"
    export.write_text(corral("tail", "--no-follow", "--json", url=url).stdout)
    victim = preemption.victims[0]
    assert corral_json("explain", victim, "--log", str(export), url=url) == corral_json("explain", victim, url=url)
    at = next(env.seq for env in log_of(url) if isinstance(env.event, Preempted) and env.event.job_id == victim)
    from_file = corral_json("replay", "--at", str(at), "--log", str(export), url=url)
    assert from_file == corral_json("replay", "--at", str(at), url=url)
    rerun = corral("sim", "--from-log", str(export), "--policy", "fifo", "--out", str(tmp_path / "rerun"),
                   "--no-figures")
    assert f"{preemption.preemptor}" in (tmp_path / "rerun" / "events-fifo.jsonl").read_text()
    assert "fifo: " in rerun.stderr and "jobs completed" in rerun.stdout  # progress on stderr, the table on stdout


def test_explain_marks_void_decisions() -> None:
    """A reservation whose GPUs were taken at its log position is shown as void (pure, no cluster)."""
    from events.bus import Envelope
    from orchestrator.cli.timeline import job_timeline
    from tests.cli.test_top import EVENTS

    late = GangReserved(event_id="late", occurred_at=200.0, job_id="j-b", attempt=1, epoch=1,
                        ranks=EVENTS[-1].ranks if isinstance(EVENTS[-1], GangReserved) else ())
    envs = [Envelope(i + 1, "corral.x", 100.0 + i, e) for i, e in enumerate([*EVENTS, late])]
    entries = job_timeline(envs, "j-b")
    assert entries[-1].void and "VOID" in entries[-1].text
    assert not any(isinstance(e.event, PreemptionRequested) for e in entries)
