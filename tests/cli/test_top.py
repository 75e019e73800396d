"""`corral top`: the frame as a pure function of a hand-built state, `--once`, and live under a pty."""

from __future__ import annotations

import io
import os
import pty
import select
import struct
import subprocess
import sys
import time

from rich.console import Console

from events.bus import Envelope
from events.subjects import subject_for
from orchestrator.cli.top import frame, queue_bar
from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import ClusterState
from schemas import (
    Event,
    GangReserved,
    Gpu,
    Inventory,
    JobRunning,
    JobSubmitted,
    JobWaiting,
    NodeFailed,
    NodeRegistered,
    QueueDefined,
    RankPlacement,
    SchedulerElected,
    WorkerStarted,
    parse_jobspec,
)
from tests.cli.conftest import CORRAL, ROOT, Up, corral
from tests.terminal import kill_and_close, wait_exit

T0 = 1_700_000_000.0


def _node(node_id: str, gpus: int, leaf: str) -> NodeRegistered:
    inv = Inventory(gpus=tuple(Gpu(index=i, uuid=f"GPU-{node_id}-{i}", model="H100", memory_mib=81920)
                               for i in range(gpus)), labels={"leaf": leaf})
    return NodeRegistered(event_id=f"reg-{node_id}", occurred_at=T0, node_id=node_id, incarnation="i1",
                          address="10.0.0.1", inventory=inv)


def _submit(job_id: str, queue: str, gpus: int, priority: int = 0) -> JobSubmitted:
    spec = parse_jobspec({"name": job_id, "queue": queue, "gpus_per_rank": gpus, "priority": priority})
    return JobSubmitted(event_id=f"sub-{job_id}", occurred_at=T0 + 1, job_id=job_id, spec=spec)


def _reserve(job_id: str, node: str, gpus: tuple[int, ...]) -> GangReserved:
    return GangReserved(event_id=f"res-{job_id}", occurred_at=T0 + 2, job_id=job_id, attempt=1, epoch=1,
                        ranks=(RankPlacement(rank=0, node_id=node, gpus=gpus),), reason="best fit")


#: Three nodes (one failed), two queues, a running job, a reserved one, two pending (one explained).
EVENTS: list[Event] = [
    _node("n0", 4, "l0"),
    _node("n1", 4, "l1"),
    _node("n2", 2, "l1"),
    NodeFailed(event_id="fail-n2", occurred_at=T0, node_id="n2", incarnation="i1", reason="no heartbeat"),
    QueueDefined(event_id="q-prod", occurred_at=T0, queue="prod", weight=2.0, guaranteed_gpus=4, limit_gpus=6),
    QueueDefined(event_id="q-research", occurred_at=T0, queue="research"),
    SchedulerElected(event_id="elect", occurred_at=T0, epoch=1, scheduler_id="sched-a"),
    _submit("j-a", "research", 4),
    _submit("j-b", "research", 2),
    _submit("j-c", "prod", 2, priority=10),
    _submit("j-d", "prod", 8),
    _reserve("j-a", "n0", (0, 1, 2, 3)),
    WorkerStarted(event_id="ws-a", occurred_at=T0 + 3, job_id="j-a", attempt=1, rank=0, node_id="n0"),
    JobRunning(event_id="run-a", occurred_at=T0 + 3, job_id="j-a", attempt=1),
    JobWaiting(event_id="wait-b", occurred_at=T0 + 4, job_id="j-b", code="capacity", message="needs 2 GPUs, 0 free",
               epoch=1),
    _reserve("j-c", "n1", (0, 1)),
]


def known_state() -> tuple[ClusterState, list[Envelope]]:
    state = ClusterState()
    envs = []
    for i, e in enumerate(EVENTS, 1):
        evolve(state, e, i)
        envs.append(Envelope(i, subject_for(e), T0 + i, e))
    return state, envs


def render(width: int = 110) -> str:
    state, envs = known_state()
    out = io.StringIO()
    Console(file=out, width=width, color_system=None, force_terminal=False).print(frame(state, envs[-3:], T0 + 60))
    return out.getvalue()


def test_frame_of_a_known_state() -> None:
    text = render()
    lines = [ln.strip("│ ").rstrip() for ln in text.splitlines()]
    clock = time.strftime("%H:%M:%S", time.localtime(T0 + 60))
    assert lines[0] == f"corral top  #16  epoch 1 sched-a  {clock}"
    assert lines[1] == "GPUs 6/10 used   nodes 3   jobs: 1 running, 1 starting/stopping, 2 pending"
    # The GPU grid: a letter per job, free cells dotted, the failed node flagged.
    grid = lines[2:]
    assert "n0  ready   A A A A" in grid
    assert "n1  ready   B B · ·" in grid
    assert "n2  failed  · ·" in grid
    assert "A j-a 1x4 research running" in grid
    assert "B j-c 1x2 prod reserved" in grid
    # Queue bars: usage vs guarantee vs limit, weight and pending count.
    prod = next(ln for ln in lines if ln.startswith("prod "))
    assert prod.endswith("2 used / 4 guaranteed / 6 limit  w=2  pending 1")
    research = next(ln for ln in lines if ln.startswith("research "))
    assert research.endswith("4 used / 0 guaranteed / - limit  w=1  pending 1")
    # Pending jobs with the scheduler's reason, in line order.
    b = next(ln for ln in lines if ln.startswith("j-b "))
    assert b.split()[:4] == ["j-b", "research", "0", "1x2"] and b.endswith("capacity: needs 2 GPUs, 0 free")
    d = next(ln for ln in lines if ln.startswith("j-d "))
    assert d.endswith("not looked at yet")
    assert lines.index(b) < lines.index(d)
    # Recent events, newest last.
    assert "#16     GangReserved         j-c              attempt=1 epoch=1 n1[0-1] best fit" in text
    assert "#14" in text and "#13" not in text


def test_frame_is_deterministic_and_fits_narrow_terminals() -> None:
    assert render() == render()
    narrow = render(width=60)
    assert all(len(ln) <= 60 for ln in narrow.splitlines())
    assert "n1  ready   B B · ·" in narrow


def test_queue_bar() -> None:
    assert queue_bar(2, 4, 6, 10, width=10).plain == "██░░|░┆░░░"
    assert queue_bar(0, 0, None, 8, width=8).plain == "░" * 8
    assert queue_bar(8, 0, None, 8, width=8).plain == "█" * 8


def test_top_once_against_the_cluster(cluster: Up) -> None:
    out = corral("top", "--once", url=cluster.url).stdout
    assert "corral top" in out and "node-0" in out and "node-1" in out
    assert "queues" in out and "recent events" in out


def test_top_live_in_a_terminal_quits_on_ctrl_c(cluster: Up) -> None:
    pid, fd = pty.fork()
    if pid == 0:  # the child: `corral top` with the pty as its controlling terminal
        import fcntl
        import termios

        # Its size before top starts (top scrolls a frame taller than the terminal: a default 24 rows would hide
        # "recent events" on a cluster the other tests filled with queues).
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 120, 0, 0))
        os.chdir(ROOT)
        os.environ["CORRAL_NATS_URL"] = cluster.url
        os.execv(sys.executable, [*CORRAL, "top"])
    try:
        import fcntl
        import termios

        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 120, 0, 0))
        seen = b""
        deadline = time.monotonic() + 30
        # A whole frame: to its end, or to the status line of one taller than the terminal (top_scroll.py).
        while b"node-1" not in seen or (b"recent events" not in seen and b"q quit" not in seen):
            assert time.monotonic() < deadline, f"no frame from corral top: {seen[-2000:]!r}"
            if select.select([fd], [], [], 0.5)[0]:
                seen += os.read(fd, 65536)
        os.write(fd, b"\x03")  # Ctrl-C: the terminal sends SIGINT to top
        code, more = wait_exit(pid, fd, "corral top did not exit on Ctrl-C")
        seen += more
        assert code == 0
        assert b"Traceback" not in seen
    finally:
        kill_and_close(pid, fd)


def test_top_without_a_terminal_prints_one_frame_and_exits(cluster: Up) -> None:
    """#31: `corral top | less`, `corral top > frame.txt`: one frame (as --once), not a live view nobody sees."""
    env = {**os.environ, "CORRAL_NATS_URL": cluster.url, "CORRAL_LOG_LEVEL": "warning"}
    proc = subprocess.run([*CORRAL, "top"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "corral top" in proc.stdout and "node-1" in proc.stdout and "recent events" in proc.stdout
    assert proc.stdout.count("corral top") == 1 and "\x1b" not in proc.stdout
