"""The local-process runtime: env, signals, grace, exit codes, logs, and adopt after a restart."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from nodeagent.runtime import WorkerExists, WorkerHandle, WorkerStartError
from nodeagent.runtime.process import ProcessRuntime
from tests.agent.runtime_helpers import spec, wait_for_log

PY = sys.executable
REPO = Path(__file__).resolve().parents[2]


def sh(script: str) -> list[str]:
    return ["sh", "-c", script]


async def test_env_exit_code_and_log_tail(tmp_path: Path) -> None:
    rt = ProcessRuntime(tmp_path / "state", node_id="n1")
    h = await rt.start(
        spec(
            sh('echo "rank=$RANK job=$CORRAL_JOB_ID"; echo oops >&2; exit 3'), env={"RANK": "2", "CORRAL_JOB_ID": "j1"}
        )
    )
    info = await asyncio.wait_for(rt.wait(h), 10)
    assert (info.exit_code, info.signal, info.reason) == (3, None, "crashed")
    assert "rank=2 job=j1" in info.log_tail and "oops" in info.log_tail
    ok = await rt.start(spec(sh("echo fine"), rank=1))
    assert (await rt.wait(ok)).reason == "completed"


async def test_python_crash_keeps_traceback_in_tail(tmp_path: Path) -> None:
    rt = ProcessRuntime(tmp_path / "state")
    h = await rt.start(spec([PY, "-c", "raise SystemExit(print('about to fail') or 1/0)"]))
    info = await rt.wait(h)
    assert info.exit_code == 1 and info.reason == "crashed"
    assert "ZeroDivisionError" in info.log_tail
    assert (await rt.log_tail(h, 1)).strip().startswith("ZeroDivisionError")


async def test_signal_reaches_the_worker(tmp_path: Path) -> None:
    rt = ProcessRuntime(tmp_path / "state")
    code = "import signal,sys,time\nsignal.signal(signal.SIGUSR1, lambda *a: (print('got usr1', flush=True), sys.exit(7)))\nprint('ready', flush=True)\ntime.sleep(30)"
    h = await rt.start(spec([PY, "-c", code]))
    await wait_for_log(rt, h, "ready")
    await rt.signal(h, signal.SIGUSR1)
    info = await asyncio.wait_for(rt.wait(h), 10)
    assert info.exit_code == 7 and "got usr1" in info.log_tail
    await rt.signal(h, signal.SIGUSR1)  # ended: a no-op, not an error


async def test_stop_within_grace_and_kill_after_grace(tmp_path: Path) -> None:
    rt = ProcessRuntime(tmp_path / "state")
    polite = await rt.start(spec(sh("echo ready; sleep 30"), rank=0))
    stubborn = await rt.start(spec(sh('trap "" TERM; echo ready; while :; do sleep 0.05; done'), rank=1))
    await wait_for_log(rt, polite, "ready")
    await wait_for_log(rt, stubborn, "ready")
    t0 = time.monotonic()
    info = await rt.stop(polite, grace_s=5)
    assert info.signal == signal.SIGTERM and info.reason == "killed"
    assert time.monotonic() - t0 < 2
    t0 = time.monotonic()
    info = await rt.stop(stubborn, grace_s=0.3)
    assert info.signal == signal.SIGKILL
    assert 0.3 <= time.monotonic() - t0 < 3


async def test_group_signal_kills_grandchildren(tmp_path: Path) -> None:
    rt = ProcessRuntime(tmp_path / "state")
    h = await rt.start(spec(sh("sleep 30 & echo child=$!; wait")))
    tail = await wait_for_log(rt, h, "child=")
    grandchild = int(tail.split("child=")[1].split()[0])
    await rt.stop(h, grace_s=2)
    for _ in range(100):
        try:
            if Path(f"/proc/{grandchild}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break  # dead, waiting for init to reap it
        except FileNotFoundError:
            break
        await asyncio.sleep(0.02)
    else:
        pytest.fail("the worker's own child survived stop()")


async def test_duplicate_start_is_refused_and_missing_command_fails(tmp_path: Path) -> None:
    rt = ProcessRuntime(tmp_path / "state")
    h = await rt.start(spec(sh("sleep 30")))
    with pytest.raises(WorkerExists):
        await rt.start(spec(sh("sleep 30")))
    with pytest.raises(WorkerExists):
        await rt.remove(h)
    await rt.stop(h, 1)
    await rt.remove(h)
    assert await rt.adopt() == []
    with pytest.raises(WorkerStartError, match="no-such-binary"):
        await rt.start(spec(["/nonexistent/no-such-binary"], rank=5))
    assert await rt.adopt() == []


def _start_in_another_agent(state: Path, scripts: dict[int, str]) -> None:
    """Start workers from a separate Python process that then exits: a real agent restart."""
    code = textwrap.dedent(f"""
        import asyncio
        from nodeagent.runtime.process import ProcessRuntime
        from tests.agent.runtime_helpers import spec
        async def main():
            rt = ProcessRuntime({str(state)!r}, node_id="n1")
            for rank, script in {scripts!r}.items():
                await rt.start(spec(["sh", "-c", script], rank=rank))
        asyncio.run(main())
    """)
    subprocess.run([PY, "-c", code], check=True, cwd=REPO, timeout=30)


async def test_adopt_after_the_agent_restarted(tmp_path: Path) -> None:
    state = tmp_path / "state"
    _start_in_another_agent(state, {0: "echo long; sleep 30", 1: "echo short; sleep 0.2; exit 4"})
    other_node = ProcessRuntime(state, node_id="n2")
    rt = ProcessRuntime(state, node_id="n1")  # the new agent: no process objects, only the state dir
    await asyncio.sleep(0.6)  # the short worker ends while no agent watches it
    assert await other_node.adopt() == []
    found = {f.handle.labels.rank: f for f in await rt.adopt()}
    assert sorted(found) == [0, 1]
    assert found[0].running and found[0].exit is None
    assert not found[1].running and found[1].exit is not None
    assert (found[1].exit.exit_code, found[1].exit.reason) == (4, "crashed") and "short" in found[1].exit.log_tail
    # the adopted runner is fully controllable, and its end is still seen
    long = found[0].handle
    with pytest.raises(WorkerExists):
        await rt.start(spec(sh("echo dup"), rank=0))
    waiter = asyncio.create_task(rt.wait(long))
    info = await rt.stop(long, grace_s=2)
    assert info.signal == signal.SIGTERM and (await waiter).signal == signal.SIGTERM
    # handles rebuilt from the log (worker id + labels) work on yet another runtime object
    again = ProcessRuntime(state, node_id="n1")
    assert (await again.wait(WorkerHandle(found[1].handle.worker_id, found[1].handle.labels))).exit_code == 4


async def test_recycled_pid_is_not_mistaken_for_the_worker(tmp_path: Path) -> None:
    rt = ProcessRuntime(tmp_path / "state")
    h = await rt.start(spec(sh("exit 0")))
    await rt.wait(h)
    wdir = tmp_path / "state" / h.worker_id
    (wdir / "exit.json").unlink()  # as if the worker vanished without a record...
    # ...and its pid now belongs to this very test process, which started at another time
    (wdir / "child.json").write_text(json.dumps({"pid": os.getpid(), "start_ticks": 1}))
    (wdir / "meta.json").write_text(
        json.dumps({**json.loads((wdir / "meta.json").read_text()), "shim_pid": os.getpid()})
    )
    fresh = ProcessRuntime(tmp_path / "state")
    (found,) = await fresh.adopt()
    assert not found.running and found.exit is not None and found.exit.reason == "lost"
    await fresh.signal(found.handle, signal.SIGTERM)  # must not hit us
    assert (await fresh.wait(found.handle)).reason == "lost"


async def test_log_dir_and_workdir(tmp_path: Path) -> None:
    rt = ProcessRuntime(tmp_path / "state")
    (tmp_path / "work").mkdir()
    h = await rt.start(
        spec(
            sh("pwd"),
            workdir=str(tmp_path / "work"),
            log_dir=str(tmp_path / "logs"),
            checkpoint_dir=str(tmp_path / "ck"),
        )
    )
    info = await rt.wait(h)
    assert str(tmp_path / "work") in info.log_tail
    assert (tmp_path / "logs" / f"{h.worker_id}.log").exists() and (tmp_path / "ck").is_dir()
    await rt.remove(h)
    assert not (tmp_path / "state" / h.worker_id).exists()
    assert (tmp_path / "logs" / f"{h.worker_id}.log").exists(), "a log in log_dir outlives the worker"

