"""GPU fabric facts (multi-node NVLink) and the rule that turns them into a node's clique.

A multi-node NVLink domain (e.g. GB200 NVL72) is visible only through NVML's
fabric info, never through `nvidia-smi topo -m`. One rule serves both sources
(NVML and the `Fabric` block of `nvidia-smi -q`), following NVIDIA's own
`IsFabricAttached()` and GPU Feature Discovery's `nvidia.com/gpu.clique`:

- a GPU is attached only if registration is COMPLETED with status Success and
  its cluster UUID is not all zeros (zero UUIDs compare equal across unrelated
  single-node HGX boxes, which would merge them into one fake domain);
- the node gets the label `<clusterUUID>.<cliqueId>` only if *every* GPU is
  attached and they all agree; otherwise no label (no multi-node level).

Our own addition: a fabric whose health summary is Unhealthy gives no label
either. NVIDIA's DRA driver falls back to non-MNNVL mode for it (issue #626 in
the fixtures); for a scheduler a clique label is a promise of full NVLink
bandwidth to every other node carrying it, and an unhealthy fabric breaks that
promise. "Limited capacity" keeps the label: it still works, just slower.
Clique ids change when partitions are reconfigured, so callers re-read fabric
info after GPU resets instead of caching it.
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum


class FabricState(IntEnum):
    """NVML's `nvmlGpuFabricState_t`."""

    NOT_SUPPORTED = 0
    NOT_STARTED = 1
    IN_PROGRESS = 2
    COMPLETED = 3


class FabricHealth(IntEnum):
    """NVML's `NVML_GPU_FABRIC_HEALTH_SUMMARY_*` (v3 fabric info and later)."""

    NOT_SUPPORTED = 0
    HEALTHY = 1
    UNHEALTHY = 2
    LIMITED_CAPACITY = 3


ZERO_UUID = "00000000-0000-0000-0000-000000000000"

#: The node label key for the multi-node NVLink level (see Inventory.labels).
CLIQUE_LABEL = "clique"


@dataclass(frozen=True, slots=True)
class FabricInfo:
    """One GPU's fabric registration, normalised from NVML or `nvidia-smi -q`."""

    state: FabricState = FabricState.NOT_SUPPORTED
    #: "Success" or the failure as NVML/nvidia-smi words it; meaningful only once COMPLETED.
    status: str = ""
    #: Canonical lower-case UUID; None when unknown or unreadable.
    cluster_uuid: str | None = None
    clique_id: int = 0
    health: FabricHealth = FabricHealth.NOT_SUPPORTED

    @property
    def attached(self) -> bool:
        """NVIDIA's IsFabricAttached(): registered, successful, non-zero cluster."""
        return (
            self.state == FabricState.COMPLETED
            and self.status.lower() == "success"
            and self.cluster_uuid is not None
            and self.cluster_uuid != ZERO_UUID
        )


@dataclass(frozen=True, slots=True)
class NodeClique:
    """What the fabric says about the node: its clique label, or why it has none."""

    label: str | None
    cluster_uuid: str | None
    clique_id: int | None
    reason: str


def canonical_uuid(raw: str | bytes | Sequence[int] | None) -> str | None:
    """A cluster UUID in canonical text form, from text, 16 raw bytes or a list of ints; None if unreadable."""
    if raw is None:
        return None
    try:
        if isinstance(raw, str):
            return str(uuidlib.UUID(raw.strip()))
        data = bytes(raw)
        if len(data) != 16:
            return None
        return str(uuidlib.UUID(bytes=data))
    except (ValueError, TypeError):
        return None


def node_clique(fabrics: Sequence[FabricInfo]) -> NodeClique:
    """The node's clique per the module rule: all GPUs attached, healthy enough, and agreeing."""
    if not fabrics:
        return NodeClique(None, None, None, "no GPUs")
    if any(f.state == FabricState.NOT_SUPPORTED for f in fabrics):
        return NodeClique(None, None, None, "fabric info not supported")
    not_attached = [i for i, f in enumerate(fabrics) if not f.attached]
    if not_attached:
        f = fabrics[not_attached[0]]
        if f.state != FabricState.COMPLETED:
            why = f"registration {f.state.name.lower()}"
        elif f.status.lower() != "success":
            why = f"registration failed: {f.status}"
        else:
            why = "not in a multi-node NVLink domain (zero cluster UUID)"
        return NodeClique(None, None, None, f"GPU {not_attached[0]}: {why}")
    ids = {(f.cluster_uuid, f.clique_id) for f in fabrics}
    if len(ids) > 1:
        return NodeClique(None, None, None, f"GPUs disagree on cluster/clique: {sorted(map(str, ids))}")
    unhealthy = [i for i, f in enumerate(fabrics) if f.health == FabricHealth.UNHEALTHY]
    if unhealthy:
        return NodeClique(None, None, None, f"GPU {unhealthy[0]}: fabric health Unhealthy")
    cluster, clique = ids.pop()
    return NodeClique(f"{cluster}.{clique}", cluster, clique, "attached")
