"""The Docker runtime against a real engine and a FROM-scratch busybox image."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from nodeagent.runtime import WorkerExists, WorkerStartError
from nodeagent.runtime.docker import DockerRuntime, create_kwargs, exit_info_of
from schemas.jobspec import Mount
from tests.agent.runtime_helpers import spec, wait_for_log


def sh(script: str) -> list[str]:
    return ["sh", "-c", script]


# --- pure parts: no engine needed ----------------------------------------------------


def test_gpu_device_request_only_with_gpus(tmp_path: Path) -> None:
    s = spec(
        ["true"],
        image="img",
        gpus=(2, 5),
        checkpoint_dir=str(tmp_path / "ck"),
        mounts=(Mount(source="/data", target="/data"), Mount(source="/scratch", target="/s", read_only=False)),
    )
    kw = create_kwargs(s)
    (req,) = kw["device_requests"]
    assert req["Driver"] == "nvidia" and req["DeviceIDs"] == ["2", "5"] and req["Capabilities"] == [["gpu"]]
    assert kw["labels"] == {
        "corral.managed": "true",
        "corral.node": "n1",
        "corral.job": "j1",
        "corral.attempt": "1",
        "corral.rank": "0",
        "corral.restarts": "0",
    }
    mounts = {m["Target"]: m for m in kw["mounts"]}
    assert mounts["/data"]["ReadOnly"] is True and mounts["/s"]["ReadOnly"] is False
    assert mounts[str(tmp_path / "ck")]["ReadOnly"] is False
    assert "device_requests" not in create_kwargs(spec(["true"], image="img"))
    with pytest.raises(WorkerStartError, match="needs an image"):
        create_kwargs(spec(["true"]))


def test_exit_states() -> None:
    assert exit_info_of({"Status": "exited", "ExitCode": 0}).reason == "completed"
    assert exit_info_of({"Status": "exited", "ExitCode": 3}).exit_code == 3
    killed = exit_info_of({"Status": "exited", "ExitCode": 143})
    assert (killed.signal, killed.exit_code, killed.reason) == (15, 143, "killed")
    assert exit_info_of({"Status": "exited", "ExitCode": 137, "OOMKilled": True}).signal == 9
    assert exit_info_of({"Status": "created", "ExitCode": 0}).reason == "lost"


# --- against the engine ----------------------------------------------------------------


@pytest.fixture
def rt(docker_client: Any, busybox_image: str, docker_node: str) -> DockerRuntime:
    return DockerRuntime(docker_client, node_id=docker_node)


def bspec(command: list[str], node: str, **kw: Any):
    return spec(command, node=node, image="corral-test-busybox:latest", **kw)


@pytest.mark.docker
async def test_start_with_labels_env_and_mounts(
    rt: DockerRuntime, docker_client: Any, docker_node: str, tmp_path: Path
) -> None:
    data, ck = tmp_path / "data", tmp_path / "ck"
    data.mkdir()
    (data / "in.txt").write_text("input-data\n")
    script = (
        'cat /data/in.txt; echo "rank=$RANK job=$CORRAL_JOB_ID"; '
        "(touch /data/new 2>/dev/null && echo data-writable) || echo data-readonly; "
        'echo saved > "$CORRAL_CHECKPOINT_DIR/state"'
    )
    s = bspec(
        sh(script),
        docker_node,
        rank=3,
        env={"RANK": "3", "CORRAL_JOB_ID": "j1", "CORRAL_CHECKPOINT_DIR": str(ck)},
        mounts=(Mount(source=str(data), target="/data"),),
        checkpoint_dir=str(ck),
    )
    h = await rt.start(s)
    labels = docker_client.containers.get(h.worker_id).labels
    assert labels["corral.job"] == "j1" and labels["corral.rank"] == "3" and labels["corral.attempt"] == "1"
    assert labels["corral.node"] == docker_node and labels["corral.managed"] == "true"
    info = await asyncio.wait_for(rt.wait(h), 30)
    assert info.reason == "completed", info
    assert "input-data" in info.log_tail and "rank=3 job=j1" in info.log_tail and "data-readonly" in info.log_tail
    assert (ck / "state").read_text() == "saved\n"


@pytest.mark.docker
async def test_exit_code_and_log_tail(rt: DockerRuntime, docker_node: str) -> None:
    h = await rt.start(bspec(sh("echo one; echo two >&2; exit 3"), docker_node))
    info = await asyncio.wait_for(rt.wait(h), 30)
    assert (info.exit_code, info.signal, info.reason) == (3, None, "crashed")
    assert "one" in info.log_tail and "two" in info.log_tail
    assert (await rt.log_tail(h, 1)).strip() in ("one", "two")


@pytest.mark.docker
async def test_signal_reaches_the_worker(rt: DockerRuntime, docker_node: str) -> None:
    h = await rt.start(
        bspec(sh('trap "echo got-usr1; exit 7" USR1; echo ready; while :; do sleep 0.1; done'), docker_node)
    )
    await wait_for_log(rt, h, "ready", 30)
    await rt.signal(h, signal.SIGUSR1)
    info = await asyncio.wait_for(rt.wait(h), 30)
    assert info.exit_code == 7 and "got-usr1" in info.log_tail
    await rt.signal(h, signal.SIGUSR1)  # ended: no-op


@pytest.mark.docker
async def test_stop_with_grace(rt: DockerRuntime, docker_node: str) -> None:
    polite = await rt.start(bspec(sh("echo ready; sleep 30"), docker_node, rank=0))
    stubborn = await rt.start(bspec(sh('trap "" TERM; echo ready; while :; do sleep 0.1; done'), docker_node, rank=1))
    await wait_for_log(rt, polite, "ready", 30)
    await wait_for_log(rt, stubborn, "ready", 30)
    t0 = time.monotonic()
    assert (await rt.stop(polite, grace_s=10)).signal == signal.SIGTERM
    assert time.monotonic() - t0 < 5
    t0 = time.monotonic()
    assert (await rt.stop(stubborn, grace_s=0.5)).signal == signal.SIGKILL
    assert time.monotonic() - t0 >= 0.5


@pytest.mark.docker
async def test_adopt_after_a_new_runtime_object(docker_client: Any, busybox_image: str, docker_node: str) -> None:
    first = DockerRuntime(docker_client, node_id=docker_node)
    long = await first.start(bspec(sh("echo long; sleep 30"), docker_node, rank=0))
    short = await first.start(bspec(sh("echo short; exit 4"), docker_node, rank=1))
    await wait_for_log(first, short, "short", 30)
    del first  # the agent restarts

    other = DockerRuntime(docker_client, node_id="some-other-node")
    assert await other.adopt() == []
    rt = DockerRuntime(docker_client, node_id=docker_node)
    await asyncio.sleep(0.3)
    found = {f.handle.labels.rank: f for f in await rt.adopt()}
    assert sorted(found) == [0, 1]
    assert found[0].running and found[0].handle.worker_id == long.worker_id
    assert not found[1].running and found[1].exit is not None
    assert found[1].exit.exit_code == 4 and "short" in found[1].exit.log_tail
    with pytest.raises(WorkerExists):
        await rt.start(bspec(sh("echo dup"), docker_node, rank=0))
    with pytest.raises(WorkerExists):
        await rt.remove(found[0].handle)
    assert (await rt.stop(found[0].handle, 5)).signal == signal.SIGTERM
    await rt.remove(found[0].handle)
    await rt.remove(short)
    assert await rt.adopt() == []


@pytest.mark.docker
async def test_restart_generation_replaces_an_ended_container(rt: DockerRuntime, docker_node: str) -> None:
    h = await rt.start(bspec(sh("exit 1"), docker_node))
    await rt.wait(h)
    h2 = await rt.start(bspec(sh("exit 0"), docker_node))  # same labels, ended: replaced, not refused
    assert h2.worker_id != h.worker_id and (await rt.wait(h2)).reason == "completed"


@pytest.mark.docker
async def test_start_errors(rt: DockerRuntime, docker_node: str) -> None:
    with pytest.raises(WorkerStartError, match="never pulled"):
        await rt.start(spec(["true"], node=docker_node, image="corral-no-such-image:latest"))
    assert await rt.adopt() == []
    # docker-init (PID 1) starts fine and then cannot exec: the worker "crashes" with 127
    try:
        h = await rt.start(bspec(["/no/such/binary"], docker_node))
    except WorkerStartError:
        return
    info = await asyncio.wait_for(rt.wait(h), 30)
    assert (info.exit_code, info.reason) == (127, "crashed")
