"""Job arrays, dependencies, hold/release and cancel of many, through the CLI against a real `corral up`.

What ran when is checked from the log itself (its events, counted here), not from the fold's gating code.
"""

from __future__ import annotations

import getpass
import json
from pathlib import Path
from typing import Any

from schemas import GangReserved, JobCancelled, JobCompleted, JobFailed, JobSubmitted
from tests.cli.conftest import Up, corral, corral_json, job, log_of, statuses, wait_state

FINAL = ("completed", "failed", "cancelled", "rejected")


def _spec(tmp_path: Path, name: str, **extra: Any) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(job(name, **extra)))
    return str(path)


def _sh(tmp_path: Path, name: str, script: str, **extra: Any) -> str:
    """A spec running `sh -c script` (1 GPU, no restarts)."""
    return _spec(tmp_path, name, **{"command": ["sh", "-c", script], "restart_policy": "never", **extra})


def test_an_array_never_runs_more_than_its_limit(cluster: Up, tmp_path: Path) -> None:
    url = cluster.url
    out = tmp_path / "out"
    out.mkdir()
    spec = _sh(tmp_path, "arr", f"echo $CORRAL_ARRAY_INDEX $CORRAL_ARRAY_JOB_ID > {out}/$CORRAL_JOB_ID; sleep 0.7")
    sub = corral_json("submit", spec, "--array", "0-5%2", "--id", "arr-a", url=url)
    ids = [f"arr-a_{i}" for i in range(6)]
    assert sub == {"job_id": "arr-a", "jobs": ids}
    state = wait_state(url, lambda s: statuses(s, ids) == ["completed"] * 6, 90, "the array to finish")
    assert all(state.jobs[j].spec.gating.array is not None for j in ids)
    # Each element saw its own index.
    assert {j: (out / j).read_text().split() for j in ids} == {f"arr-a_{i}": [str(i), "arr-a"] for i in range(6)}
    # From the log: never more than 2 elements between their reservation and their end.
    holding: set[str] = set()
    most = 0
    for env in log_of(url):
        ev = env.event
        if isinstance(ev, GangReserved) and ev.job_id in ids:
            holding.add(ev.job_id)
            most = max(most, len(holding))
        elif isinstance(ev, (JobCompleted, JobFailed, JobCancelled)) and ev.job_id in ids:
            holding.discard(ev.job_id)
    assert most == 2, f"at most {most} elements held GPUs at once"
    # explain tells why an element beyond the limit waited, and when a slot came free.
    story = corral("explain", "arr-a_5", url=url).stdout
    assert "array=arr-a[5] of 0-5%2; gated: array 0-5%2: " in story, story
    assert "gates open (arr-a_" in story and "completed): in its queue's line" in story, story


def test_dependencies_on_a_failed_and_a_completed_job(cluster: Up, tmp_path: Path) -> None:
    url = cluster.url
    go = tmp_path / "go"  # dep-a fails only once the test has read dep-b's wait (no race with a loaded machine)
    corral("submit", _sh(tmp_path, "dep-a", f"while [ ! -e {go} ]; do sleep 0.1; done; exit 3"), "--id", "dep-a",
           url=url)
    corral("submit", _sh(tmp_path, "dep-b", "true"), "--id", "dep-b", "--after-ok", "dep-a", url=url)
    corral("submit", _sh(tmp_path, "dep-c", "true"), "--id", "dep-c", "--after-any", "dep-a", url=url)
    corral("submit", _sh(tmp_path, "dep-ok", "sleep 0.5"), "--id", "dep-ok", url=url)
    corral("submit", _sh(tmp_path, "dep-d", "true"), "--id", "dep-d", "--after-ok", "dep-ok,dep-c", url=url)
    story = corral("explain", "dep-b", url=url).stdout
    assert "after-ok=dep-a" in story and "waiting for dep-a to complete ok" in story
    go.touch()
    ids = ["dep-a", "dep-b", "dep-c", "dep-ok", "dep-d"]
    state = wait_state(url, lambda s: all(x in FINAL for x in statuses(s, ids)), 90, "the dependencies to settle")
    assert statuses(state, ids) == ["failed", "cancelled", "completed", "completed", "completed"]
    assert state.jobs["dep-b"].end_reason == "dependency never satisfied: job dep-a failed"
    story = corral("explain", "dep-b", url=url).stdout
    assert "cancelled: dependency never satisfied: job dep-a failed" in story
    # From the log: a job is reserved only after the jobs it depends on ended (as asked), never before.
    seq: dict[tuple[str, str], int] = {}
    for env in log_of(url):
        ev = env.event
        if isinstance(ev, (GangReserved, JobCompleted, JobFailed, JobCancelled)) and ev.job_id in ids:
            seq.setdefault((type(ev).__name__, ev.job_id), env.seq)
    assert ("GangReserved", "dep-b") not in seq
    assert seq[("GangReserved", "dep-c")] > seq[("JobFailed", "dep-a")]
    assert seq[("GangReserved", "dep-d")] > max(seq[("JobCompleted", "dep-ok")], seq[("JobCompleted", "dep-c")])
    # A dependency on a job the log does not know: refused at submit, saying what to fix; nothing written.
    proc = corral("submit", _sh(tmp_path, "dep-x", "true"), "--id", "dep-x", "--after-ok", "no-such-job", url=url,
                  check=2)
    assert "--after-ok no-such-job: no such job or job array in the log (submit it first" in proc.stderr
    assert not [e for e in log_of(url) if isinstance(e.event, JobSubmitted) and e.event.job_id == "dep-x"]


def test_a_dependency_on_an_array_is_one_and_explain_says_how_far_it_is(cluster: Up, tmp_path: Path) -> None:
    url = cluster.url
    corral("submit", _sh(tmp_path, "arr-d", "sleep 1"), "--id", "arr-d", "--array", "0-2", url=url)
    corral("submit", _sh(tmp_path, "arr-after", "true"), "--id", "arr-after", "--after-ok", "arr-d", url=url)
    (sub,) = [e.event for e in log_of(url) if isinstance(e.event, JobSubmitted) and e.event.job_id == "arr-after"]
    assert sub.spec.gating.after_ok_arrays == ("arr-d",) and not sub.spec.gating.after_ok  # one reference
    story = corral("explain", "arr-after", url=url).stdout
    assert "gated: waiting for array arr-d to complete ok: " in story and " of 3 tasks done" in story, story
    ids = ["arr-d_0", "arr-d_1", "arr-d_2", "arr-after"]
    wait_state(url, lambda s: statuses(s, ids) == ["completed"] * 4, 90, "the array and its dependent")
    seq: dict[str, int] = {}
    for env in log_of(url):
        if isinstance(env.event, (GangReserved, JobCompleted)) and env.event.job_id in ids:
            seq.setdefault(f"{type(env.event).__name__} {env.event.job_id}", env.seq)
    assert seq["GangReserved arr-after"] > max(seq[f"JobCompleted arr-d_{i}"] for i in range(3))


def test_hold_and_release(cluster: Up, tmp_path: Path) -> None:
    url = cluster.url
    corral("submit", _sh(tmp_path, "hold-l", "true"), "--id", "hold-l", "--hold", url=url)
    corral("submit", _sh(tmp_path, "hold-q", "true"), "--id", "hold-q", "--after-any", "hold-l", url=url)
    # A job submitted after them runs to the end while both stay pending: the scheduler saw them and passed.
    corral("submit", _sh(tmp_path, "hold-free", "true"), "--id", "hold-free", "--wait", "--timeout", "60", url=url)
    state = wait_state(url, lambda s: statuses(s, ["hold-free"]) == ["completed"], 30)
    assert statuses(state, ["hold-l", "hold-q"]) == ["pending", "pending"]
    assert "gated: held (`corral release hold-l` lets it start)" in corral("explain", "hold-l", url=url).stdout
    assert "gated: waiting for hold-l to end" in corral("explain", "hold-q", url=url).stdout
    assert corral_json("hold", "hold-q", "--reason", "not yet", url=url)[0]["result"] == "held"
    assert corral("hold", "hold-q", url=url).stdout.strip() == "hold-q: already held"
    corral("release", "hold-l", url=url)
    state = wait_state(url, lambda s: statuses(s, ["hold-l"]) == ["completed"], 60, "hold-l to run")
    # hold-q's dependency is met, but it is held itself.
    assert state.jobs["hold-q"].status == "pending" and state.jobs["hold-q"].held
    story = corral("explain", "hold-q", url=url).stdout
    assert "held by" in story and "not yet" in story and "gated: held" in story
    assert corral("jobs", url=url).stdout.count("gated: held") >= 1
    corral("release", "hold-q", url=url)
    wait_state(url, lambda s: statuses(s, ["hold-q"]) == ["completed"], 60, "hold-q to run")
    proc = corral("hold", "hold-q", url=url, check=1)
    assert "hold-q is completed: only a pending job can be held" in proc.stderr
    corral("hold", "no-such-job", url=url, check=4)


def test_cancel_many_by_id_and_by_filter(cluster: Up, tmp_path: Path) -> None:
    url = cluster.url
    me = getpass.getuser()
    for i in range(3):
        corral("submit", _sh(tmp_path, "batch-x", "true"), "--id", f"cx-{i}", "--hold", url=url)
    corral("submit", _sh(tmp_path, "other", "true", queue="research"), "--id", "cx-other", "--hold", url=url)
    corral("submit", _sh(tmp_path, "two", "true"), "--id", "cx-t1", "--hold", url=url)
    corral("submit", _sh(tmp_path, "two", "true"), "--id", "cx-t2", "--hold", url=url)
    corral("submit", _spec(tmp_path, "cx-arr", steps=5), "--id", "cx-arr", "--array", "0-2", "--hold", url=url)

    assert corral("cancel", url=url, check=2).stderr.startswith("corral: error: name the jobs to cancel")
    # Several ids; an array's id names its elements.
    proc = corral("cancel", "cx-t1", "cx-t2", "cx-arr", url=url)
    assert sorted(proc.stdout.split("\n")[:-1]) == sorted(
        f"cancel requested for {j}" for j in ("cx-t1", "cx-t2", "cx-arr_0", "cx-arr_1", "cx-arr_2"))
    # By name and state; by queue and user. The filters leave the rest alone.
    rows = corral_json("cancel", "--name", "batch-x", "--state", "pending", url=url)
    assert sorted(r["job_id"] for r in rows) == ["cx-0", "cx-1", "cx-2"]
    assert corral("cancel", "--queue", "research", "--by-user", "someone-else", url=url).stdout == "(no job matches)\n"
    rows = json.loads(corral("cancel", "cx-other", "cx-0", "cx-nope-not-named", "--queue", "research", "--by-user", me,
                             "--state", "pending", "--json", url=url, check=4).stdout)
    assert [r["job_id"] for r in rows] == ["cx-other"]
    ids = ["cx-0", "cx-1", "cx-2", "cx-other", "cx-t1", "cx-t2", "cx-arr_0", "cx-arr_1", "cx-arr_2"]
    wait_state(url, lambda s: statuses(s, ids) == ["cancelled"] * len(ids), 30, "every cancel to land")
    # An unknown id among known ones: the known ones are cancelled (already), exit 4 for the unknown.
    proc = corral("cancel", "cx-0", "cx-nope", url=url, check=4)
    assert "cx-0 is already cancelled" in proc.stdout and "unknown job 'cx-nope'" in proc.stderr
    # Every JobSubmitted of these carried its gates in the spec, and only these.
    subs = [e.event for e in log_of(url) if isinstance(e.event, JobSubmitted) and e.event.job_id in ids]
    assert len(subs) == len(ids) and all(e.spec.gating.hold for e in subs)
