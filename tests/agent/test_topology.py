"""Real nvidia-smi outputs (shared/fixtures/topology/) read by tests/agent/nvidia_smi.py: link scores, clique rule.

Each fixture gets generic invariants (so a new file is covered the day it is
added) plus, where we know them, facts read off the file by hand.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeagent.fabric import FabricHealth, FabricInfo, FabricState, node_clique
from schemas.inventory import LINK_NVLINK_BASE, LINK_PHB, LINK_SYS, link_score
from tests.agent.fixture_paths import FIXTURES
from tests.agent.nvidia_smi import (
    TopologyParseError,
    is_full_nvlink_mesh,
    nearest_nics,
    nvlink_islands,
    parse_cpu_list,
    parse_fabric,
    parse_nvlink_capabilities,
    parse_nvlink_status,
    parse_topo_matrix,
    to_link_scores,
)
from tests.core.harness import DGX1_LINKS

TOPOLOGY = FIXTURES / "topology"
ALL_FILES = sorted(p for p in TOPOLOGY.glob("*") if p.is_file() and p.name != "README.md")
KNOWN_TOKENS = {"X", "PIX", "PXB", "PHB", "NODE", "SYS"}


def _kind(path: Path) -> str:
    name = path.name
    if name.startswith("topo_"):
        return "topo"
    if name.startswith("nvlink_capabilities"):
        return "nvlink_caps"
    if name.startswith(("nvlink_s_", "nvlink_status")):
        return "nvlink"
    if name.startswith(("fabric_", "nvidia_smi_q")):
        return "fabric"
    return "unknown"


def test_fixture_folder_is_there() -> None:
    assert len(ALL_FILES) >= 19, f"expected the topology fixtures under {TOPOLOGY}"


@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: p.name)
def test_every_fixture_parses(path: Path) -> None:
    text = path.read_text()
    kind = _kind(path)
    assert kind != "unknown", f"{path.name}: no parser claims this fixture; name it by kind or add a parser"
    if kind == "topo":
        m = parse_topo_matrix(text)
        n = len(m.gpus)
        assert n >= 2
        assert m.gpus == tuple(f"GPU{i}" for i in range(n))
        for i in range(n):
            assert m.link(i, i) == "X"
            for j in range(n):
                assert m.link(i, j) == m.link(j, i), f"asymmetric at GPU{i},GPU{j}"
                tok = m.link(i, j)
                assert tok in KNOWN_TOKENS or link_score(tok) >= LINK_NVLINK_BASE, tok
        assert all(len(row) == len(m.nics) for row in m.gpu_nic)
        assert len(m.nic_links) == len(m.nics)
        for a in range(len(m.nics)):
            assert m.nic_links[a][a] == "X"
        assert all(c is not None and parse_cpu_list(c) for c in m.cpu_affinity)
        scores = to_link_scores(m)
        assert sorted(g for island in nvlink_islands(scores) for g in island) == list(range(n))
    elif kind == "nvlink":
        gpus = parse_nvlink_status(text)
        assert gpus and all(g.links for g in gpus)
        assert all(v is None or v > 0 for g in gpus for v in g.links.values())
    elif kind == "nvlink_caps":
        caps = parse_nvlink_capabilities(text)
        assert caps and all(per_link for per_link in caps.values())
    else:
        fabrics = parse_fabric(text)
        assert fabrics and all(f.state != FabricState.NOT_SUPPORTED for f in fabrics)


def _topo(name: str):
    return parse_topo_matrix((TOPOLOGY / name).read_text())


def _nv_pairs_all(name: str, token: str) -> None:
    m = _topo(name)
    n = len(m.gpus)
    assert all(m.link(i, j) == token for i in range(n) for j in range(n) if i != j)
    scores = to_link_scores(m)
    assert nvlink_islands(scores) == (frozenset(range(n)),)
    assert is_full_nvlink_mesh(scores, range(n))


@pytest.mark.parametrize(
    ("name", "token"),
    [
        ("topo_a100_8gpu_nv12_17nic_bond.txt", "NV12"),
        ("topo_a100_8gpu_nv12_3nic_bond_2numa.txt", "NV12"),
        ("topo_h100_8gpu_nv18_nonic_2numa.txt", "NV18"),
        ("topo_h100class_8gpu_nv18_13nic_ib_eth.txt", "NV18"),
        ("topo_h100_4gpu_nv6_mesh_4nic.txt", "NV6"),
        ("topo_gb200_4gpu_nv18_tray.txt", "NV18"),
    ],
)
def test_all_pairs_nvlink_boxes(name: str, token: str) -> None:
    _nv_pairs_all(name, token)


@pytest.mark.parametrize(
    "name", ["topo_dgx1_v100_8gpu_hybrid_cube_mesh_4nic.txt", "topo_dgx1_v100_8gpu_hybrid_cube_mesh_1nic.txt"]
)
def test_dgx1_hybrid_cube_mesh_is_one_island_with_partial_links(name: str) -> None:
    m = _topo(name)
    assert (m.link(0, 1), m.link(0, 2), m.link(0, 3), m.link(0, 4)) == ("NV1", "NV1", "NV2", "NV2")
    assert m.link(0, 5) == m.link(0, 6) == m.link(0, 7) == "SYS"
    scores = to_link_scores(m)
    assert scores[0][3] == LINK_NVLINK_BASE + 2 > scores[0][1] == LINK_NVLINK_BASE + 1 > scores[0][5] == LINK_SYS
    assert nvlink_islands(scores) == (frozenset(range(8)),)
    assert not is_full_nvlink_mesh(scores, range(8))
    # {0,1,2,3} is a fully connected quad of the cube mesh; {0,1,2,5} is not
    assert is_full_nvlink_mesh(scores, [0, 1, 2, 3])
    assert not is_full_nvlink_mesh(scores, [0, 1, 2, 5])
    assert m.numa_affinity == (None,) * 8  # old format: no NUMA column
    assert scores == DGX1_LINKS  # the matrix the core's placement tests use is this box's


def test_dgx1_old_format_nics_named_by_device_out_of_order() -> None:
    m = _topo("topo_dgx1_v100_8gpu_hybrid_cube_mesh_4nic.txt")
    assert m.nics == ("mlx5_2", "mlx5_0", "mlx5_3", "mlx5_1")
    assert nearest_nics(m, 0) == ("mlx5_0",)
    assert nearest_nics(m, 2) == ("mlx5_1",)
    assert nearest_nics(m, 4) == ("mlx5_2",)
    assert m.cpu_affinity == ("0-19,40-59",) * 8
    one = _topo("topo_dgx1_v100_8gpu_hybrid_cube_mesh_1nic.txt")
    assert one.nics == ("mlx5_0",) and one.gpu_nic[0] == ("NODE",) and one.gpu_nic[2] == ("PIX",)
    assert parse_cpu_list(one.cpu_affinity[4]) == (*range(12, 24), *range(36, 48))


@pytest.mark.parametrize(
    "name",
    ["topo_8gpu_pcie_sys_2numa_tabs.txt", "topo_a10_4gpu_pcie_sys_2nic.txt", "topo_1080ti_2gpu_pcie_phb.txt"],
)
def test_pcie_only_boxes_have_no_nvlink_island(name: str) -> None:
    scores = to_link_scores(_topo(name))
    assert all(len(island) == 1 for island in nvlink_islands(scores))
    assert max(max(row) for row in scores) < LINK_NVLINK_BASE


def test_raw_tab_layout_with_empty_cell() -> None:
    m = _topo("topo_8gpu_pcie_sys_2numa_tabs.txt")
    assert len(m.gpus) == 8 and m.link(0, 7) == "SYS"
    assert m.cpu_affinity[0] == "0-15,32-47" and m.cpu_affinity[7] == "16-31,48-63"
    assert m.numa_affinity == (0, 0, 0, 0, 1, 1, 1, 1)
    assert m.gpu_numa_id == (None,) * 8


def test_1080ti_phb_and_na_numa() -> None:
    m = _topo("topo_1080ti_2gpu_pcie_phb.txt")
    assert to_link_scores(m) == ((0, LINK_PHB), (LINK_PHB, 0))
    assert m.numa_affinity == (None, None)
    assert m.nics == ()


def test_nic_legend_resolves_names() -> None:
    m = _topo("topo_a100_8gpu_nv12_17nic_bond.txt")
    assert len(m.nics) == 17 and m.nics[0] == "mlx5_2" and m.nics[16] == "mlx5_bond_0"
    assert nearest_nics(m, 0) == ("mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5")  # all PXB
    assert m.nic_links[0][1] == "PIX"
    ib = _topo("topo_h100class_8gpu_nv18_13nic_ib_eth.txt")
    assert [nearest_nics(ib, g) for g in range(8)] == [(f"mlx5_ib{g}",) for g in range(8)]
    assert ib.nics[8:] == tuple(f"mlx5_eth{k}" for k in range(5))
    assert ib.numa_affinity == (0, 0, 0, 0, 1, 1, 1, 1)
    bond = _topo("topo_a100_8gpu_nv12_3nic_bond_2numa.txt")
    assert bond.nics == ("mlx5_0", "mlx5_3", "mlx5_bond_0")
    assert nearest_nics(bond, 4) == ("mlx5_3",)


def test_nv6_mesh_numa_per_gpu_and_trailing_space() -> None:
    m = _topo("topo_h100_4gpu_nv6_mesh_4nic.txt")
    assert m.numa_affinity == (3, 1, 7, 5)
    assert parse_cpu_list(m.cpu_affinity[0]) == (6, 14, 22, 30)
    assert m.nics == ("NIC0", "NIC1", "NIC2", "NIC3")  # legend cut off: column names stay
    assert [nearest_nics(m, g) for g in range(4)] == [(f"NIC{g}",) for g in range(4)]
    assert m.nic_links[3][3] == "X"


def test_gb200_tray_numa_split() -> None:
    m = _topo("topo_gb200_4gpu_nv18_tray.txt")
    assert m.cpu_affinity == ("0-71", "0-71", "72-143", "72-143")
    assert m.numa_affinity == (0, 0, 1, 1)


def test_terminal_capture_with_ansi_underline_and_one_gpu() -> None:
    m = parse_topo_matrix((FIXTURES / "nvml" / "nvidia_smi_topo.txt").read_text())
    assert m.gpus == ("GPU0",) and m.link(0, 0) == "X"
    assert m.cpu_affinity == ("0-15",) and m.numa_affinity == (0,)
    assert nvlink_islands(to_link_scores(m)) == (frozenset({0}),)


def test_not_a_topo_matrix_is_an_error() -> None:
    with pytest.raises(TopologyParseError):
        parse_topo_matrix("hello\nworld\n")
    with pytest.raises(TopologyParseError):
        parse_nvlink_status("nothing here")
    with pytest.raises(TopologyParseError):
        parse_fabric("GPU 0\n    Product Name : x\n")


# --- nvlink -s ---------------------------------------------------------------------


def test_nvlink_status_speeds_and_inactive_links() -> None:
    (a100,) = parse_nvlink_status((TOPOLOGY / "nvlink_s_a100_p4de_gpu0_tabs.txt").read_text())
    assert a100.name == "NVIDIA A100-SXM4-80GB" and a100.uuid == "GPU-370ec676-e407-3115-836a-8ebcb3c4f62a"
    assert a100.active_links == 12 and set(a100.links.values()) == {25.0}

    (h100,) = parse_nvlink_status((TOPOLOGY / "nvlink_status_h100_gpu0.txt").read_text())
    assert h100.active_links == 18 and set(h100.links.values()) == {26.562}

    (v100,) = parse_nvlink_status((TOPOLOGY / "nvlink_s_v100_inactive_links_fragment.txt").read_text())
    assert v100.index == 3 and v100.uuid is None  # the poster elided it
    assert v100.inactive_links == (3, 5) and v100.active_links == 4

    gb0, gb1 = parse_nvlink_status((TOPOLOGY / "nvlink_s_gb200_partial.txt").read_text())
    assert gb0.active_links == 18 and set(gb0.links.values()) == {53.125}
    assert sorted(gb1.links) == [0, 1]  # cut by the poster's '...'


def test_nvlink_capabilities() -> None:
    caps = parse_nvlink_capabilities((TOPOLOGY / "nvlink_capabilities_h100_gpu0.txt").read_text())
    assert sorted(caps) == [0] and sorted(caps[0]) == list(range(18))
    assert caps[0][0]["P2P is supported"] is True and len(caps[0][17]) == 6


# --- fabric / clique ---------------------------------------------------------------


def test_single_node_hgx_zero_uuid_gets_no_clique() -> None:
    fabrics = parse_fabric((TOPOLOGY / "nvidia_smi_q_h100_8gpu_fabric_zero_uuid.txt").read_text())
    assert len(fabrics) == 8
    assert all(f.state == FabricState.COMPLETED and f.status == "Success" and f.clique_id == 0 for f in fabrics)
    assert not any(f.attached for f in fabrics)
    c = node_clique(fabrics)
    assert c.label is None and c.cluster_uuid is None and "zero cluster UUID" in c.reason


def test_failed_registration_gets_no_clique() -> None:
    (f,) = parse_fabric((TOPOLOGY / "fabric_q_insufficient_resources_zero_uuid.txt").read_text())
    assert f.state == FabricState.COMPLETED and f.status == "Insufficient Resources"
    assert node_clique([f]).label is None
    assert "Insufficient Resources" in node_clique([f]).reason


def test_clique2_unhealthy_gets_no_clique_but_healthy_would() -> None:
    """Decision (nodeagent/fabric.py): an Unhealthy fabric gives no clique label."""
    (f,) = parse_fabric((TOPOLOGY / "fabric_q_clique2_health_unhealthy.txt").read_text())
    assert f.attached and f.clique_id == 2 and f.cluster_uuid == "dc6e40c4-d722-4357-9ba6-5291dd461278"
    assert f.health == FabricHealth.UNHEALTHY
    assert node_clique([f, f]).label is None and "Unhealthy" in node_clique([f]).reason
    healthy = FabricInfo(FabricState.COMPLETED, "Success", f.cluster_uuid, 2, FabricHealth.HEALTHY)
    limited = FabricInfo(FabricState.COMPLETED, "Success", f.cluster_uuid, 2, FabricHealth.LIMITED_CAPACITY)
    c = node_clique([healthy, limited, healthy, healthy])
    assert c.label == "dc6e40c4-d722-4357-9ba6-5291dd461278.2" and c.clique_id == 2


def test_clique_requires_every_gpu_to_agree() -> None:
    u = "7b968a6d-c8aa-45e1-9e07-e1e51be99c31"
    a = FabricInfo(FabricState.COMPLETED, "Success", u, 1)
    assert node_clique([a, a]).label == f"{u}.1"
    assert node_clique([a, FabricInfo(FabricState.COMPLETED, "Success", u, 2)]).label is None
    assert node_clique([a, FabricInfo(FabricState.IN_PROGRESS, "", u, 1)]).label is None
    assert node_clique([a, FabricInfo()]).label is None  # one GPU without fabric support
    assert node_clique([]).label is None
