"""A user's first jobs (#31 points 1 and 2) against a real `corral up` (the session's `cluster`, 2 nodes x 4 GPUs):

- `corral run` submits from flags, prints every rank's output labelled `R: `, exits with the job's status;
  Ctrl-C cancels the job; `--detach` returns the id;
- a job runs in the directory it was submitted from (`--chdir` instead), with the variables `--export`
  names, and nothing of the agent's own environment; a workdir missing on the node fails it at once;
- `submit --follow` streams; `logs --all-ranks`; `logs -f` on a job still pending waits for it.

Commands that depend on their working directory or need a real Ctrl-C run as subprocesses (`CORRAL`); the
others in-process (`corral`).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import yaml

from tests.cli.conftest import CORRAL, Up, corral, state_of, wait_state

PY = sys.executable


def ids(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def sub(args: list[str], url: str, cwd: Path, env: dict[str, str] | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`corral ARGS` as a shell in `cwd` runs it."""
    full = {**os.environ, "CORRAL_NATS_URL": url, "CORRAL_LOG_LEVEL": "warning", **(env or {})}
    return subprocess.run([*CORRAL, *args], cwd=cwd, env=full, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)  # not the test runner's: `corral run` forwards its stdin


def test_run_prints_every_rank_labelled_and_exits_with_the_jobs_status(cluster: Up) -> None:
    code = ("import os, sys; r = os.environ['RANK']; print('hello from', r); print('bye from', r, end='');"
            "sys.exit(3 if r == '1' else 0)")
    job_id = ids("run-status")
    proc = corral("run", "-n", "2", "-g", "1", "--id", job_id, "--", PY, "-c", code, url=cluster.url, check=3)
    assert sorted(proc.stdout.splitlines()) == ["0: bye from 0", "0: hello from 0", "1: bye from 1",
                                                "1: hello from 1"], proc.stdout
    assert f"{job_id} submitted" in proc.stderr and "JobFailed" in proc.stderr, proc.stderr
    state = state_of(cluster.url)
    assert state.jobs[job_id].status == "failed" and state.jobs[job_id].spec.ranks == 2

    ok = corral("run", "-n", "2", "--name", "fine", "--", PY, "-c", "print('ok')", url=cluster.url, check=0)
    assert sorted(ok.stdout.splitlines()) == ["0: ok", "1: ok"]


def test_a_job_runs_where_it_was_submitted_with_what_was_exported_and_nothing_of_the_agent(
        cluster: Up, tmp_path: Path) -> None:
    proj, other = tmp_path / "proj", tmp_path / "other"
    proj.mkdir()
    other.mkdir()
    show = ("import os, sys; e = os.environ; print(os.getcwd(), e.get('MYVAR'), e.get('EXTRA'), e.get('PYTHONPATH'), "
            "e['PATH'].split(':')[0], e.get('PYTHONUNBUFFERED'), bool(e.get('HOME')))")
    env = {"MYVAR": "from-proj", "EXTRA": "not-exported"}
    run = sub(["run", "--export", "MYVAR", "--", "python3", "-c", show], cluster.url, proj, env)
    assert run.returncode == 0, run.stderr
    # `python3` is corral's own interpreter's (first on PATH), whatever PATH the agent was started with; the
    # agent's PYTHONPATH (this test run's) does not reach the worker.
    bindir = os.path.dirname(PY)
    assert run.stdout == f"{proj} from-proj None None {bindir} 1 True\n", run.stdout

    # The same worker as a spec file submitted from another directory, every variable exported.
    spec = tmp_path / "show.yaml"
    spec.write_text(yaml.safe_dump({"name": "show", "command": ["python3", "-c", show], "env": {"MYVAR": "spec"}}))
    done = sub(["submit", str(spec), "--export-all", "--follow"], cluster.url, other, {**env, "MYVAR": "shell"})
    assert done.returncode == 0, done.stderr
    # the spec's env: wins over the exported shell's; --export-all brings EXTRA and this run's PYTHONPATH (and PATH)
    (shown,) = [ln for ln in done.stdout.splitlines() if ln.startswith("0: ")]
    assert shown.split()[:5] == ["0:", str(other), "spec", "not-exported", str(os.environ.get("PYTHONPATH"))], shown

    # --chdir: another directory than the submitter's; --export VAR=VALUE sets one.
    there = sub(["run", "--chdir", "../proj", "--export", "MYVAR=set", "--", "python3", "-c", show], cluster.url,
                other)
    assert there.stdout.startswith(f"{proj} set None "), (there.stdout, there.stderr)


def test_a_workdir_missing_on_the_node_fails_the_job_at_once_with_the_reason(cluster: Up) -> None:
    job_id = ids("run-nodir")
    missing = f"/nonexistent/{job_id}"
    proc = corral("run", "--id", job_id, "--chdir", missing, "--restart-policy", "gang", "--max-restarts", "3",
                  "--", PY, "-c", "print('never')", url=cluster.url, check=1)
    assert proc.stdout == ""
    job = state_of(cluster.url).jobs[job_id]
    assert job.status == "failed" and job.attempt == 1, job  # not restarted: it would not start again
    assert f"workdir {missing} does not exist on node" in job.end_reason, job.end_reason
    assert f"workdir {missing} does not exist on node" in proc.stderr
    shown = corral("job", job_id, url=cluster.url).stdout
    assert re.search(rf"^workdir\s+{re.escape(missing)}$", shown, re.M), shown
    story = corral("explain", job_id, url=cluster.url).stdout
    assert "rank 0 could not start on " in story and f"workdir {missing} does not exist" in story, story


def test_export_refuses_what_it_cannot_pass(cluster: Up) -> None:
    for flags, words in ((["--export", "NOT_SET_ANYWHERE_31"], "not set in your environment"),
                         (["--export", "CORRAL_X=1"], "corral sets"),
                         (["--export", "RANK=3"], "corral sets"),
                         (["--export", "1BAD=x"], "not a variable name")):
        proc = corral("run", *flags, "--", "true", url=cluster.url, check=2)
        assert words in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert "no command" in corral("run", "-n", "2", url=cluster.url, check=2).stderr


def test_detach_then_logs_all_ranks(cluster: Up) -> None:
    job_id = ids("run-detach")
    code = "import os, time; time.sleep(0.5); print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])"
    proc = corral("run", "-d", "-n", "3", "-g", "0", "--id", job_id, "--", PY, "-c", code, url=cluster.url)
    assert proc.stdout == f"{job_id}\n"
    followed = corral("logs", job_id, "--all-ranks", "-f", url=cluster.url)
    assert sorted(followed.stdout.splitlines()) == [f"{r}: rank {r} of 3" for r in range(3)], followed.stdout
    wait_state(cluster.url, lambda s: s.jobs[job_id].status == "completed", 60, "the job to complete")
    after = corral("logs", job_id, "--all-ranks", url=cluster.url)
    assert after.stdout.splitlines() == [f"{r}: rank {r} of 3" for r in range(3)], after.stdout  # rank by rank


def test_logs_follow_on_a_pending_job_waits_for_it(cluster: Up) -> None:
    queue = ids("q-pend")
    corral("queue", "set", queue, "--limit", "1", url=cluster.url)
    blocker, waiter = ids("blocker"), ids("waiter")
    corral("run", "-d", "-q", queue, "--id", blocker, "--", PY, "-c", "import time; time.sleep(4)", url=cluster.url)
    wait_state(cluster.url, lambda s: s.jobs[blocker].status in ("reserved", "running"), 60, "the blocker to start")
    corral("run", "-d", "-q", queue, "--id", waiter, "--", PY, "-c", "print('waited my turn')", url=cluster.url)
    assert state_of(cluster.url).jobs[waiter].status == "pending"  # the queue's one GPU is the blocker's
    proc = corral("logs", waiter, "-f", url=cluster.url)
    assert proc.stdout == "waited my turn\n" and "waiting for it to start" in proc.stderr, (proc.stdout, proc.stderr)


def test_ctrl_c_cancels_the_job(cluster: Up, tmp_path: Path) -> None:
    job_id = ids("run-ctrlc")
    code = "import time; print('ready', flush=True); time.sleep(120)"
    env = {**os.environ, "CORRAL_NATS_URL": cluster.url, "CORRAL_LOG_LEVEL": "warning"}
    proc = subprocess.Popen([*CORRAL, "run", "--id", job_id, "--", PY, "-c", code], cwd=tmp_path, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, (out, err)
    assert f"cancelling {job_id}" in err and "JobCancelled" in err, err
    assert state_of(cluster.url).jobs[job_id].status == "cancelled"


def test_run_follows_the_job_into_its_next_attempt(cluster: Up) -> None:
    code = "import os, sys; a = os.environ['CORRAL_ATTEMPT']; print('attempt', a); sys.exit(1 if a == '1' else 0)"
    proc = corral("run", "--restart-policy", "gang", "--max-restarts", "1", "--", PY, "-c", code, url=cluster.url)
    assert proc.stdout.splitlines() == ["attempt 1", "attempt 2"], proc.stdout
    assert "GangRestarted" in proc.stderr and "JobCompleted" in proc.stderr, proc.stderr
