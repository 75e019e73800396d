"""Which GPUs a job may use: its model and memory constraints.

A model constraint matches case-insensitively as a substring of the GPU's
reported name, so `gpu_model: H100` matches "NVIDIA H100 80GB HBM3".
A GPU's index everywhere in the core is its position in `Inventory.gpus`
(agents list GPUs in NVML index order).
"""

from __future__ import annotations

from schemas.inventory import Gpu

#: (model constraint lowercased or None, minimum memory MiB): jobs with equal
#: keys see the same GPUs, so capacity indexes are shared per key.
GpuClass = tuple[str | None, int]

ANY_GPU: GpuClass = (None, 0)


def gpu_class(model: str | None, min_memory_mib: int) -> GpuClass:
    return (model.lower() if model else None, max(0, min_memory_mib))


def gpu_matches(gpu: Gpu, model: str | None, min_memory_mib: int) -> bool:
    if gpu.memory_mib < min_memory_mib:
        return False
    return model is None or model.lower() in gpu.model.lower()


def eligible_gpus(gpus: tuple[Gpu, ...], cls: GpuClass) -> frozenset[int]:
    model, memory = cls
    return frozenset(i for i, g in enumerate(gpus) if gpu_matches(g, model, memory))
