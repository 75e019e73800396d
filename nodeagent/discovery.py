"""GPU discovery: NVML facts per GPU -> an `Inventory` for NodeRegistered.

The logic reads through a small `NvmlSource` protocol so it runs without a GPU:
`PynvmlSource` talks to the driver, `FixtureSource` replays a recorded JSON
dump (shared/fixtures/nvml/). Every per-field NVML error is recorded in
`Discovery.problems` and replaced by a default: one unsupported query (NUMA,
NVLink on a PCIe card, fabric on an old driver) must never hide a GPU.

NVLink peers come from each active link's remote PCI bus id. A remote that is
not one of this node's GPUs is an NVSwitch (HGX, GB200 tray): every GPU with
switch links reaches every other such GPU, as `nvidia-smi topo -m` shows NV18.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from nodeagent.fabric import CLIQUE_LABEL, FabricHealth, FabricInfo, FabricState, canonical_uuid, node_clique
from nodeagent.fake_gpus import fake_inventory
from schemas.inventory import (
    LINK_NODE,
    LINK_NVLINK_BASE,
    LINK_PHB,
    LINK_PIX,
    LINK_PXB,
    LINK_SYS,
    Gpu,
    Inventory,
)

T = TypeVar("T")

#: nvmlDeviceGetTopologyCommonAncestor levels -> link scores (NVML_TOPOLOGY_*).
_ANCESTOR_SCORE = {0: LINK_PIX, 10: LINK_PIX, 20: LINK_PXB, 30: LINK_PHB, 40: LINK_NODE, 50: LINK_SYS}

#: Links to probe when pynvml does not say (NVML_NVLINK_MAX_LINKS is 36 in current headers).
MAX_NVLINKS = 36


class NoGpuError(RuntimeError):
    """No NVIDIA driver/NVML here: the caller must ask for a simulated node explicitly."""

    def __init__(self, detail: str = "") -> None:
        msg = "no NVIDIA driver/NVML on this machine; use --fake-gpus N for a simulated node"
        super().__init__(f"{msg} ({detail})" if detail else msg)


class NvmlFieldError(Exception):
    """One NVML query failed; `name` is pynvml's class name, e.g. NVMLError_NotSupported."""

    def __init__(self, name: str, msg: str = "") -> None:
        self.name = name
        self.msg = msg
        super().__init__(f"{name}: {msg}" if msg else name)


class NvmlSource(Protocol):
    """The NVML queries discovery needs; each raises NvmlFieldError on failure."""

    def driver_version(self) -> str: ...
    def device_count(self) -> int: ...
    def name(self, i: int) -> str: ...
    def uuid(self, i: int) -> str: ...
    def memory_total_bytes(self, i: int) -> int: ...
    def pci_bus_id(self, i: int) -> str: ...
    def mig_mode(self, i: int) -> tuple[int, int]: ...
    def nvlink_count(self, i: int) -> int: ...
    def nvlink_active(self, i: int, link: int) -> bool: ...
    def nvlink_remote_bus_id(self, i: int, link: int) -> str: ...
    def common_ancestor(self, i: int, j: int) -> int: ...
    def fabric(self, i: int) -> FabricInfo: ...
    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Discovery:
    """An inventory plus what went wrong on the way (for logs, not for the scheduler)."""

    inventory: Inventory
    driver_version: str = ""
    fabrics: tuple[FabricInfo, ...] = ()
    clique_reason: str = ""
    problems: tuple[str, ...] = ()


def normalize_bus_id(bus_id: str) -> str:
    """'0000:18:00.0' and '00000000:18:00.0' name the same device: compare as domain:bus:dev.fn ints."""
    m = re.fullmatch(r"\s*([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-7])\s*", bus_id)
    if not m:
        return bus_id.strip().lower()
    dom, bus, dev, fn = (int(x, 16) for x in m.groups())
    return f"{dom:08x}:{bus:02x}:{dev:02x}.{fn}"


class _Reader:
    """Runs NVML queries, turning each failure into a recorded problem and a default."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def get(self, what: str, default: T, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        except NvmlFieldError as e:
            self.problems.append(f"{what}: {e}")
            return default


def discover(source: NvmlSource, *, labels: Mapping[str, str] | None = None) -> Discovery:
    """Read every GPU through `source` and build the node's Inventory; never raises for one bad field."""
    r = _Reader()
    driver = r.get("driver_version", "", source.driver_version)
    count = r.get("device_count", 0, source.device_count)
    names: list[str] = []
    uuids: list[str] = []
    mems: list[int] = []
    buses: list[str] = []
    migs: list[bool] = []
    fabrics: list[FabricInfo] = []
    for i in range(count):
        names.append(r.get(f"gpu{i}.name", "unknown", source.name, i))
        uuids.append(r.get(f"gpu{i}.uuid", f"GPU-unknown-{i}", source.uuid, i))
        mems.append(r.get(f"gpu{i}.memory", 0, source.memory_total_bytes, i) // (1024 * 1024))
        buses.append(r.get(f"gpu{i}.pci", "", source.pci_bus_id, i))
        mig: tuple[int, int] = r.get(f"gpu{i}.mig_mode", (0, 0), source.mig_mode, i)
        migs.append(mig[0] == 1)  # (current, pending): only the current mode matters now
        fabrics.append(r.get(f"gpu{i}.fabric", FabricInfo(), source.fabric, i))

    nv = _nvlink_counts(source, count, buses, r)
    links = _link_matrix(source, count, nv, r)
    gpus = tuple(
        Gpu(
            index=i,
            uuid=uuids[i],
            model=names[i],
            memory_mib=mems[i],
            pci_bus_id=buses[i],
            mig_enabled=migs[i],
            nvlink_peers=tuple(uuids[j] for j in range(count) if j != i and nv[i][j] > 0),
        )
        for i in range(count)
    )
    clique = node_clique(fabrics)
    node_labels = dict(labels or {})
    if clique.label is not None:
        node_labels[CLIQUE_LABEL] = clique.label
    inventory = Inventory(
        gpus=gpus,
        links=links,
        labels=node_labels,
        fabric_cluster_uuid=clique.cluster_uuid,
        fabric_clique_id=clique.clique_id,
    )
    return Discovery(inventory, driver, tuple(fabrics), clique.reason, tuple(r.problems))


def _nvlink_counts(source: NvmlSource, count: int, buses: Sequence[str], r: _Reader) -> list[list[int]]:
    """nv[i][j]: active NVLinks between GPU i and j (direct, or through a common NVSwitch)."""
    local = {normalize_bus_id(b): j for j, b in enumerate(buses) if b}
    nv = [[0] * count for _ in range(count)]
    switch_links = [0] * count
    for i in range(count):
        for link in range(r.get(f"gpu{i}.nvlink_count", 0, source.nvlink_count, i)):
            try:
                active = source.nvlink_active(i, link)
            except NvmlFieldError as e:
                # NotSupported on every link is how a PCIe card says "no NVLink": not a problem.
                if e.name != "NVMLError_NotSupported":
                    r.problems.append(f"gpu{i}.nvlink{link}.state: {e}")
                continue
            if not active:
                continue
            remote = r.get(f"gpu{i}.nvlink{link}.remote", "", source.nvlink_remote_bus_id, i, link)
            j = local.get(normalize_bus_id(remote)) if remote else None
            if j is None:
                switch_links[i] += 1
            elif j != i:
                nv[i][j] += 1
    for i in range(count):
        for j in range(count):
            if i != j and switch_links[i] and switch_links[j]:
                nv[i][j] = max(nv[i][j], min(switch_links[i], switch_links[j]))
    return nv


def _link_matrix(source: NvmlSource, count: int, nv: list[list[int]], r: _Reader) -> tuple[tuple[int, ...], ...]:
    """Link scores (schemas.inventory.link_score scale); () when no pair is known, i.e. uniform."""
    if count < 2:
        return ()
    rows = [[0] * count for _ in range(count)]
    known = False
    for i in range(count):
        for j in range(i + 1, count):
            if nv[i][j]:
                score = LINK_NVLINK_BASE + nv[i][j]
            else:
                level = r.get(f"gpu{i}-gpu{j}.topology", -1, source.common_ancestor, i, j)
                score = _ANCESTOR_SCORE.get(level, 0)
            known = known or score > 0
            rows[i][j] = rows[j][i] = score
    return tuple(tuple(row) for row in rows) if known else ()


# --- sources -------------------------------------------------------------------


class PynvmlSource:
    """The real driver through pynvml; raises NoGpuError when there is no driver at all."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as e:  # the package is a dependency, but a stripped image may lack it
            raise NoGpuError("pynvml not installed") from e
        self._nvml = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise NoGpuError(f"{type(e).__name__}: {e}") from e
        self._handles: dict[int, Any] = {}

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        except self._nvml.NVMLError as e:
            raise NvmlFieldError(type(e).__name__, str(e)) from e

    def _h(self, i: int) -> Any:
        if i not in self._handles:
            self._handles[i] = self._call(self._nvml.nvmlDeviceGetHandleByIndex, i)
        return self._handles[i]

    @staticmethod
    def _text(v: str | bytes) -> str:
        return v.decode() if isinstance(v, bytes) else v

    def driver_version(self) -> str:
        return self._text(self._call(self._nvml.nvmlSystemGetDriverVersion))

    def device_count(self) -> int:
        return int(self._call(self._nvml.nvmlDeviceGetCount))

    def name(self, i: int) -> str:
        return self._text(self._call(self._nvml.nvmlDeviceGetName, self._h(i)))

    def uuid(self, i: int) -> str:
        return self._text(self._call(self._nvml.nvmlDeviceGetUUID, self._h(i)))

    def memory_total_bytes(self, i: int) -> int:
        return int(self._call(self._nvml.nvmlDeviceGetMemoryInfo, self._h(i)).total)

    def pci_bus_id(self, i: int) -> str:
        return self._text(self._call(self._nvml.nvmlDeviceGetPciInfo, self._h(i)).busId)

    def mig_mode(self, i: int) -> tuple[int, int]:
        cur, pending = self._call(self._nvml.nvmlDeviceGetMigMode, self._h(i))
        return int(cur), int(pending)

    def nvlink_count(self, i: int) -> int:
        return int(getattr(self._nvml, "NVML_NVLINK_MAX_LINKS", MAX_NVLINKS))

    def nvlink_active(self, i: int, link: int) -> bool:
        return bool(self._call(self._nvml.nvmlDeviceGetNvLinkState, self._h(i), link))

    def nvlink_remote_bus_id(self, i: int, link: int) -> str:
        return self._text(self._call(self._nvml.nvmlDeviceGetNvLinkRemotePciInfo, self._h(i), link).busId)

    def common_ancestor(self, i: int, j: int) -> int:
        return int(self._call(self._nvml.nvmlDeviceGetTopologyCommonAncestor, self._h(i), self._h(j)))

    def fabric(self, i: int) -> FabricInfo:
        """Newest fabric struct first (v3 has the health summary), then v2, then the legacy call."""
        import ctypes

        nv = self._nvml
        attempts: list[tuple[str, Callable[[], Any]]] = []
        if hasattr(nv, "c_nvmlGpuFabricInfo_v3_t"):
            attempts.append(("nvmlDeviceGetGpuFabricInfoV", nv.c_nvmlGpuFabricInfo_v3_t))
        if hasattr(nv, "c_nvmlGpuFabricInfo_v2_t"):
            attempts.append(("nvmlDeviceGetGpuFabricInfoV", nv.c_nvmlGpuFabricInfo_v2_t))
        attempts.append(("nvmlDeviceGetGpuFabricInfo", nv.c_nvmlGpuFabricInfo_t))
        last: NvmlFieldError | None = None
        for fn_name, struct in attempts:
            fn = getattr(nv, fn_name, None)
            if fn is None:
                continue
            info = struct()
            try:
                self._call(fn, self._h(i), ctypes.byref(info))
            except NvmlFieldError as e:
                last = e
                if e.name in ("NVMLError_NotSupported",):
                    return FabricInfo(state=FabricState.NOT_SUPPORTED)
                continue
            status = int(info.status)
            return FabricInfo(
                state=_enum(FabricState, int(info.state), FabricState.NOT_SUPPORTED),
                status="Success" if status == 0 else self._error_string(status),
                cluster_uuid=canonical_uuid(bytes(info.clusterUuid)),
                clique_id=int(info.cliqueId),
                health=_enum(FabricHealth, int(getattr(info, "healthSummary", 0)), FabricHealth.NOT_SUPPORTED),
            )
        raise last or NvmlFieldError("NVMLError_FunctionNotFound", "no fabric info call in this pynvml")

    def _error_string(self, code: int) -> str:
        try:
            return self._text(self._nvml.nvmlErrorString(code))
        except Exception:
            return f"NVML error {code}"

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass


E = TypeVar("E", FabricState, FabricHealth)


def _enum(cls: type[E], value: int, default: E) -> E:
    try:
        return cls(value)
    except ValueError:
        return default


class FixtureSource:
    """A recorded NVML dump (shared/fixtures/nvml/*.json): any field may be {"error": ..., "msg": ...}."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data = data
        self._devices: list[Mapping[str, Any]] = list(data.get("devices", []))

    @classmethod
    def load(cls, path: str | Path) -> FixtureSource:
        return cls(json.loads(Path(path).read_text()))

    @staticmethod
    def _value(v: Any, what: str) -> Any:
        if isinstance(v, Mapping) and "error" in v:
            raise NvmlFieldError(str(v["error"]), str(v.get("msg", "")))
        if v is None:
            raise NvmlFieldError("NVMLError_NotFound", f"{what} not recorded")
        return v

    def _dev(self, i: int, key: str) -> Any:
        return self._value(self._value(self._devices[i], f"gpu{i}").get(key), key)

    def driver_version(self) -> str:
        return str(self._value(self._data.get("driver"), "driver"))

    def device_count(self) -> int:
        return int(self._value(self._data.get("count", len(self._devices)), "count"))

    def name(self, i: int) -> str:
        return str(self._dev(i, "name"))

    def uuid(self, i: int) -> str:
        return str(self._dev(i, "uuid"))

    def memory_total_bytes(self, i: int) -> int:
        return int(self._value(self._dev(i, "memory").get("total"), "memory.total"))

    def pci_bus_id(self, i: int) -> str:
        return str(self._value(self._dev(i, "pci").get("busId"), "pci.busId"))

    def mig_mode(self, i: int) -> tuple[int, int]:
        cur, pending = self._dev(i, "mig_mode")
        return int(cur), int(pending)

    def _link(self, i: int, link: int) -> Mapping[str, Any]:
        links = self._dev(i, "nvlink")
        return next(entry for entry in links if entry.get("link") == link)

    def nvlink_count(self, i: int) -> int:
        return len(self._dev(i, "nvlink"))

    def nvlink_active(self, i: int, link: int) -> bool:
        return bool(self._value(self._link(i, link).get("state"), "nvlink.state"))

    def nvlink_remote_bus_id(self, i: int, link: int) -> str:
        remote = self._value(self._link(i, link).get("remote_pci"), "nvlink.remote_pci")
        return str(remote.get("busId", "")) if isinstance(remote, Mapping) else str(remote)

    def common_ancestor(self, i: int, j: int) -> int:
        table = self._value(self._data.get("topology_common_ancestor"), "topology_common_ancestor")
        return int(self._value(table[i][j], "topology_common_ancestor"))

    def fabric(self, i: int) -> FabricInfo:
        f = self._dev(i, "fabric")
        state = _enum(FabricState, int(f.get("state", 0)), FabricState.NOT_SUPPORTED)
        raw_uuid = f.get("clusterUuid")
        cluster = canonical_uuid(raw_uuid)
        if cluster is None and state == FabricState.COMPLETED:
            # The H200 dump recorded the ctypes repr, not the bytes: unknown, so never a clique.
            raise NvmlFieldError("UnreadableClusterUuid", repr(raw_uuid)[:60])
        status = int(f.get("status", 0))
        return FabricInfo(
            state=state,
            status="Success" if status == 0 else f"NVML error {status}",
            cluster_uuid=cluster,
            clique_id=int(f.get("cliqueId", 0)),
            health=_enum(FabricHealth, int(f.get("healthSummary", 0)), FabricHealth.NOT_SUPPORTED),
        )

    def close(self) -> None:
        pass


def discover_local(*, labels: Mapping[str, str] | None = None) -> Discovery:
    """Discover this machine's GPUs through the driver; NoGpuError when there is none."""
    source = PynvmlSource()
    try:
        return discover(source, labels=labels)
    finally:
        source.close()


def node_inventory(
    node_id: str,
    *,
    fake_gpus: int | None = None,
    labels: Mapping[str, str] | None = None,
    fake_model: str = "H100",
    fake_nvlink: Literal["all", "none"] = "all",
) -> Discovery:
    """Real GPUs, or `fake_gpus` simulated ones when asked; never falls back to fakes on its own."""
    if fake_gpus is not None:
        inv = fake_inventory(fake_gpus, node_id=node_id, model=fake_model, labels=labels, nvlink=fake_nvlink)
        return Discovery(inv, driver_version="fake", clique_reason="simulated node")
    return discover_local(labels=labels)
