"""What a GPU worker container needs from its node: network, IPC, RDMA devices, GPUs.

Set per agent (`corral agent --docker-*`), with the shared-memory size also per
job (`JobSpec.shm_size_mb`). Everything here is pure: `host_options` maps a
worker and the agent's options to `containers.create` arguments, so every rule
is testable without an engine.

Network. Each rank is its own container, so ranks reach rank 0 only through
an address they all share. With "host" networking a container uses the node's
network namespace: rank 0 listens on MASTER_PORT of the node's address
(MASTER_ADDR), and NCCL sees the node's real NICs. "bridge" (Docker's default)
gives every container a private namespace: nothing outside it reaches rank 0,
so only a one-rank job can run there (MASTER_ADDR becomes 127.0.0.1, its own
loopback); a gang of more ranks is refused rather than left to hang in its
rendezvous. "auto" (the default): host for every gang of two or more ranks,
on one node or several; bridge for a one-rank job, which needs no rendezvous
peer and gains isolation.

IPC. NCCL moves data between ranks of one node through shared memory (its
SHM transport) and CUDA IPC handles: both need the containers in one IPC
namespace, so "host" is the default. "private" gives each container its own
/dev/shm of `shm_size_mb` (the job's, else the agent's): Docker's default of
64 MiB is too small for NCCL or a PyTorch DataLoader.

InfiniBand. RDMA needs the verbs devices (/dev/infiniband/uverbs*, rdma_cm)
and pinned memory: IPC_LOCK and an unlimited memlock ulimit. "auto" passes
them when /dev/infiniband exists on the node (in the agent's view: an agent in
a container needs the directory mounted), "on" requires it, "off" never.

GPUs. The placement's GPUs, through a device request the NVIDIA container
runtime answers (`--gpus "device=..."`): by UUID when the agent knows them
(`gpu_uuids`, from its inventory), else by NVML index. UUIDs name the same GPU
in every namespace; indices do not: an agent in a container that was given
GPUs 4-7 of its host sees them as 0-3, and the host's engine would hand a
worker asking for "0" the host's GPU 0. NVIDIA_VISIBLE_DEVICES says the same
UUIDs. Fake GPUs (simulation, CI) have nothing to request: `gpus=False`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from docker.types import DeviceRequest, Ulimit

from nodeagent.rank_env import in_private_network
from nodeagent.runtime.base import WorkerSpec, WorkerStartError

NetworkMode = Literal["auto", "host", "bridge"]
IpcMode = Literal["host", "private"]
InfinibandMode = Literal["auto", "on", "off"]

INFINIBAND_DIR = Path("/dev/infiniband")
#: /dev/shm per container with private IPC when neither the job nor the agent says (Docker's is 64 MiB).
DEFAULT_SHM_SIZE_MB = 8192


@dataclass(frozen=True, slots=True)
class DockerOptions:
    network: NetworkMode = "auto"
    ipc: IpcMode = "host"
    shm_size_mb: int = DEFAULT_SHM_SIZE_MB
    #: Character devices to pass through for RDMA (see `infiniband_devices`); none: no RDMA setup.
    infiniband_devices: tuple[str, ...] = ()
    #: memlock ulimit (bytes) of a container with RDMA devices; -1: unlimited. Raising it past
    #: dockerd's own hard limit needs CAP_SYS_RESOURCE, which a sandboxed engine may lack.
    memlock: int = -1
    #: Request the placement's GPUs from the NVIDIA runtime; False for fake GPUs.
    gpus: bool = True
    #: NVML index (as this agent sees it) -> GPU UUID; None: request by index.
    gpu_uuids: Mapping[int, str] | None = None


def infiniband_devices(mode: InfinibandMode, root: Path = INFINIBAND_DIR) -> tuple[str, ...]:
    """The RDMA devices under `root` to pass through ("auto": if any; "on": they must exist)."""
    if mode == "off":
        return ()
    found = tuple(sorted(str(p) for p in root.iterdir() if p.is_char_device())) if root.is_dir() else ()
    if mode == "on" and not found:
        raise ValueError(f"--docker-infiniband on, but there is no device under {root}")
    return found


def uses_host_network(options: DockerOptions, world_size: int) -> bool:
    """Whether a rank of a `world_size` gang gets the node's network namespace (see the module note)."""
    if options.network == "auto":
        return world_size > 1
    return options.network == "host"


def host_options(spec: WorkerSpec, options: DockerOptions) -> dict[str, Any]:
    """The `containers.create` arguments for network, IPC, RDMA and GPUs, and the env they imply."""
    host_net = uses_host_network(options, spec.world_size)
    if not host_net and spec.world_size > 1:
        raise WorkerStartError(
            f"rank {spec.rank} of {spec.job_id}: a gang of {spec.world_size} ranks cannot rendezvous in "
            f"private bridge networks; run the agent with --docker-network host or auto"
        )
    kwargs: dict[str, Any] = {
        "network_mode": "host" if host_net else "bridge",
        "environment": dict(spec.env) if host_net else in_private_network(spec.env),
    }
    if options.ipc == "host":
        kwargs["ipc_mode"] = "host"
    else:
        kwargs["ipc_mode"] = "private"
        kwargs["shm_size"] = f"{spec.shm_size_mb or options.shm_size_mb}m"
    if options.infiniband_devices:
        kwargs["devices"] = [f"{d}:{d}:rwm" for d in options.infiniband_devices]
        kwargs["cap_add"] = ["IPC_LOCK"]
        kwargs["ulimits"] = [Ulimit(name="memlock", soft=options.memlock, hard=options.memlock)]
    if options.gpus and spec.gpus:
        uuids = options.gpu_uuids or {}
        ids = [uuids.get(g, str(g)) for g in spec.gpus]
        kwargs["device_requests"] = [DeviceRequest(driver="nvidia", device_ids=ids, capabilities=[["gpu"]])]
        if uuids:
            kwargs["environment"]["NVIDIA_VISIBLE_DEVICES"] = ",".join(ids)
    return kwargs
