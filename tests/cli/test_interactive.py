"""Interactive jobs (issue #41) against a real `corral up` (the session's `cluster`), through the real CLI:

- `echo hi | corral run -- cat` prints `hi`: stdin goes to rank 0, its end too;
- a large input arrives whole, in order, through the bounded chunks; a rank 0 that stops reading early
  ends the job normally;
- `corral run --pty -- sh` under a real terminal (a pty this test drives): what is typed reaches the shell
  and comes back as its echo, the window size is passed on and updated on a resize, `exit 3` gives exit
  status 3, and the terminal is as it was;
- only the key's holder is heard: a request with another key is refused, and rank 0 reads nothing of it.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import pty
import select
import signal
import struct
import subprocess
import termios
import time
import uuid

from events.bus import Bus
from events.sdk import Client
from events.subjects import stdin_subject
from schemas.jobspec import Interactive, JobSpec
from schemas.stdin import StdinChunk, decode_stdin_ack, encode_stdin, key_hash
from tests.cli.conftest import CORRAL, ROOT, Up, _with_bus, corral, wait_state


def ids(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def run(args: list[str], url: str, stdin: bytes, timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "CORRAL_NATS_URL": url, "CORRAL_LOG_LEVEL": "warning"}
    return subprocess.run([*CORRAL, *args], input=stdin, env=env, cwd=ROOT, capture_output=True, timeout=timeout)


def test_stdin_goes_to_rank_0_with_its_end(cluster: Up) -> None:
    done = run(["run", "--id", ids("cat"), "--", "cat"], cluster.url, b"hi\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"hi\n", done.stdout  # one rank: its own lines, as srun (no --label)
    labelled = run(["run", "-l", "--id", ids("cat"), "--", "cat"], cluster.url, b"hi\n")
    assert labelled.stdout == b"0: hi\n", labelled.stdout  # srun --label's


def test_a_large_input_arrives_whole_and_a_reader_may_stop_early(cluster: Up) -> None:
    data = b"".join(b"line %06d\n" % i for i in range(40_000))  # 480 kB: many chunks, a full pipe on the way
    done = run(["run", "--id", ids("sum"), "--", "sh", "-c", "cksum"], cluster.url, data)
    assert done.returncode == 0, done.stderr
    expected = subprocess.run(["cksum"], input=data, capture_output=True, check=True).stdout
    assert done.stdout == expected, (done.stdout, expected)

    done = run(["run", "--id", ids("head"), "--", "head", "-n", "2"], cluster.url, data)
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"line 000000\nline 000001\n", done.stdout


def test_pty_echoes_what_is_typed_passes_the_window_size_and_returns_the_exit_status(cluster: Up) -> None:
    job = ids("sh")
    pid, master = pty.fork()
    if pid == 0:  # the child: `corral run --pty` on the terminal whose other end this test holds
        os.environ.update({"CORRAL_NATS_URL": cluster.url, "CORRAL_LOG_LEVEL": "warning"})
        os.chdir(ROOT)
        os.execv(CORRAL[0], [*CORRAL, "run", "--pty", "--id", job, "--", "sh"])
    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 101, 0, 0))
    before = termios.tcgetattr(master)[3]
    seen = _Screen(master)
    status = None
    try:
        seen.until(b"submitted")
        seen.until(b"# ", b"$ ")  # the shell's prompt, drawn on the job's terminal
        os.write(master, b"echo typed-$((40+2))\r")
        seen.until(b"typed-42")  # (the echo of the line as typed, then the shell's output)
        os.write(master, b"stty size\r")
        seen.until(b"33 101")
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 132, 0, 0))  # SIGWINCH to corral run
        os.kill(pid, signal.SIGWINCH)  # (also sent by the kernel to the terminal's foreground group)
        for _ in range(20):  # a key read before the signal is handled goes out under the old size: ask again
            os.write(master, b"stty size\r")
            if seen.until(b"50 132", timeout=1, must=False):
                break
        assert b"50 132" in seen.out, seen.text
        os.write(master, b"exit 3\r")
        seen.until(b"JobFailed")
        _, status = os.waitpid(pid, 0)
    finally:
        if status is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 3, seen.text
    assert b"typed-42" in seen.out and b"0: " not in seen.out  # rank 0's terminal, unlabelled
    after = termios.tcgetattr(master)[3]
    assert after & (termios.ICANON | termios.ECHO) == before & (termios.ICANON | termios.ECHO), "terminal not restored"
    os.close(master)


def test_only_the_keys_holder_is_heard(cluster: Up) -> None:
    job = ids("keyed")

    async def go(bus: Bus) -> list[str]:
        spec = JobSpec(name="keyed", command=("cat",), interactive=Interactive(key_sha256=key_hash("right")),
                       workdir=str(ROOT))
        await Client(bus).submit(spec, job_id=job)
        while (node := await _rank0_node(bus, job)) is None:
            await asyncio.sleep(0.1)
        answers = []
        for key, data in (("wrong", b"forged\n"), ("right", b"mine\n")):
            while True:  # (until its worker runs)
                chunk = StdinChunk(job_id=job, attempt=1, key=key, seq=1, data=data, eof=key == "right")
                ack = decode_stdin_ack((await bus.nc.request(stdin_subject(node, job), encode_stdin(chunk),
                                                             timeout=5)).data)
                if ack.error != "not_running":
                    answers.append(ack.error or f"taken {ack.taken}")
                    break
                await asyncio.sleep(0.1)
        return answers

    answers = asyncio.run(_with_bus(cluster.url, go))
    assert answers == [f"wrong key for job {job}'s input", "taken 5"], answers
    wait_state(cluster.url, lambda s: s.jobs[job].status == "completed", 60, "the keyed job")
    logs = corral("logs", job, url=cluster.url).stdout
    assert logs == "mine\n", logs


async def _rank0_node(bus: Bus, job: str) -> str | None:
    from orchestrator.cli.logs import job_placements

    _, placed = await job_placements(bus, job)
    ranks = placed.get(1, ())
    return next((p.node_id for p in ranks if p.rank == 0), None)


class _Screen:
    """What the terminal shows: everything read from the master side."""

    def __init__(self, master: int) -> None:
        self.master = master
        self.out = b""

    @property
    def text(self) -> str:
        return self.out.decode(errors="replace")

    def until(self, *tokens: bytes, timeout: float = 60, must: bool = True) -> bool:
        """Read until one of `tokens` shows; whether it did (`must`: fail the test if not)."""
        end = time.monotonic() + timeout
        while not any(t in self.out for t in tokens) and time.monotonic() < end:
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if ready:
                try:
                    self.out += os.read(self.master, 4096)
                except OSError:  # the child closed its end
                    break
        shown = any(t in self.out for t in tokens)
        assert shown or not must, f"no {tokens} on the terminal:\n{self.text}"
        return shown


def test_a_job_that_reads_nothing_ends_run_while_its_stdin_stays_open(cluster: Up) -> None:
    """A terminal nobody types into, or a pipe never closed: `corral run` still exits with its job, cleanly
    (the reader once held sys.stdin's lock and the interpreter's exit waited for the pipe, then aborted)."""
    env = {**os.environ, "CORRAL_NATS_URL": cluster.url, "CORRAL_LOG_LEVEL": "warning"}
    with subprocess.Popen([*CORRAL, "run", "-g", "0", "--id", ids("open"), "--", "echo", "done"], env=env, cwd=ROOT,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        try:
            proc.wait(timeout=120)  # its stdin open all along (communicate would close it)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        assert proc.stdout is not None and proc.stderr is not None
        out, err = proc.stdout.read(), proc.stderr.read()
    assert proc.returncode == 0 and out == b"done\n", (proc.returncode, out, err)
    assert b"Fatal Python error" not in err, err
