"""A Slurm user's first week (#41), as a user runs it: the real CLI as a subprocess (or through its parser) against
the session's real `corral up` (2 nodes x 4 GPUs, process runtime).

- the whole environment is exported by default: a job started from a shell with a venv on PATH imports what only
  that venv has (`--export NONE` does not);
- `-t` takes Slurm's forms (60 is minutes), on `run` and `submit`;
- `submit` takes `run`'s job flags, and a flag overrides the spec file's field (as sbatch's flags override
  `#SBATCH` lines); `run` takes the dependency flags, and a dependency on a job the log lacks is refused (exit 2);
- `cancel --state pending,running` takes a list;
- `corral up` on a busy port says so in one line with a hint;
- `corral top` quits on q and scrolls, so every pending job is reachable on an 80x24 terminal.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import socket
import struct
import subprocess
import sys
import termios
import time
import uuid
from pathlib import Path

import yaml

from orchestrator.cli.errors import FAILURE, USAGE
from tests.cli.conftest import CORRAL, ROOT, Up, assert_one_line_error, corral, state_of, wait_state
from tests.terminal import kill_and_close, wait_exit

PY = sys.executable


def ids(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def shell(args: list[str], url: str, cwd: Path, env: dict[str, str],
          timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`corral ARGS` as a shell with exactly `env` (and the cluster's URL) runs it in `cwd`."""
    full = {**env, "CORRAL_NATS_URL": url, "CORRAL_LOG_LEVEL": "warning"}
    return subprocess.run([*CORRAL, *args], cwd=cwd, env=full, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)  # not the test runner's: `corral run` forwards its stdin


def test_a_job_from_a_shell_with_a_venv_on_path_imports_what_only_that_venv_has(cluster: Up, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([PY, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    (site,) = venv.glob("lib/python*/site-packages")
    (site / "only_in_this_venv.py").write_text("WHERE = 'the venv'\n")
    user_shell = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # `source venv/bin/activate`, as far as the environment goes (and corral itself from its own interpreter).
    user_shell.update(PATH=f"{venv / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}", VIRTUAL_ENV=str(venv),
                      PYTHONPATH=str(ROOT))
    code = "import only_in_this_venv, sys; print(only_in_this_venv.WHERE, sys.prefix)"
    run = shell(["run", "-g", "0", "--", "python3", "-c", code], cluster.url, tmp_path, user_shell)
    assert run.returncode == 0, (run.stdout, run.stderr)
    assert run.stdout == f"the venv {venv}\n", run.stdout

    # As sbatch: a spec file submitted from that shell, its command's python3 the venv's too.
    spec = tmp_path / "venv-job.yaml"
    spec.write_text(yaml.safe_dump({"name": "venv-job", "gpus_per_rank": 0, "command": ["python3", "-c", code]}))
    done = shell(["submit", str(spec), "--follow"], cluster.url, tmp_path, user_shell)
    assert done.returncode == 0 and f"0: the venv {venv}\n" in done.stdout, (done.stdout, done.stderr)

    # --export NONE: the node's environment only, corral's python3, which lacks the module.
    bare = shell(["run", "-g", "0", "--export", "NONE", "--", "python3", "-c", code], cluster.url, tmp_path,
                 user_shell)
    assert bare.returncode == 1 and "No module named 'only_in_this_venv'" in bare.stdout, (bare.stdout, bare.stderr)


def test_a_shell_path_without_corral_finds_corrals_python_after_its_own(cluster: Up, tmp_path: Path) -> None:
    """A pipx-style install: corral's venv nowhere on the user's PATH. The job's PATH is the shell's first (as
    Slurm's), then the node's entries it lacks: `python` (which /usr/bin may not have) is still found."""
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    show = "import os; print(os.environ['PATH'])"
    run = shell(["run", "-g", "0", "--", PY, "-c", show], cluster.url, tmp_path, env)
    assert run.returncode == 0, run.stderr
    path = run.stdout.strip().split(":")
    assert path[:2] == ["/usr/bin", "/bin"] and os.path.dirname(PY) in path[2:], path


def test_credentials_are_not_exported_by_default_and_the_submitter_is_told(cluster: Up, tmp_path: Path) -> None:
    env = {**os.environ, "HF_TOKEN": "hf_secret", "TOKENIZERS_PARALLELISM": "false"}
    show = "import os; print(os.environ.get('HF_TOKEN'), os.environ.get('TOKENIZERS_PARALLELISM'))"
    job_id = ids("creds")
    run = shell(["run", "-g", "0", "--id", job_id, "--", PY, "-c", show], cluster.url, tmp_path, env)
    assert run.stdout == "None false\n", (run.stdout, run.stderr)
    assert re.search(r"not exported, as they look like credentials.*\bHF_TOKEN\b", run.stderr), run.stderr
    assert "HF_TOKEN" not in state_of(cluster.url).jobs[job_id].spec.env  # nor in the log
    asked = shell(["run", "-g", "0", "--export", "ALL,HF_TOKEN", "--", PY, "-c", show], cluster.url, tmp_path, env)
    assert asked.stdout == "hf_secret false\n", (asked.stdout, asked.stderr)


def test_time_limits_in_slurms_forms_on_run_and_submit(cluster: Up, tmp_path: Path) -> None:
    limits = {"60": 3600.0, "1h": 3600.0, "90s": 90.0, "1:30": 90.0, "2:00:00": 7200.0, "1-12": 129600.0}
    for text, seconds in limits.items():
        job_id = ids("tl")
        corral("run", "-d", "-g", "0", "--hold", "--id", job_id, "-t", text, "--", "true", url=cluster.url)
        assert state_of(cluster.url).jobs[job_id].spec.time_limit_s == seconds, text
        corral("cancel", job_id, url=cluster.url)
    spec = tmp_path / "limited.yaml"
    spec.write_text(yaml.safe_dump({"name": "limited", "gpus_per_rank": 0, "command": ["true"], "time_limit_s": 30}))
    job_id = ids("tl-submit")
    corral("submit", str(spec), "--hold", "--id", job_id, "--time", "0-01:30", url=cluster.url)
    assert state_of(cluster.url).jobs[job_id].spec.time_limit_s == 5400.0
    corral("cancel", job_id, url=cluster.url)


def test_submit_flags_override_the_spec_files_fields(cluster: Up, tmp_path: Path) -> None:
    spec = tmp_path / "train.yaml"
    spec.write_text(yaml.safe_dump({"name": "from-file", "ranks": 1, "gpus_per_rank": 2, "priority": 5,
                                    "command": ["true"], "queue": "research", "max_restarts": 3}))
    plain, flagged = ids("file"), ids("flags")
    corral("submit", str(spec), "--hold", "--id", plain, url=cluster.url)
    corral("submit", str(spec), "--hold", "--id", flagged, "-n", "2", "-g", "0", "-J", "from-flags", "-p", "default",
           "--priority", "7", "--restart-policy", "rank", url=cluster.url)
    jobs = state_of(cluster.url).jobs
    a, b = jobs[plain].spec, jobs[flagged].spec
    assert (a.name, a.ranks, a.gpus_per_rank, a.queue, a.priority, a.restart_policy, a.max_restarts) == \
        ("from-file", 1, 2, "research", 5, "gang", 3)
    assert (b.name, b.ranks, b.gpus_per_rank, b.queue, b.priority, b.restart_policy, b.max_restarts) == \
        ("from-flags", 2, 0, "default", 7, "rank", 3)  # what no flag names stays the file's
    corral("cancel", plain, flagged, url=cluster.url)
    bad = corral("submit", str(spec), "-n", "0", url=cluster.url, check=USAGE)
    assert "with your flags has 1 problem(s)" in bad.stderr and "ranks" in bad.stderr, bad.stderr


def test_a_dependency_on_a_job_the_log_lacks_is_refused_at_submit(cluster: Up, tmp_path: Path) -> None:
    spec = tmp_path / "dep.yaml"
    spec.write_text(yaml.safe_dump({"name": "dep", "gpus_per_rank": 0, "command": ["true"]}))
    ghost = ids("ghost")
    before = len(state_of(cluster.url).jobs)
    for argv in (["submit", str(spec), "--after-ok", ghost], ["submit", str(spec), "--dependency", f"afterok:{ghost}"],
                 ["run", "-g", "0", "--after-any", ghost, "--", "true"],
                 ["run", "-g", "0", "--dependency", f"afterany:{ghost}", "--", "true"]):
        line = assert_one_line_error(corral(*argv, url=cluster.url, check=None), USAGE)
        assert f"{ghost}: no such job or job array in the log" in line, line
    assert len(state_of(cluster.url).jobs) == before  # nothing reached the log
    bad = assert_one_line_error(corral("run", "--dependency", "singleton", "--", "true", url=cluster.url,
                                       check=None), USAGE)
    assert "afterok:JOB" in bad, bad

    first = ids("first")
    corral("run", "-d", "-g", "0", "--id", first, "--", "true", url=cluster.url)
    after = ids("after")
    corral("run", "-g", "0", "--id", after, "--dependency", f"afterok:{first}", "--", "true", url=cluster.url)
    assert state_of(cluster.url).jobs[after].spec.gating.after_ok == (first,)


def test_cancel_state_takes_a_list(cluster: Up) -> None:
    queue = ids("q-cancel")
    corral("queue", "set", queue, "--limit", "1", url=cluster.url)
    running, pending, held = ids("running"), ids("pending"), ids("held")
    sleep = ["--", PY, "-c", "import time; time.sleep(120)"]
    corral("run", "-d", "-q", queue, "--id", running, *sleep, url=cluster.url)
    wait_state(cluster.url, lambda s: s.jobs[running].status == "running", 60, "the first job to run")
    corral("run", "-d", "-q", queue, "--id", pending, *sleep, url=cluster.url)
    corral("run", "-d", "-q", queue, "--id", held, "--hold", *sleep, url=cluster.url)
    done = corral("cancel", "--queue", queue, "--state", "pending,running", "--json", url=cluster.url)
    assert {r["job_id"] for r in json.loads(done.stdout)} == {running, pending, held}
    wait_state(cluster.url, lambda s: {s.jobs[j].status for j in (running, pending, held)} == {"cancelled"}, 60,
               "all three cancelled")
    for bad in ("completed", "pending,final", "nosuch"):
        line = assert_one_line_error(corral("cancel", "--state", bad, url=cluster.url, check=None), USAGE)
        assert "pending" in line, line
    # squeue's codes, as `jobs --state` reads them
    assert corral("cancel", "-t", "PD,R", "--queue", queue, url=cluster.url).stdout == "(no job matches)\n"


def test_up_on_a_busy_port_says_so_in_one_line(cluster: Up, tmp_path: Path) -> None:
    port = int(cluster.url.rsplit(":", 1)[1])  # the session's own `corral up` holds it
    env = {**os.environ, "CORRAL_LOG_LEVEL": "warning"}
    proc = subprocess.run([*CORRAL, "up", "--port", str(port), "--data-dir", str(tmp_path / "second")],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    line = assert_one_line_error(proc, FAILURE)
    assert f"port {port} on 127.0.0.1 is in use" in line and "--port 0" in line, line
    assert proc.stdout == ""  # no "NATS at" banner, nothing started
    with socket.socket() as other:  # not a corral: any program listening there
        other.bind(("127.0.0.1", 0))
        other.listen()
        taken = other.getsockname()[1]
        proc = subprocess.run([*CORRAL, "up", "--port", str(taken), "--data-dir", str(tmp_path / "third")],
                              capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert f"port {taken} on 127.0.0.1 is in use" in assert_one_line_error(proc, FAILURE)


def _screen(fd: int, until: bytes, seen: bytes, timeout: float = 30) -> bytes:
    """What the pty shows until `until` appears in it (everything read so far is returned)."""
    deadline = time.monotonic() + timeout
    while until not in seen:
        assert time.monotonic() < deadline, f"{until!r} never shown: {seen[-3000:]!r}"
        if select.select([fd], [], [], 0.2)[0]:
            try:
                seen += os.read(fd, 65536)
            except OSError:
                break
    return seen


def _redrawn(fd: int) -> bytes:
    """The next screen (with its status line), and what follows until the pty is quiet for half a second."""
    seen = _screen(fd, b"lines ", b"")
    while select.select([fd], [], [], 0.5)[0]:
        seen += os.read(fd, 65536)
    return seen


def _offset(seen: bytes) -> int:
    """The first line the status line of the newest screen says it shows."""
    return int(re.findall(rb"lines (\d+)-\d+ of \d+", seen)[-1])


def test_top_quits_on_q_and_scrolls_to_every_pending_job_at_80x24(cluster: Up) -> None:
    queue = ids("q-top")
    corral("queue", "set", queue, url=cluster.url)
    waiting = [f"{queue}-{i:02d}" for i in range(30)]
    for job_id in waiting:
        corral("run", "-d", "-g", "0", "-q", queue, "--hold", "--id", job_id, "--", "true", url=cluster.url)
    pid, fd = pty.fork()
    if pid == 0:  # the child: `corral top` with the pty as its terminal
        os.chdir(ROOT)
        os.environ["CORRAL_NATS_URL"] = cluster.url
        os.execv(sys.executable, [*CORRAL, "top", "--events", "0"])
    try:
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        seen = _screen(fd, b"lines 1-23 of ", b"")
        first = {j for j in waiting if j.encode() in seen}
        assert len(first) < len(waiting), "an 80x24 screen showed every pending job without scrolling"
        shown = set(first)
        os.write(fd, b"j")  # a line down, then another with the arrow key
        seen = _screen(fd, b"lines 2-24 of ", b"")
        os.write(fd, b"\x1b[B")
        seen = _screen(fd, b"lines 3-25 of ", b"")
        shown |= {j for j in waiting if j.encode() in seen}
        offset = 3
        for key in [b"\x1b[6~", b" "] * 20:  # page down (PgDn, space) until the end
            os.write(fd, key)
            seen = _redrawn(fd)
            shown |= {j for j in waiting if j.encode() in seen}
            if _offset(seen) == offset:
                break
            total = int(re.findall(rb"lines \d+-\d+ of (\d+)", seen)[-1])
            assert _offset(seen) == min(offset + 22, total - 22), seen[-500:]  # a page: the screen less 2 lines
            offset = _offset(seen)
        os.write(fd, b"g")
        _screen(fd, b"lines 1-23 of ", b"")
        os.write(fd, b"G")  # the end is where paging stopped
        assert _offset(_redrawn(fd)) == offset
        # and back: k a line, PgUp a page (the screen less its status line and one of overlap), g the top
        bottom = _offset(seen)
        for key, expected in ((b"k", bottom - 1), (b"\x1b[A", bottom - 2), (b"\x1b[5~", bottom - 2 - 22),
                              (b"b", bottom - 2 - 44), (b"g", 1)):
            os.write(fd, key)
            seen = _screen(fd, f"lines {expected}-".encode(), b"")
        missing = sorted(set(waiting) - shown)
        assert not missing, f"never on screen: {missing}"
        os.write(fd, b"q")
        code, more = wait_exit(pid, fd, "corral top did not quit on q")
        seen += more
        assert code == 0
        assert b"Traceback" not in seen
    finally:
        kill_and_close(pid, fd)
        corral("cancel", "--queue", queue, url=cluster.url, check=None)


def test_a_refused_submit_prints_its_one_error_line_even_with_credentials_in_the_environment(cluster: Up) -> None:
    """The credential notice is said once the job is in the log: a refused job's error stays one line."""
    ghost = ids("ghost")
    proc = corral("run", "-g", "0", "--after-ok", ghost, "--", "true", url=cluster.url, check=None,
                  env={"HF_TOKEN": "hf_x"})
    assert "no such job" in assert_one_line_error(proc, USAGE)
