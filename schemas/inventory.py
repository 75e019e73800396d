"""What a node has: its GPUs, how they are linked, and where it sits in the topology."""

from __future__ import annotations

from types import MappingProxyType

import msgspec

# Link classes between two GPUs of one node, best first. Values are comparable
# scores so placement can maximise the sum over pairs. NVLink scores grow with
# the number of links (NV12 beats NV2); PCIe paths follow nvidia-smi's legend.
LINK_SYS = 1  # crosses the SMP interconnect between NUMA nodes
LINK_NODE = 2  # crosses PCIe host bridges within one NUMA node
LINK_PHB = 3  # through a PCIe host bridge
LINK_PXB = 4  # through several PCIe bridges
LINK_PIX = 5  # through at most one PCIe bridge
LINK_NVLINK_BASE = 100  # NV<n> scores LINK_NVLINK_BASE + n

_PCIE = MappingProxyType({"SYS": LINK_SYS, "NODE": LINK_NODE, "PHB": LINK_PHB, "PXB": LINK_PXB, "PIX": LINK_PIX})


def link_score(token: str) -> int:
    """Score of an `nvidia-smi topo -m` cell ("NV12", "PIX", "SYS", ...); 0 if unknown."""
    token = token.strip().upper()
    if token.startswith("NV") and token[2:].isdigit():
        return LINK_NVLINK_BASE + int(token[2:])
    return _PCIE.get(token, 0)


class Gpu(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    index: int
    uuid: str
    model: str
    memory_mib: int
    pci_bus_id: str = ""
    mig_enabled: bool = False
    #: UUIDs of GPUs this one reaches over NVLink (empty: no NVLink or not reported).
    nvlink_peers: tuple[str, ...] = ()


class Inventory(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A node's GPUs plus topology.

    `links[i][j]` is the link score between GPU i and j (see `link_score`);
    empty means unknown, treated as uniform. `labels` name the node's domain at
    each topology level (e.g. {"block": "b1", "leaf": "l3", "clique": "c5"}).
    """

    gpus: tuple[Gpu, ...] = ()
    links: tuple[tuple[int, ...], ...] = ()
    labels: dict[str, str] = {}
    fabric_cluster_uuid: str | None = None
    fabric_clique_id: int | None = None

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)
