"""Readers of the real nvidia-smi outputs in shared/fixtures/topology/, and what the scheduler derives from them.

Test support, not part of the agent: the agent discovers GPUs, links and
fabric through NVML (nodeagent/discovery.py). These readers let the tests hold
what that discovery feeds the scheduler (link scores, clique labels) against
real boxes: HGX A100/H100, the DGX-1's partial NVLink, PCIe-only, a GB200 tray.

- `nvidia-smi topo -m`: GPU x GPU link tokens, GPU -> NIC affinity, CPU/NUMA per GPU;
- `nvidia-smi nvlink -s` / `--status` and `--capabilities`: per-link state;
- the `Fabric` blocks of `nvidia-smi -q`: multi-node NVLink registration.

The formats drift across driver versions (tabs when piped, spaces when pasted,
NIC columns named `mlx5_N` before `NIC#` + "NIC Legend" existed, ANSI
underline on a terminal header, NUMA columns missing or `N/A`), so parsing
keys on names, never on column positions. Lines starting with "# " are
fixture headers, never nvidia-smi output, and are skipped.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from nodeagent.fabric import FabricHealth, FabricInfo, FabricState, canonical_uuid
from schemas.inventory import LINK_NVLINK_BASE, link_score

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_DEVICE = re.compile(r"^[A-Za-z][\w.:-]*$")
_GPU = re.compile(r"^GPU(\d+)$")
_NIC_LEGEND = re.compile(r"^\s*(NIC\d+):\s*(\S+)\s*$")
_CPU_AFFINITY, _NUMA_AFFINITY, _GPU_NUMA = "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"


class TopologyParseError(ValueError):
    """The text is not the nvidia-smi output the parser was asked to read."""


def output_lines(text: str) -> list[str]:
    """nvidia-smi's lines: ANSI codes removed, fixture header lines ("# ...") dropped."""
    return [_ANSI.sub("", line).rstrip("\r") for line in text.splitlines() if not line.startswith("# ")]


# --- topo -m -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TopoMatrix:
    """`nvidia-smi topo -m`, by name. Tokens are nvidia-smi's ("NV12", "PIX", "X" on the diagonal)."""

    gpus: tuple[str, ...]
    #: NIC device names (legend-resolved, e.g. "mlx5_bond_0"); the column label when no legend.
    nics: tuple[str, ...]
    gpu_links: tuple[tuple[str, ...], ...]
    gpu_nic: tuple[tuple[str, ...], ...]
    nic_links: tuple[tuple[str, ...], ...]
    #: Raw CPU list per GPU ("0-47,96-143"); None when the column is absent.
    cpu_affinity: tuple[str | None, ...]
    #: NUMA node per GPU; None when absent or N/A.
    numa_affinity: tuple[int | None, ...]
    gpu_numa_id: tuple[int | None, ...]

    def link(self, i: int, j: int) -> str:
        return self.gpu_links[i][j]


def parse_topo_matrix(text: str) -> TopoMatrix:
    """Parse `nvidia-smi topo -m` output (any known layout) into a TopoMatrix."""
    lines = output_lines(text)
    try:
        h = next(i for i, line in enumerate(lines) if "GPU0" in line.split())
    except StopIteration:
        raise TopologyParseError("no header row with GPU0") from None
    header = [t for t in re.split(r"\t+| {2,}", lines[h].strip()) if t]
    n_dev = next((k for k, t in enumerate(header) if not _DEVICE.match(t)), len(header))
    columns, extra_cols = header[:n_dev], header[n_dev:]

    rows: dict[str, list[str]] = {}
    for line in lines[h + 1 :]:
        if not line.strip() or line.strip().startswith("Legend"):
            break
        tokens = line.split()
        name, cells = tokens[0], tokens[1:]
        if name not in columns or name in rows:
            raise TopologyParseError(f"unexpected row {name!r}")
        if len(cells) < n_dev:
            raise TopologyParseError(f"row {name} has {len(cells)} cells, header has {n_dev} devices")
        rows[name] = cells
    if missing := [c for c in columns if c not in rows]:
        raise TopologyParseError(f"no rows for {missing}")

    legend = {m.group(1): m.group(2) for line in lines if (m := _NIC_LEGEND.match(line))}
    gpu_cols = [c for c in columns if _GPU.match(c)]
    nic_cols = [c for c in columns if not _GPU.match(c)]
    gi = [columns.index(c) for c in gpu_cols]
    ni = [columns.index(c) for c in nic_cols]

    def extras(gpu: str) -> dict[str, str]:
        return dict(zip(extra_cols, rows[gpu][n_dev:], strict=False))

    def numa(value: str | None) -> int | None:
        return int(value) if value is not None and value.isdigit() else None

    return TopoMatrix(
        gpus=tuple(gpu_cols),
        nics=tuple(legend.get(c, c) for c in nic_cols),
        gpu_links=tuple(tuple(rows[g][k] for k in gi) for g in gpu_cols),
        gpu_nic=tuple(tuple(rows[g][k] for k in ni) for g in gpu_cols),
        nic_links=tuple(tuple(rows[n][k] for k in ni) for n in nic_cols),
        cpu_affinity=tuple(extras(g).get(_CPU_AFFINITY) for g in gpu_cols),
        numa_affinity=tuple(numa(extras(g).get(_NUMA_AFFINITY)) for g in gpu_cols),
        gpu_numa_id=tuple(numa(extras(g).get(_GPU_NUMA)) for g in gpu_cols),
    )


def to_link_scores(matrix: TopoMatrix) -> tuple[tuple[int, ...], ...]:
    """GPU x GPU scores for Inventory.links (schemas.inventory.link_score); 0 on the diagonal."""
    n = len(matrix.gpus)
    return tuple(tuple(0 if i == j else link_score(matrix.gpu_links[i][j]) for j in range(n)) for i in range(n))


def nvlink_islands(links: Sequence[Sequence[int]]) -> tuple[frozenset[int], ...]:
    """Connected components over NVLink pairs, ordered by lowest GPU index.

    An island is not a full mesh: a DGX-1's hybrid cube mesh is one island of 8
    in which GPU0-GPU5 still goes through SYS. See `is_full_nvlink_mesh`.
    """
    n = len(links)
    seen: set[int] = set()
    islands: list[frozenset[int]] = []
    for start in range(n):
        if start in seen:
            continue
        comp, stack = {start}, [start]
        while stack:
            i = stack.pop()
            for j in range(n):
                if j not in comp and links[i][j] >= LINK_NVLINK_BASE:
                    comp.add(j)
                    stack.append(j)
        seen |= comp
        islands.append(frozenset(comp))
    return tuple(islands)


def is_full_nvlink_mesh(links: Sequence[Sequence[int]], gpus: Sequence[int]) -> bool:
    """Every pair of `gpus` is joined by NVLink (directly or via NVSwitch)."""
    return all(links[i][j] >= LINK_NVLINK_BASE for i in gpus for j in gpus if i != j)


def nearest_nics(matrix: TopoMatrix, gpu: int) -> tuple[str, ...]:
    """The NICs closest to `gpu` (best PCIe path), for pinning a rank's network traffic."""
    if not matrix.nics:
        return ()
    scores = [link_score(t) for t in matrix.gpu_nic[gpu]]
    best = max(scores)
    return tuple(name for name, s in zip(matrix.nics, scores, strict=True) if s == best)


def parse_cpu_list(text: str | None) -> tuple[int, ...]:
    """'0-47,96-143' or '6,14,22,30' -> CPU ids; () for None, '' or N/A."""
    if not text or text.strip().upper() == "N/A":
        return ()
    cpus: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(cpus)


# --- nvlink -s / --capabilities ---------------------------------------------------

_NVLINK_GPU = re.compile(r"^GPU (\d+): (.*?) \(UUID: (.*)\)\s*$")
_NVLINK_LINK = re.compile(r"^\s*Link (\d+): (.*?)\s*$")
_NVLINK_CAP = re.compile(r"^\s*Link (\d+), (.*?): (true|false)\s*$")
_SPEED = re.compile(r"^([\d.]+) GB/s$")


@dataclass(frozen=True, slots=True)
class NvLinkGpu:
    """One GPU block of `nvidia-smi nvlink -s`: link -> GB/s, None for `<inactive>`."""

    index: int
    name: str
    #: None when the output elides it (e.g. "UUID: ...").
    uuid: str | None
    links: dict[int, float | None]

    @property
    def active_links(self) -> int:
        return sum(1 for v in self.links.values() if v is not None)

    @property
    def inactive_links(self) -> tuple[int, ...]:
        return tuple(k for k, v in self.links.items() if v is None)


def _gpu_blocks(text: str) -> list[tuple[re.Match[str], list[str]]]:
    blocks: list[tuple[re.Match[str], list[str]]] = []
    for line in output_lines(text):
        if m := _NVLINK_GPU.match(line):
            blocks.append((m, []))
        elif blocks:
            blocks[-1][1].append(line)
    return blocks


def parse_nvlink_status(text: str) -> tuple[NvLinkGpu, ...]:
    """Parse `nvidia-smi nvlink -s` (tab or space indented); elisions like '...' are ignored."""
    gpus = []
    for m, body in _gpu_blocks(text):
        links: dict[int, float | None] = {}
        for line in body:
            if lm := _NVLINK_LINK.match(line):
                speed = _SPEED.match(lm.group(2))
                links[int(lm.group(1))] = float(speed.group(1)) if speed else None
        uuid = m.group(3).strip()
        gpus.append(NvLinkGpu(int(m.group(1)), m.group(2).strip(), uuid if uuid.startswith("GPU-") else None, links))
    if not gpus:
        raise TopologyParseError("no 'GPU n: ... (UUID: ...)' block")
    return tuple(gpus)


def parse_nvlink_capabilities(text: str) -> dict[int, dict[int, dict[str, bool]]]:
    """Parse `nvidia-smi nvlink --capabilities`: gpu -> link -> capability -> supported."""
    out: dict[int, dict[int, dict[str, bool]]] = {}
    for m, body in _gpu_blocks(text):
        per_link: dict[int, dict[str, bool]] = {}
        for line in body:
            if cm := _NVLINK_CAP.match(line):
                per_link.setdefault(int(cm.group(1)), {})[cm.group(2)] = cm.group(3) == "true"
        out[int(m.group(1))] = per_link
    if not out:
        raise TopologyParseError("no 'GPU n: ... (UUID: ...)' block")
    return out


# --- nvidia-smi -q: Fabric -------------------------------------------------------

_STATES = {
    "completed": FabricState.COMPLETED,
    "in progress": FabricState.IN_PROGRESS,
    "not started": FabricState.NOT_STARTED,
}
_HEALTH = {
    "healthy": FabricHealth.HEALTHY,
    "unhealthy": FabricHealth.UNHEALTHY,
    "limited capacity": FabricHealth.LIMITED_CAPACITY,
}


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def parse_fabric(text: str) -> tuple[FabricInfo, ...]:
    """Every `Fabric` block of `nvidia-smi -q`, in GPU order ("N/A" state reads as NOT_SUPPORTED)."""
    lines = output_lines(text)
    out = []
    for k, line in enumerate(lines):
        if line.strip() != "Fabric":
            continue
        fields: dict[str, str] = {}
        section, base = "", None
        for sub in lines[k + 1 :]:
            if not sub.strip() or sub.strip() == "--" or _indent(sub) <= _indent(line):
                break
            base = _indent(sub) if base is None else base
            key, sep, value = sub.strip().partition(":")
            if not sep:  # a sub-section header such as "Health"
                section = key.strip()
                continue
            fields[f"{section}.{key.strip()}" if _indent(sub) > base else key.strip()] = value.strip()
        clique = fields.get("CliqueId", "0")
        out.append(
            FabricInfo(
                state=_STATES.get(fields.get("State", "").lower(), FabricState.NOT_SUPPORTED),
                status=fields.get("Status", ""),
                cluster_uuid=canonical_uuid(fields.get("ClusterUUID")),
                clique_id=int(clique) if clique.isdigit() else 0,
                health=_HEALTH.get(fields.get("Health.Summary", "").lower(), FabricHealth.NOT_SUPPORTED),
            )
        )
    if not out:
        raise TopologyParseError("no Fabric block")
    return tuple(out)
