"""``nvplugin node capture``: the node file of this machine, read through NVML and sysfs.

Everything a node file can say is read, none of it guessed: each GPU's model, UUID, memory, bus
id and NUMA node, the PCIe relation of every pair -- also where NVLink joins them, which
``nvidia-smi topo -m`` hides -- the NVLinks of every pair and how many of each GPU's go into an
NVSwitch fabric, the NUMA distances and the CPUs. Discovery does the reading (the same code the
plugin runs, :meth:`nvplugin.node.nvml.Nvml.scan`); this module only writes it down, so a
capture of a simulated node gives back its node file's content.

Not captured: scripted health events (a node file's ``events``), and MIG devices (yet).
"""

from __future__ import annotations

from nvplugin.errors import InputError, NvpluginError
from nvplugin.node import open_node
from nvplugin.node.cpuspec import describe_layout
from nvplugin.node.model import Topology
from nvplugin.node.nodefile import parse_node
from nvplugin.node.writer import GpuDraft, NodeDraft, render


def capture(simulate: str | None = None, *, sysfs_root: str | None = None) -> str:
    """The node file of this machine (or of the simulated node ``simulate``), as text."""
    with open_node(simulate, sysfs_root=sysfs_root) as node:
        scan = node.scan
    origin = f"simulated node {simulate}" if simulate is not None else f"host {scan.topology.name}"
    return write_capture(scan.topology, scan.nvswitch_links, origin)


def write_capture(topology: Topology, nvswitch_links: tuple[int, ...], origin: str) -> str:
    """Node-file text for a discovered ``topology``; checked by reading it back."""
    form, cpu_note = describe_layout(topology.cpus, len(topology.numa_distances))
    gpus = []
    for gpu in topology.gpus:
        fields: list[tuple[str, object]] = [
            ("name", gpu.name),
            ("uuid", gpu.uuid),
            ("memory_mib", gpu.memory_mib),
            ("pci_bus_id", gpu.pci_bus_id),
            ("numa_node", gpu.numa_node),
        ]
        if nvswitch_links[gpu.index]:
            fields.append(("nvswitch_links", nvswitch_links[gpu.index]))
        gpus.append(GpuDraft(tuple(fields)))
    cells = tuple(
        tuple("X" if link is None else link.cell for link in row) for row in topology.links
    )
    notes: dict[str, list[str]] = {
        "": [
            f"Captured by `nvplugin node capture` from {origin} through NVML and sysfs. Cells "
            "give each pair's NVLinks and its PCIe relation, which nvidia-smi topo -m hides "
            "under NV<k>; CPU sockets and cores are numbered by their lowest CPU id."
        ]
    }
    if cpu_note:
        notes["cpus"] = [cpu_note]
    draft = NodeDraft(topology.name, tuple(gpus), cells, topology.numa_distances, form, notes)
    text = render(draft)
    try:
        parse_node(text, f"the node file captured from {origin}")
    except InputError as exc:
        raise NvpluginError(f"this node cannot be written as a node file: {exc}") from None
    return text
