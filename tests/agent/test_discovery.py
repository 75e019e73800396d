"""GPU discovery from the recorded H200 NVML dump, with injected NVML failures, and fake inventories."""

from __future__ import annotations

import copy
import json
from typing import Any

import pynvml
import pytest

from nodeagent.discovery import FixtureSource, NoGpuError, PynvmlSource, discover, node_inventory, normalize_bus_id
from nodeagent.fabric import CLIQUE_LABEL
from nodeagent.fake_gpus import fake_gpu_uuid, fake_inventory
from schemas import Inventory, decode, encode
from schemas.events import NodeRegistered
from schemas.inventory import LINK_NVLINK_BASE, LINK_PHB, LINK_SYS, link_score
from tests.agent.fixture_paths import FIXTURES

H200 = FIXTURES / "nvml" / "nvml_h200.json"
NOT_SUPPORTED = {"error": "NVMLError_NotSupported", "msg": "Not Supported"}
UNKNOWN = {"error": "NVMLError_Unknown", "msg": "Unknown Error"}


def _h200() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(H200.read_text())
    return data


def test_h200_fixture_parses_into_inventory() -> None:
    d = discover(FixtureSource.load(H200), labels={"block": "b1"})
    inv = d.inventory
    assert inv.gpu_count == 1
    (gpu,) = inv.gpus
    assert gpu.model == "NVIDIA H200"
    assert gpu.memory_mib == 143_771
    assert gpu.uuid == "GPU-edb2f9f5-19a4-f460-f00c-e54252bda438"
    assert gpu.pci_bus_id == "00000000:00:06.0"
    assert gpu.nvlink_peers == () and not gpu.mig_enabled
    assert inv.links == ()  # one GPU: nothing to rank
    assert inv.labels == {"block": "b1"} and inv.fabric_cluster_uuid is None
    assert d.driver_version == "580.159.04"
    assert d.problems == ()  # NotSupported NVLink on a PCIe card is normal, not a problem
    assert "not supported" in d.clique_reason
    # the inventory rides in NodeRegistered: it must survive the codec
    ev = NodeRegistered(event_id="e", occurred_at=0.0, node_id="n1", incarnation="i", address="a", inventory=inv)
    assert decode(encode(ev)) == ev


def test_per_field_errors_are_tolerated_and_recorded() -> None:
    data = _h200()
    dev = data["devices"][0]
    dev["name"] = UNKNOWN
    dev["memory"] = {"error": "NVMLError_GpuIsLost", "msg": "GPU is lost"}
    dev["mig_mode"] = NOT_SUPPORTED
    dev["fabric"] = NOT_SUPPORTED
    dev["nvlink"][0]["state"] = UNKNOWN
    d = discover(FixtureSource(data))
    (gpu,) = d.inventory.gpus
    assert gpu.uuid == "GPU-edb2f9f5-19a4-f460-f00c-e54252bda438"  # what did work is kept
    assert gpu.model == "unknown" and gpu.memory_mib == 0 and gpu.mig_enabled is False
    assert gpu.pci_bus_id == "00000000:00:06.0"
    joined = "\n".join(d.problems)
    for field in ("gpu0.name", "gpu0.memory", "gpu0.mig_mode", "gpu0.fabric", "gpu0.nvlink0.state"):
        assert field in joined
    assert "NVMLError_GpuIsLost" in joined


def test_every_field_an_error_still_yields_the_gpu() -> None:
    data = _h200()
    dev = data["devices"][0]
    for key in list(dev):
        if key != "index":
            dev[key] = UNKNOWN
    d = discover(FixtureSource(data))
    assert d.inventory.gpu_count == 1
    assert d.inventory.gpus[0].uuid == "GPU-unknown-0"
    assert len(d.problems) >= 6


def test_unreadable_cluster_uuid_with_completed_state_gives_no_clique() -> None:
    data = _h200()
    data["devices"][0]["fabric"]["state"] = 3  # COMPLETED, but the dump holds a ctypes repr
    d = discover(FixtureSource(data))
    assert CLIQUE_LABEL not in d.inventory.labels
    assert any("UnreadableClusterUuid" in p for p in d.problems)


def _eight_gpus(*, remote: str) -> dict[str, Any]:
    """An 8-GPU dump built from the H200 one: each GPU's links go to `remote` ("switch" or "ring")."""
    base = _h200()
    devices = []
    for i in range(8):
        dev = copy.deepcopy(base["devices"][0])
        dev["index"], dev["uuid"] = i, f"GPU-0000000{i}-0000-0000-0000-000000000000"
        dev["pci"]["busId"] = f"00000000:{0x18 + 0x10 * i:02X}:00.0"
        links = []
        for link in range(18):
            if remote == "switch":
                peer = {"busId": f"00000000:{0xA0 + link % 4:02X}:00.0"}  # NVSwitch devices
            else:  # ring: 9 links to each neighbour, given in the short 4-digit domain form
                nb = (i + 1) % 8 if link < 9 else (i - 1) % 8
                peer = {"busId": f"0000:{0x18 + 0x10 * nb:02x}:00.0"}
            links.append({"link": link, "state": 1, "remote_pci": peer})
        dev["nvlink"] = links
        u = "7b968a6d-c8aa-45e1-9e07-e1e51be99c31"
        dev["fabric"] = {"clusterUuid": u, "status": 0, "cliqueId": 4, "state": 3, "healthSummary": 1}
        devices.append(dev)
    base["devices"], base["count"] = devices, 8
    base["topology_common_ancestor"] = [[50 if (i < 4) != (j < 4) else 40 for j in range(8)] for i in range(8)]
    return base


def test_nvswitch_box_all_pairs_nv18_and_clique_label() -> None:
    d = discover(FixtureSource(_eight_gpus(remote="switch")))
    inv = d.inventory
    assert all(inv.links[i][j] == link_score("NV18") for i in range(8) for j in range(8) if i != j)
    assert all(len(g.nvlink_peers) == 7 for g in inv.gpus)
    assert inv.labels[CLIQUE_LABEL] == "7b968a6d-c8aa-45e1-9e07-e1e51be99c31.4"
    assert inv.fabric_clique_id == 4 and inv.fabric_cluster_uuid == "7b968a6d-c8aa-45e1-9e07-e1e51be99c31"
    assert d.problems == ()


def test_direct_links_map_remote_pci_to_peer_uuid_and_pcie_elsewhere() -> None:
    inv = discover(FixtureSource(_eight_gpus(remote="ring"))).inventory
    assert inv.gpus[0].nvlink_peers == (
        "GPU-00000001-0000-0000-0000-000000000000",
        "GPU-00000007-0000-0000-0000-000000000000",
    )
    assert inv.links[0][1] == inv.links[0][7] == LINK_NVLINK_BASE + 9
    assert inv.links[0][2] == 2  # NODE: same NUMA node, from the common-ancestor table
    assert inv.links[0][4] == LINK_SYS


def test_one_gpu_disagreeing_on_clique_drops_the_label() -> None:
    data = _eight_gpus(remote="switch")
    data["devices"][5]["fabric"]["cliqueId"] = 5
    d = discover(FixtureSource(data))
    assert CLIQUE_LABEL not in d.inventory.labels and "disagree" in d.clique_reason


def test_bus_ids_compare_across_domain_widths() -> None:
    assert normalize_bus_id("0000:18:00.0") == normalize_bus_id("00000000:18:00.0")
    assert normalize_bus_id("00000000:AB:00.0") == normalize_bus_id("0000:ab:00.0")


def test_no_driver_is_a_clear_error_and_no_silent_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_driver() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    with pytest.raises(NoGpuError, match=r"--fake-gpus N") as e:
        PynvmlSource()
    assert "DriverNotLoaded" in str(e.value)
    with pytest.raises(NoGpuError):
        node_inventory("n1")
    assert node_inventory("n1", fake_gpus=2).inventory.gpu_count == 2


def test_fake_inventory_is_deterministic_and_realistic() -> None:
    inv = fake_inventory(4, node_id="n1", labels={"leaf": "l1"})
    assert inv == fake_inventory(4, node_id="n1", labels={"leaf": "l1"})
    assert inv.gpus[0].uuid != fake_inventory(4, node_id="n2").gpus[0].uuid
    assert all(g.uuid.startswith("GPU-") and len(g.uuid) == 40 for g in inv.gpus)
    assert inv.gpus[2].uuid == fake_gpu_uuid("n1", 2)
    assert len({g.uuid for g in inv.gpus}) == 4
    assert [g.model for g in inv.gpus] == ["H100"] * 4 and inv.gpus[0].memory_mib == 81559
    assert inv.links[0][1] == link_score("NV18") and inv.links[1][1] == 0
    assert set(inv.gpus[0].nvlink_peers) == {g.uuid for g in inv.gpus[1:]}
    assert inv.labels == {"leaf": "l1"}
    pcie = fake_inventory(2, nvlink="none", model="A10", memory_mib=22731)
    assert pcie.links == ((0, LINK_PHB), (LINK_PHB, 0)) and pcie.gpus[0].nvlink_peers == ()
    assert fake_inventory(1).links == () and fake_inventory(0) == Inventory()
    with pytest.raises(ValueError):
        fake_inventory(2, nvlink="some")  # type: ignore[arg-type]


def test_pynvml_source_adapter_with_a_stubbed_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real adapter's calls and ctypes handling, with pynvml's C entry points stubbed out."""
    cluster = bytes.fromhex("7b968a6dc8aa45e19e07e1e51be99c31")
    buses = ["00000000:18:00.0", "00000000:2A:00.0"]

    def pci(bus: str) -> Any:
        info = pynvml.nvmlPciInfo_t()
        info.busId = bus.encode()
        return info

    def fabric_v(handle: int, ref: Any) -> None:
        info = ref._obj
        if not isinstance(info, pynvml.c_nvmlGpuFabricInfo_v3_t):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        info.clusterUuid[:] = list(cluster)
        info.status, info.cliqueId, info.state, info.healthSummary = 0, 7, 3, 1

    def nvlink_state(handle: int, link: int) -> int:
        if link >= 4:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 1

    def no_topology(a: int, b: int) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    class Mem:
        total = 81559 * 1024 * 1024

    stubs: dict[str, Any] = {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlSystemGetDriverVersion": lambda: "565.57.01",
        "nvmlDeviceGetCount": lambda: 2,
        "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlDeviceGetName": lambda h: b"NVIDIA H100 80GB HBM3",
        "nvmlDeviceGetUUID": lambda h: f"GPU-{h}",
        "nvmlDeviceGetMemoryInfo": lambda h: Mem(),
        "nvmlDeviceGetPciInfo": lambda h: pci(buses[h]),
        "nvmlDeviceGetMigMode": lambda h: [0, 0],
        "nvmlDeviceGetNvLinkState": nvlink_state,
        "nvmlDeviceGetNvLinkRemotePciInfo": lambda h, link: pci(buses[1 - h]),
        "nvmlDeviceGetTopologyCommonAncestor": no_topology,
        "nvmlDeviceGetGpuFabricInfoV": fabric_v,
    }
    for name, fn in stubs.items():
        monkeypatch.setattr(pynvml, name, fn)
    d = node_inventory("n1")
    inv = d.inventory
    assert [g.uuid for g in inv.gpus] == ["GPU-0", "GPU-1"] and inv.gpus[0].model == "NVIDIA H100 80GB HBM3"
    assert inv.gpus[0].memory_mib == 81559 and inv.gpus[1].pci_bus_id == "00000000:2A:00.0"
    assert inv.gpus[0].nvlink_peers == ("GPU-1",) and inv.links[0][1] == LINK_NVLINK_BASE + 4
    assert inv.labels[CLIQUE_LABEL] == "7b968a6d-c8aa-45e1-9e07-e1e51be99c31.7"
    assert d.driver_version == "565.57.01" and d.problems == ()
