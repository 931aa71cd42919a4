"""Renderings of a discovered node for ``nvplugin devices`` and ``nvplugin topo``.

``topo --output json`` is a contract other tools read::

    {"name": str,
     "gpus": [{"index", "uuid", "name", "memory_mib", "pci_bus_id", "numa_node", "mig"}],
     "pairs": [{"a": i, "b": j, "pcie": "SYS|NODE|PHB|PXB|PIX|INT", "nvlinks": k, "score": n}]}

with one entry per pair a < b (index order) and ``numa_node`` null when unknown. ``mig`` is null
when the GPU's MIG mode is off, else ``{"devices": [...]}`` (possibly empty), each device
``{"index", "uuid", "profile", "gpu_instance", "compute_instance", "memory_mib", "slices",
"placement": {"start", "size"}, "caps": {"gpu_instance", "compute_instance"} | null}`` in MIG
index order (``caps``: the ``/dev/nvidia-caps`` minors). Its NUMA node is the GPU's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from nvplugin.node.mig import mig_state
from nvplugin.node.model import Gpu, MigDevice, Topology, format_cpu_list

LEGEND = """Legend:
  X    = self
  SYS  = across CPU sockets (PCIe plus the SMP interconnect between NUMA nodes)
  NODE = same NUMA node, different PCIe host bridges
  PHB  = same PCIe host bridge
  PXB  = several PCIe switches, no host bridge
  PIX  = one PCIe switch
  INT  = same board
  NV#  = # NVLinks, direct or through NVSwitches (shown with the PCIe relation beneath them)"""


def gpu_dict(gpu: Gpu) -> dict[str, Any]:
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "name": gpu.name,
        "memory_mib": gpu.memory_mib,
        "pci_bus_id": gpu.pci_bus_id,
        "numa_node": gpu.numa_node,
        "mig": {"devices": [mig_dict(m) for m in gpu.mig_devices]} if gpu.mig_enabled else None,
    }


def mig_dict(device: MigDevice) -> dict[str, Any]:
    caps = device.caps
    return {
        "index": device.index,
        "uuid": device.uuid,
        "profile": device.profile,
        "gpu_instance": device.gpu_instance,
        "compute_instance": device.compute_instance,
        "memory_mib": device.memory_mib,
        "slices": device.slices,
        "placement": {"start": device.placement[0], "size": device.placement[1]},
        "caps": None
        if caps is None
        else {"gpu_instance": caps.gpu_instance, "compute_instance": caps.compute_instance},
    }


def topology_dict(topo: Topology) -> dict[str, Any]:
    """The ``topo --output json`` contract as a dict."""
    return {
        "name": topo.name,
        "gpus": [gpu_dict(g) for g in topo.gpus],
        "pairs": [
            {"a": a, "b": b, "pcie": link.pcie.name, "nvlinks": link.nvlinks, "score": link.score}
            for a, b, link in topo.pairs()
        ],
    }


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(line.rstrip() for line in lines)


def _numa(gpu: Gpu) -> str:
    return "N/A" if gpu.numa_node is None else str(gpu.numa_node)


def devices_table(
    topo: Topology,
    resources: Mapping[int, str] | None = None,
    mig_resources: Mapping[str, str] | None = None,
    health: Mapping[int, Mapping[str, str]] | None = None,
) -> str:
    """One row per GPU (a HEALTH column when ``health`` names a fault); with ``resources``
    (GPU index -> what it is served as, from ``devices --config``) a RESOURCE column too. On a
    node with MIG on anywhere, a MIG column and the MIG devices' table follow (with
    ``mig_resources``, ``<gpu>:<index>`` -> resource, their RESOURCE column)."""
    mig = any(g.mig_enabled for g in topo.gpus)
    header = ["INDEX", "UUID", "NAME", "MEMORY", "BUS ID", "NUMA"]
    header += ["MIG"] if mig else []
    rows = [header if resources is None else [*header, "RESOURCE"]]
    if health:
        rows[0] = [*rows[0], "HEALTH"]
    for g in topo.gpus:
        row = [str(g.index), g.uuid, g.name, f"{g.memory_mib} MiB", g.pci_bus_id, _numa(g)]
        if mig:
            row.append(f"on ({len(g.mig_devices)})" if g.mig_enabled else "off")
        if resources is not None:
            row.append(resources.get(g.index, "-"))
        if health:
            row.append("; ".join(health.get(g.index, {}).values()) or "ok")
        rows.append(row)
    return f"{_table(rows)}\n" + (f"\n{mig_table(topo, mig_resources)}" if mig else "")


def mig_table(topo: Topology, resources: Mapping[str, str] | None = None) -> str:
    """Every MIG device, by parent then MIG index: ``<gpu>:<index>`` (NVIDIA's index form), its
    profile, GPU and compute instance, placement (start:size in memory slices), memory, NUMA node
    (its parent's), UUID, and with ``resources`` what it is served as; a MIG-enabled GPU without
    MIG devices says so."""
    header = ["MIG DEVICE", "PROFILE", "GI", "CI", "PLACEMENT", "MEMORY", "NUMA", "UUID"]
    rows = [header if resources is None else [*header, "RESOURCE"]]
    empty = []
    for g in topo.gpus:
        if g.mig_enabled and not g.mig_devices:
            empty.append(f"GPU{g.index}: {mig_state(g)}")
        for m in g.mig_devices:
            start, size = m.placement
            row = [
                m.label,
                m.profile,
                str(m.gpu_instance),
                str(m.compute_instance),
                f"{start}:{size}",
                f"{m.memory_mib} MiB",
                _numa(g),
                m.uuid,
            ]
            if resources is not None:
                row.append(resources.get(m.label, "-"))
            rows.append(row)
    text = _table(rows) + "\n" if len(rows) > 1 else ""
    return text + "".join(f"{line}\n" for line in empty)


def devices_json(
    topo: Topology,
    resources: Mapping[int, str] | None = None,
    plan: Mapping[str, object] | None = None,
    mig_resources: Mapping[str, str] | None = None,
    health: Mapping[int, Mapping[str, str]] | None = None,
    cdi: Mapping[str, str] | None = None,
) -> str:
    """``{"name", "gpus": [...]}`` (a GPU with a fault: its ``health``, signal -> reason);
    with a config, each GPU's and MIG device's ``resource`` and
    the whole ``plan`` (served resources, sockets, replicas, warnings) as ``"resources"``."""
    gpus = []
    for g in topo.gpus:
        entry = gpu_dict(g)
        if resources is not None:
            entry["resource"] = resources.get(g.index)
        if mig_resources is not None and entry["mig"] is not None:
            for device in entry["mig"]["devices"]:
                device["resource"] = mig_resources.get(f"{g.index}:{device['index']}")
        if health and g.index in health:
            entry["health"] = dict(health[g.index])
        gpus.append(entry)
    data: dict[str, Any] = {"name": topo.name, "gpus": gpus}
    if plan is not None:
        data["resources"] = dict(plan)
    if cdi is not None:
        data["cdi"] = dict(cdi)
    return json.dumps(data, indent=2) + "\n"


def cdi_table(cdi: Mapping[str, str]) -> str:
    """Each served device's fully qualified CDI name, by its index form (``3``, ``3:1``)."""
    rows = [["DEVICE", "CDI NAME"], *([label, name] for label, name in cdi.items())]
    return _table(rows) + "\n"


def topology_json(topo: Topology) -> str:
    return json.dumps(topology_dict(topo), indent=2) + "\n"


def topology_matrix(topo: Topology) -> str:
    """The link matrix laid out like ``nvidia-smi topo -m``, then the pair scores."""
    n = len(topo)
    names = [f"GPU{i}" for i in range(n)]
    rows = [["", *names, "CPU Affinity", "NUMA Affinity"]]
    for i, gpu in enumerate(topo.gpus):
        cells = ["X" if link is None else link.cell for link in topo.links[i]]
        cpus = "N/A" if gpu.numa_node is None else format_cpu_list(topo.cpus.on_node(gpu.numa_node))
        rows.append([names[i], *cells, cpus or "N/A", _numa(gpu)])
    scores = [["", *names]]
    for i in range(n):
        scores.append([names[i], *("-" if i == j else str(topo.score(i, j)) for j in range(n))])
    mig = ""
    if any(g.mig_enabled for g in topo.gpus):
        mig = (
            f"\nMIG devices (no NVLink of their own; NUMA node = their GPU's):\n\n{mig_table(topo)}"
        )
    return (
        f"Node {topo.name}: {n} GPU(s)\n\n{_table(rows)}\n\n{LEGEND}\n\n"
        f"Pair scores (PCIe weight + 100 per NVLink):\n\n{_table(scores)}\n{mig}"
    )


def topology_mermaid(topo: Topology) -> str:
    """A Mermaid graph for GitHub markdown: GPUs grouped by NUMA node, NVLink edges labelled."""
    lines = ["```mermaid", "graph LR"]
    groups: dict[int | None, list[Gpu]] = {}
    for gpu in topo.gpus:
        groups.setdefault(gpu.numa_node, []).append(gpu)
    ordered = sorted(groups, key=lambda node: (node is None, node or 0))
    for node in ordered:
        ident = "numa_unknown" if node is None else f"numa{node}"
        title = "NUMA node unknown" if node is None else f"NUMA node {node}"
        lines.append(f'  subgraph {ident}["{title}"]')
        for gpu in groups[node]:
            label = f"GPU{gpu.index}<br/>{gpu.name}<br/>{gpu.pci_bus_id}"
            if gpu.mig_devices:
                label += f"<br/>MIG: {mig_state(gpu)}"
            elif gpu.mig_enabled:
                label += f"<br/>{mig_state(gpu)}"
            label = label.replace('"', "'")
            lines.append(f'    gpu{gpu.index}["{label}"]')
        lines.append("  end")
    for a, b, link in topo.pairs():
        if link.nvlinks:
            lines.append(f'  gpu{a} ---|"NV{link.nvlinks}"| gpu{b}')
    lines.append("```")
    return "\n".join(lines) + "\n"
