"""Node files shared by the node, node-file and simulation tests: a good one, one with scripted
events, an uneven NVSwitch fabric, and a strategy drawing valid node files."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import strategies as st

from nvplugin.node.model import MAX_NVLINKS, Pcie

GOOD = """version: v1
name: good
numa_distances: [[10, 21], [21, 10]]
gpus:
  - {name: GPU A, uuid: GPU-aaaa, pci_bus_id: "00000000:18:00.0", numa_node: 0}
  - {name: GPU B, uuid: GPU-bbbb, pci_bus_id: "00000000:19:00.0", numa_node: 1}
links: |2
        GPU0     GPU1
  GPU0  X        NV2+SYS
  GPU1  NV2+SYS  X
"""


def write_node_file(text: str) -> str:
    folder = tempfile.mkdtemp(prefix="nvplugin-test-node-")
    path = Path(folder, "node.yaml")
    path.write_text(text)
    return str(path)


@st.composite
def node_files(draw: st.DrawFn) -> tuple[str, dict[str, object]]:
    n = draw(st.integers(1, 6))
    numa_count = draw(st.integers(1, 3))
    explicit_distances = draw(st.booleans())
    numa = [draw(st.none() | st.integers(0, numa_count - 1)) for _ in range(n)]
    fabric = [draw(st.sampled_from([0, 0, 2, 6, 12])) for _ in range(n)]
    with_uuid = [draw(st.booleans()) for _ in range(n)]
    with_bus = [draw(st.booleans()) for _ in range(n)]
    cells = [["X"] * n for _ in range(n)]
    links: list[list[tuple[str, int] | None]] = [[None] * n for _ in range(n)]
    # NVLinks each GPU may still take (direct links + nvswitch_links <= 18, or the file is bad).
    budget = [MAX_NVLINKS - f for f in fabric]
    for i in range(n):
        for j in range(i + 1, n):
            pcie = draw(st.sampled_from(PCIE))
            both = fabric[i] and fabric[j]
            if both:
                nv = min(fabric[i], fabric[j])
            else:
                nv = draw(st.integers(0, min(2, budget[i], budget[j])))
                budget[i] -= nv
                budget[j] -= nv
            default = Pcie.NODE if numa[i] is not None and numa[i] == numa[j] else Pcie.SYS
            if nv and pcie == default and draw(st.booleans()):
                cell = f"NV{nv}"  # the PCIe part left to the default rule
            elif nv:
                cell = f"NV{nv}+{pcie.name}" if draw(st.booleans()) else f"{pcie.name}+NV{nv}"
            else:
                cell = pcie.name
            cells[i][j] = cells[j][i] = cell
            links[i][j] = links[j][i] = (pcie.name, nv)
    lines = ["version: v1", "name: generated"]
    if explicit_distances:
        rows = [
            [10 if a == b else 21 + a + b for b in range(numa_count)] for a in range(numa_count)
        ]
        lines.append(f"numa_distances: {rows}")
    lines.append("gpus:")
    for i in range(n):
        fields = [f"name: Model {i % 2}"]
        if with_uuid[i]:
            fields.append(f"uuid: GPU-{i:04d}-gen")
        if with_bus[i]:
            fields.append(f'pci_bus_id: "0000{i + 1:04X}:{0x80 + i:02X}:00.0"')
        fields.append("numa_node: " + ("null" if numa[i] is None else str(numa[i])))
        if fabric[i]:
            fields.append(f"nvswitch_links: {fabric[i]}")
        fields.append(f"memory_mib: {1024 * (i + 1)}")
        lines.append("  - {" + ", ".join(fields) + "}")
    lines.append("links: |2")
    lines.append("        " + "  ".join(f"GPU{j}" for j in range(n)))
    for i in range(n):
        lines.append(f"  GPU{i}  " + "  ".join(cells[i]))
    expected = {"links": links, "numa": numa, "uuid": with_uuid, "bus": with_bus, "n": n}
    return "\n".join(lines) + "\n", expected


EVENTS_NODE = """
version: v1
name: events
gpus: [{name: A}, {name: B}, {name: C}]
links: |2
        GPU0  GPU1  GPU2
  GPU0  X     PIX   PIX
  GPU1  PIX   X     PIX
  GPU2  PIX   PIX   X
events:
{events}
"""


UNEVEN_FABRIC = """
version: v1
name: uneven-fabric
gpus:
  - {name: A, nvswitch_links: 12, numa_node: 0}
  - {name: B, nvswitch_links: 6, numa_node: 0}
  - {name: C, numa_node: 0}
links: |2
        GPU0   GPU1   GPU2
  GPU0  X      NV6    PIX
  GPU1  NV6    X      NV2
  GPU2  PIX    NV2    X
"""


# -- hypothesis: node file -> fake NVML -> discovery -> the same node --------------------------
PCIE = list(Pcie)
