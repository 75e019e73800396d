"""The Docker runtime's cluster options: pure rules first, then what a real engine makes of them."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from nodeagent.runtime import WorkerStartError
from nodeagent.runtime.docker import DockerRuntime, create_kwargs, worker_mounts
from nodeagent.runtime.docker_options import DockerOptions, infiniband_devices
from schemas.jobspec import Mount, parse_jobspec
from tests.agent.runtime_helpers import spec

ENV = {"MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "29501", "RANK": "0"}


def rank(world_size: int, **kw: Any):  # type: ignore[no-untyped-def]
    return spec(["true"], image="img", world_size=world_size, **{"env": ENV, **kw})


# --- pure rules -----------------------------------------------------------------------


def test_auto_network_is_host_for_gangs_and_private_for_one_rank() -> None:
    gang = create_kwargs(rank(2))
    assert gang["network_mode"] == "host"
    assert gang["environment"]["MASTER_ADDR"] == "10.0.0.7", "rank 0 listens on its node's address"
    one = create_kwargs(rank(1))
    assert one["network_mode"] == "bridge"
    assert one["environment"]["MASTER_ADDR"] == "127.0.0.1", "alone in its namespace: rank 0 is itself"
    assert one["environment"]["MASTER_PORT"] == "29501"


def test_forced_modes() -> None:
    host = create_kwargs(rank(1), options=DockerOptions(network="host"))
    assert host["network_mode"] == "host" and host["environment"]["MASTER_ADDR"] == "10.0.0.7"
    with pytest.raises(WorkerStartError, match="cannot rendezvous"):
        create_kwargs(rank(4), options=DockerOptions(network="bridge"))
    assert create_kwargs(rank(1), options=DockerOptions(network="bridge"))["network_mode"] == "bridge"


def test_ipc_host_by_default_private_with_the_jobs_shm_size() -> None:
    kw = create_kwargs(rank(2))
    assert kw["ipc_mode"] == "host" and "shm_size" not in kw
    private = DockerOptions(ipc="private", shm_size_mb=2048)
    assert create_kwargs(rank(2), options=private)["shm_size"] == "2048m"
    assert create_kwargs(rank(2, shm_size_mb=300), options=private)["shm_size"] == "300m"


def test_infiniband_devices_bring_ipc_lock_and_memlock(tmp_path: Path) -> None:
    assert "devices" not in create_kwargs(rank(2)) and "cap_add" not in create_kwargs(rank(2))
    kw = create_kwargs(rank(2), options=DockerOptions(infiniband_devices=("/dev/infiniband/uverbs0",)))
    assert kw["devices"] == ["/dev/infiniband/uverbs0:/dev/infiniband/uverbs0:rwm"]
    assert kw["cap_add"] == ["IPC_LOCK"]
    (ulimit,) = kw["ulimits"]
    assert (ulimit["Name"], ulimit["Soft"], ulimit["Hard"]) == ("memlock", -1, -1)

    ib = tmp_path / "infiniband"
    assert infiniband_devices("auto", ib) == ()
    with pytest.raises(ValueError, match="no device"):
        infiniband_devices("on", ib)
    ib.mkdir()
    (ib / "uverbs0").symlink_to("/dev/null")  # a character device, as the real ones are
    (ib / "rdma_cm").symlink_to("/dev/zero")
    (ib / "README").write_text("not a device")
    assert infiniband_devices("auto", ib) == (str(ib / "rdma_cm"), str(ib / "uverbs0"))
    assert infiniband_devices("on", ib) == infiniband_devices("auto", ib)
    assert infiniband_devices("off", ib) == ()


def test_gpus_by_index_unless_fake() -> None:
    (req,) = create_kwargs(rank(2, gpus=(3, 6)))["device_requests"]
    assert req["DeviceIDs"] == ["3", "6"]
    assert "device_requests" not in create_kwargs(rank(2, gpus=(3, 6)), options=DockerOptions(gpus=False))


def test_gpus_by_uuid_when_known() -> None:
    """An agent whose container got host GPUs 4-7 sees them as 0-3: only the UUID names the right one."""
    options = DockerOptions(gpu_uuids={i: f"GPU-host-{i + 4}" for i in range(4)})
    kw = create_kwargs(rank(2, gpus=(0, 2), env={**ENV, "NVIDIA_VISIBLE_DEVICES": "0,2"}), options=options)
    (req,) = kw["device_requests"]
    assert req["DeviceIDs"] == ["GPU-host-4", "GPU-host-6"]
    assert kw["environment"]["NVIDIA_VISIBLE_DEVICES"] == "GPU-host-4,GPU-host-6"


def test_the_checkpoint_to_resume_from_is_mounted_read_only_at_its_host_path(tmp_path: Path) -> None:
    """Rank 1 of attempt 2 resumes from a file rank 0 of attempt 1 wrote: its directory is mounted too."""
    job = tmp_path / "ck" / "job"
    mine, theirs = job / "attempt-2" / "rank-1", job / "attempt-1" / "rank-0"
    env = {**ENV, "CORRAL_RESUME_FROM": str(theirs / "rank0-step7.state")}
    mounts = {m["Target"]: m for m in worker_mounts(spec(["true"], env=env, checkpoint_dir=str(mine)))}
    assert mounts[str(mine)]["ReadOnly"] is False and mounts[str(mine)]["Source"] == str(mine)
    assert mounts[str(theirs)]["ReadOnly"] is True and mounts[str(theirs)]["Source"] == str(theirs)
    # Already visible (its own directory, or under a same-path mount of the job): no second mount.
    env = {**ENV, "CORRAL_RESUME_FROM": str(mine / "rank1-step7.state")}
    assert [m["Target"] for m in worker_mounts(spec(["true"], env=env, checkpoint_dir=str(mine)))] == [str(mine)]
    shared = (Mount(source=str(job), target=str(job), read_only=False),)
    env = {**ENV, "CORRAL_RESUME_FROM": str(theirs / "x.state")}
    got = worker_mounts(spec(["true"], env=env, mounts=shared, checkpoint_dir=str(mine)))
    assert sorted(m["Target"] for m in got) == [str(job), str(mine)]


def test_job_shm_size_is_validated() -> None:
    assert parse_jobspec({"name": "a", "shm_size_mb": 512}).shm_size_mb == 512
    assert parse_jobspec({"name": "a"}).shm_size_mb is None
    for bad in (0, -1, "1g", 1 << 21):
        with pytest.raises(ValueError, match="shm_size_mb"):
            parse_jobspec({"name": "a", "shm_size_mb": bad})


# --- against the engine ----------------------------------------------------------------


async def _run(rt: DockerRuntime, s: Any) -> str:
    h = await rt.start(s)
    info = await asyncio.wait_for(rt.wait(h), 60)
    await rt.remove(h)
    assert info.reason == "completed", info
    return info.log_tail


def bspec(script: str, node: str, **kw: Any):  # type: ignore[no-untyped-def]
    return spec(["sh", "-c", script], node=node, image="corral-test-busybox:latest", env=ENV, **kw)


@pytest.mark.docker
async def test_engine_host_network_and_ipc_for_a_gang_private_for_one_rank(
    docker_client: Any, busybox_image: str, docker_node: str
) -> None:
    rt = DockerRuntime(docker_client, node_id=docker_node)
    script = "hostname; readlink /proc/self/ns/net; readlink /proc/self/ns/ipc; echo addr=$MASTER_ADDR"
    gang = (await _run(rt, bspec(script, docker_node, world_size=2, rank=1))).split()
    alone = (await _run(rt, bspec(script, docker_node, world_size=1))).split()
    assert gang[0] == socket.gethostname() and gang[3] == "addr=10.0.0.7"
    assert gang[1] == os.readlink("/proc/self/ns/net") and gang[2] == os.readlink("/proc/self/ns/ipc")
    assert alone[0] != socket.gethostname() and alone[3] == "addr=127.0.0.1"
    assert alone[1] != os.readlink("/proc/self/ns/net") and alone[2] == os.readlink("/proc/self/ns/ipc")


@pytest.mark.docker
async def test_engine_private_ipc_shm_size_and_rdma_devices(
    docker_client: Any, busybox_image: str, docker_node: str, tmp_path: Path
) -> None:
    (tmp_path / "uverbs0").symlink_to("/dev/null")
    # memlock: this engine's own hard limit (a sandboxed dockerd may not raise it to unlimited).
    hard = Path("/proc/self/limits").read_text().split("Max locked memory")[1].split()[1]
    memlock = 8 << 20 if hard == "unlimited" else min(int(hard), 8 << 20)
    options = DockerOptions(ipc="private", shm_size_mb=4096, infiniband_devices=(str(tmp_path / "uverbs0"),),
                            memlock=memlock)
    rt = DockerRuntime(docker_client, node_id=docker_node, options=options)
    out = await _run(rt, bspec(
        f"df -m /dev/shm | tail -1; ls -l {tmp_path}/uverbs0; grep CapEff /proc/self/status; ulimit -l; "
        "readlink /proc/self/ns/ipc", docker_node, world_size=2, shm_size_mb=96))
    lines = out.splitlines()
    assert lines[0].split()[1] == "96", out
    assert lines[1].startswith("c"), f"a character device: {out}"
    cap_ipc_lock = 14
    assert int(lines[2].split()[1], 16) & (1 << cap_ipc_lock), out
    assert int(lines[3]) == memlock // 1024
    assert lines[4] != os.readlink("/proc/self/ns/ipc")
