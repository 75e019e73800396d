"""A worker's descendant that left its process group (`setsid`) dies with the worker (issue #30 point 6).

Killing by process group missed it: a grandchild that called setsid survived preemption and
cancel, holding its GPUs. The worker here starts two such grandchildren: one whose parent (the
worker) lives on, and one orphaned at once (its parent subshell exits, so it would be re-parented
to init). Each scenario is run with the process tree as the only scope and, where this machine
has a writable cgroup v2, with a cgroup too. The checker reads /proc itself (no runtime code): a
grandchild is gone when its pid is absent or now names another process (other start ticks).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

import pytest

from nodeagent.runtime import WorkerHandle
from nodeagent.runtime.process import ProcessRuntime
from tests.agent.runtime_helpers import spec, wait_for_log

#: Two setsid grandchildren: `kept` (its parent, the worker, lives on) and `orphan` (started by a
#: helper that calls setsid() for it and exits, so the orphan's parent is gone at once).
ORPHAN = (f"{sys.executable} -c \"import subprocess; p = subprocess.Popen(['sleep', '1001'], "
          "start_new_session=True); open('orphan.pid', 'w').write(str(p.pid))\"")
WORKER = """
setsid sleep 1000 &
echo $! > kept.pid
""" + ORPHAN + """
trap 'echo checkpointing; exit 0' USR1
{term}
echo ready
sleep 1000 &
wait
{after}
"""


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, session id, start ticks) of a live or zombie process; None if the pid is free."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[3]), int(fields[19])


def _grandchildren(workdir: Path) -> dict[str, tuple[int, int, int]]:
    """name -> (pid, session, start ticks), read while the worker runs."""
    out = {}
    for name in ("kept", "orphan"):
        pid = int((workdir / f"{name}.pid").read_text())
        st = _stat(pid)
        assert st is not None and st[0] != "Z", f"the {name} grandchild is not running"
        out[name] = (pid, st[1], st[2])
    return out


def _survivors(seen: dict[str, tuple[int, int, int]]) -> list[str]:
    """The grandchildren still there (a zombie counts: it is not reaped, so someone lost track of it)."""
    alive = []
    for name, (pid, _, ticks) in seen.items():
        st = _stat(pid)
        if st is not None and st[2] == ticks:
            alive.append(f"{name} (pid {pid}, state {st[0]})")
    return alive


def _runtime(tmp_path: Path, cgroups: bool) -> ProcessRuntime:
    rt = ProcessRuntime(tmp_path / "state", node_id="n1", cgroups=cgroups)
    if cgroups and rt.cgroups is None:
        pytest.skip("no writable cgroup v2 on this machine: the process tree alone is tested")
    return rt


async def _start(rt: ProcessRuntime, tmp_path: Path, *, term: str = "",
                 after: str = "") -> tuple[WorkerHandle, dict[str, tuple[int, int, int]]]:
    workdir = tmp_path / "work"
    workdir.mkdir()
    h = await rt.start(spec(["sh", "-c", WORKER.format(term=term, after=after)], workdir=str(workdir)))
    await wait_for_log(rt, h, "ready")
    seen = _grandchildren(workdir)
    worker = json.loads((rt.state_dir / h.worker_id / "child.json").read_text())
    for name, (pid, session, _) in seen.items():
        assert session != worker["pid"] and session == pid, f"{name} did not leave the worker's session"
    return h, seen


SCOPES = pytest.mark.parametrize("cgroups", [False, True], ids=["process-tree", "cgroup"])


@SCOPES
async def test_cancel_kills_setsid_grandchildren(tmp_path: Path, cgroups: bool) -> None:
    """Cancel: SIGTERM to the group, the worker exits at once; its escaped grandchildren are gone."""
    rt = _runtime(tmp_path, cgroups)
    h, seen = await _start(rt, tmp_path, term="trap 'exit 143' TERM")
    info = await asyncio.wait_for(rt.stop(h, grace_s=5.0), 30)
    assert info.exit_code == 143
    assert not _survivors(seen), _survivors(seen)
    scope = json.loads((rt.state_dir / h.worker_id / "child.json").read_text())["kill_scope"]
    assert scope.startswith("cgroup " if cgroups else "process tree"), scope


@SCOPES
async def test_preemption_kills_setsid_grandchildren(tmp_path: Path, cgroups: bool) -> None:
    """Preemption: the checkpoint signal, the worker checkpoints and exits 0; nothing it started survives."""
    rt = _runtime(tmp_path, cgroups)
    h, seen = await _start(rt, tmp_path)
    await rt.signal(h, signal.SIGUSR1)
    info = await asyncio.wait_for(rt.wait(h), 30)  # the agent waits for the checkpoint, then stops
    await rt.stop(h, grace_s=1.0)
    assert info.exit_code == 0 and "checkpointing" in info.log_tail
    assert not _survivors(seen), _survivors(seen)


@SCOPES
async def test_kill_after_grace_reaches_setsid_grandchildren(tmp_path: Path, cgroups: bool) -> None:
    """A worker that ignores SIGTERM is SIGKILLed after its grace, and so is everything it started."""
    rt = _runtime(tmp_path, cgroups)
    h, seen = await _start(rt, tmp_path, term="trap '' TERM")
    info = await asyncio.wait_for(rt.stop(h, grace_s=0.5), 30)
    assert info.signal == signal.SIGKILL
    assert not _survivors(seen), _survivors(seen)


@SCOPES
async def test_a_worker_that_ends_takes_its_grandchildren_along(tmp_path: Path, cgroups: bool) -> None:
    """A worker that ends by itself leaves nothing behind either: its exit is recorded only after that."""
    rt = _runtime(tmp_path, cgroups)
    h, seen = await _start(rt, tmp_path, term="trap 'exit 3' TERM")
    await rt.signal(h, signal.SIGTERM)  # the worker's own group only: the grandchildren are outside it
    info = await asyncio.wait_for(rt.wait(h), 30)
    assert info.exit_code == 3
    assert not _survivors(seen), _survivors(seen)
    await rt.remove(h)
