"""examples/worker.py under the process runtime: checkpoint on signal, manifests, resume."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

import pytest

from nodeagent.checkpoint import Manifest, newest_manifest, read_manifest, write_manifest
from nodeagent.rank_env import rank_env
from nodeagent.runtime.process import ProcessRuntime
from schemas.events import GangReserved, RankPlacement
from schemas.jobspec import JobSpec
from tests.agent.runtime_helpers import spec, wait_for_log

REPO = Path(__file__).resolve().parents[2]
WORKER = [sys.executable, str(REPO / "examples" / "worker.py")]


def _env(ckpt: Path, *, attempt: int = 1, resume: str | None = None, rank: int = 0) -> dict[str, str]:
    g = GangReserved(event_id="e", occurred_at=0, job_id="j1", attempt=attempt, epoch=1,
                     ranks=(RankPlacement(rank=0, node_id="n1", gpus=(0,)), RankPlacement(rank=1, node_id="n1", gpus=(1,))))  # fmt: skip
    return rank_env(g.ranks, rank, job_id=g.job_id, attempt=g.attempt, master_port=g.master_port,
                    spec=JobSpec(name="toy", ranks=2, checkpoint_dir=str(ckpt)),
                    node_addresses={"n1": "127.0.0.1"}, resume_from=resume)  # fmt: skip


def test_manifest_helpers(tmp_path: Path) -> None:
    assert newest_manifest(tmp_path / "missing") is None
    write_manifest(tmp_path, Manifest(step=5, path="/a", rank=0))
    write_manifest(tmp_path, Manifest(step=9, path="/b", rank=1))
    (tmp_path / "manifest-garbage.json").write_text("{not json")
    (tmp_path / "manifest-wrong.json").write_text(json.dumps({"step": "x"}))
    (tmp_path / ".manifest-rank0.json.tmp").write_text(json.dumps({"step": 99, "path": "/half"}))
    assert newest_manifest(tmp_path) == Manifest(step=9, path="/b", rank=1)
    assert newest_manifest(tmp_path, rank=0) == Manifest(step=5, path="/a", rank=0)
    assert read_manifest(tmp_path / "manifest-garbage.json") is None


def test_a_manifest_counts_only_for_the_attempt_that_wrote_it(tmp_path: Path) -> None:
    """An orphan of attempt 1 writing on (its agent died) is never taken for attempt 2's progress."""
    write_manifest(tmp_path, Manifest(step=900, path="/orphan", rank=0, attempt=1))
    write_manifest(tmp_path, Manifest(step=300, path="/mine", rank=1, attempt=2))
    write_manifest(tmp_path, Manifest(step=100, path="/unsaid", rank=2))  # an older worker: its directory decides
    assert newest_manifest(tmp_path, attempt=2) == Manifest(step=300, path="/mine", rank=1, attempt=2)
    assert newest_manifest(tmp_path, attempt=1) == Manifest(step=900, path="/orphan", rank=0, attempt=1)
    assert newest_manifest(tmp_path, attempt=3) == Manifest(step=100, path="/unsaid", rank=2)
    (tmp_path / "manifest-rank3.json").write_bytes(b'{"step": 5, "path": "' + bytes([0xFF]) + b'"}')
    assert read_manifest(tmp_path / "manifest-rank3.json") is None, "invalid UTF-8 is a bad manifest, not a crash"


async def test_checkpoint_on_signal_then_resume_gives_the_same_result(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    rt = ProcessRuntime(tmp_path / "state")
    total = 100_000
    h = await rt.start(spec([*WORKER, "--steps", str(total), "--step-ms", "1"], env=_env(ckpt)))
    await wait_for_log(rt, h, "training")
    tail = await rt.log_tail(h)
    assert "RANK=0 WORLD_SIZE=2 LOCAL_RANK=0" in tail and "CORRAL_JOB_ID=j1" in tail
    assert "starting fresh at step 0" in tail
    await asyncio.sleep(0.1)
    await rt.signal(h, signal.SIGUSR1)
    info = await asyncio.wait_for(rt.wait(h), 20)
    assert info.exit_code == 0, info.log_tail
    m = newest_manifest(ckpt)
    assert m is not None and 0 < m.step < total and m.rank == 0
    assert f"checkpoint step {m.step}" in info.log_tail and "exiting after checkpoint" in info.log_tail
    state = json.loads(Path(m.path).read_text())
    assert state["step"] == m.step and state["value"] == sum(range(m.step))

    # attempt 2 resumes from the manifest's path and finishes what is left
    finish = m.step + 30
    h2 = await rt.start(
        spec([*WORKER, "--steps", str(finish), "--step-ms", "0"], env=_env(ckpt, attempt=2, resume=m.path))
    )
    info2 = await asyncio.wait_for(rt.wait(h2), 20)
    assert info2.exit_code == 0
    assert f"resumed at step {m.step} from {m.path}" in info2.log_tail
    assert f"done at step {finish} value {sum(range(finish))}" in info2.log_tail


async def test_continue_mode_periodic_checkpoints_and_manifest_resume(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    rt = ProcessRuntime(tmp_path / "state")
    env = {**_env(ckpt, rank=1), "WORKER_ON_CHECKPOINT": "continue"}
    h = await rt.start(spec([*WORKER, "--steps", "60", "--step-ms", "0", "--checkpoint-every", "25"], env=env))
    info = await asyncio.wait_for(rt.wait(h), 20)
    assert info.exit_code == 0 and "done at step 60" in info.log_tail
    assert newest_manifest(ckpt) == Manifest(step=50, path=str(ckpt / "rank1-step00000050.state.json"), rank=1,
                                             attempt=1), "the manifest names the attempt that wrote it"
    # a manifest is also accepted as CORRAL_RESUME_FROM
    h2 = await rt.start(
        spec([*WORKER, "--steps", "70", "--step-ms", "0"], env=_env(ckpt, resume=str(ckpt / "manifest-rank1.json")))
    )
    info2 = await asyncio.wait_for(rt.wait(h2), 20)
    assert "resumed at step 50" in info2.log_tail and f"value {sum(range(70))}" in info2.log_tail


async def test_worker_failure_is_a_crash(tmp_path: Path) -> None:
    rt = ProcessRuntime(tmp_path / "state")
    h = await rt.start(
        spec([*WORKER, "--steps", "10", "--step-ms", "0", "--fail-at-step", "4"], env=_env(tmp_path / "c"))
    )
    info = await rt.wait(h)
    assert info.exit_code == 1 and info.reason == "crashed" and "failing on purpose at step 4" in info.log_tail


async def test_ddp_allreduce_over_gloo(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    g = GangReserved(event_id="e", occurred_at=0, job_id="ddp", attempt=1, epoch=1, master_port=port,
                     ranks=tuple(RankPlacement(rank=r, node_id=f"n{r}", gpus=()) for r in range(3)))  # fmt: skip
    rt = ProcessRuntime(tmp_path / "state")
    handles = []
    for r in range(3):
        env = rank_env(g.ranks, r, job_id=g.job_id, attempt=g.attempt, master_port=g.master_port,
                       spec=JobSpec(name="ddp", ranks=3, gpus_per_rank=0),
                       node_addresses={"n0": "127.0.0.1"})  # fmt: skip
        env |= {"GLOO_SOCKET_IFNAME": "lo", "DDP_OUT_DIR": str(tmp_path / "out"), "OMP_NUM_THREADS": "1"}
        s = spec([sys.executable, str(REPO / "examples" / "ddp_allreduce.py")], rank=r, job="ddp", env=env)
        handles.append(await rt.start(s))
    infos = [await asyncio.wait_for(rt.wait(h), 120) for h in handles]
    assert all(i.exit_code == 0 for i in infos), [i.log_tail for i in infos]
    results = [json.loads((tmp_path / "out" / f"result-rank{r}.json").read_text()) for r in range(3)]
    assert all(r["sum"] == 3.0 and r["world_size"] == 3 for r in results)


def test_two_writers_of_one_manifest_never_trip_over_each_other(tmp_path: Path) -> None:
    """An orphaned attempt (its agent was killed) and the requeued one may checkpoint into the same
    directory at once: each publishes through its own temp file, so neither's rename fails."""
    import subprocess

    script = (
        "import sys; from nodeagent.checkpoint import Manifest, write_manifest\n"
        "for step in range(300): write_manifest(sys.argv[1], Manifest(step=step, path=sys.argv[2]))\n"
    )
    root = Path(__file__).resolve().parents[2]
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path), who], cwd=root, stderr=subprocess.PIPE)
             for who in ("orphan", "requeued")]
    errors = [p.communicate(timeout=60)[1].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    m = read_manifest(tmp_path / "manifest-rank0.json")
    assert m is not None and m.step == 299
