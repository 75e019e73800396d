"""A simulated node's inventory, for `corral up` and tests on machines without GPUs.

UUIDs derive from the node id so a restarted simulated agent registers the
same GPUs again (the log keys reservations by node and index, and a changed
UUID would look like new hardware).
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Mapping
from typing import Literal

from schemas.inventory import LINK_PHB, Gpu, Inventory, link_score

_NAMESPACE = uuidlib.UUID("6f1c1d3e-7c0a-4b7e-9a53-2f4c6b0c9d11")

#: nvidia-smi's bond size on an HGX H100 (NVSwitch): what "all" pretends to be.
FAKE_NVLINK = "NV18"


def fake_gpu_uuid(node_id: str, index: int) -> str:
    """A stable, realistic-looking GPU UUID ("GPU-xxxxxxxx-...") for GPU `index` of `node_id`."""
    return f"GPU-{uuidlib.uuid5(_NAMESPACE, f'{node_id}/{index}')}"


def fake_inventory(
    count: int,
    *,
    node_id: str = "node-0",
    model: str = "H100",
    memory_mib: int = 81559,
    labels: Mapping[str, str] | None = None,
    nvlink: Literal["all", "none"] = "all",
) -> Inventory:
    """`count` identical GPUs; nvlink="all" links every pair NV18 (NVSwitch box), "none" is PCIe (PHB)."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if nvlink not in ("all", "none"):
        raise ValueError(f'nvlink must be "all" or "none", got {nvlink!r}')
    uuids = [fake_gpu_uuid(node_id, i) for i in range(count)]
    pair = link_score(FAKE_NVLINK) if nvlink == "all" else LINK_PHB
    gpus = tuple(
        Gpu(
            index=i,
            uuid=uuids[i],
            model=model,
            memory_mib=memory_mib,
            pci_bus_id=f"{i // 256:08X}:{i % 256:02X}:00.0",
            nvlink_peers=tuple(u for j, u in enumerate(uuids) if j != i) if nvlink == "all" else (),
        )
        for i in range(count)
    )
    links = tuple(tuple(0 if i == j else pair for j in range(count)) for i in range(count)) if count > 1 else ()
    return Inventory(gpus=gpus, links=links, labels=dict(labels or {}))
