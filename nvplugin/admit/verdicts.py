"""What ``nvplugin admit`` prints: a table for people (one row per container, a rejected pod's
reason under its row, notes at the end) or JSON (one object per pod)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from nvplugin.admit.admission import AdmitReport
from nvplugin.fakekubelet.cpumanager import parse_cpu_list
from nvplugin.node.model import Topology, format_cpu_list


def to_json(report: AdmitReport) -> str:
    return json.dumps(report.as_json(), indent=2)


def format_gpus(topology: Topology, indices: Sequence[int], mig: Sequence[str] = ()) -> str:
    """GPU indices grouped by NUMA node: ``0,1 (NUMA 3)``, ``2 (NUMA 1), 4 (NUMA 7)``; then MIG
    devices (``<gpu>:<mig index>``) likewise: ``MIG 2:2,2:3 (NUMA 1)``. Parents of ``mig`` are
    not listed as GPUs of their own."""
    parents = {int(label.split(":")[0]) for label in mig}
    whole = _by_numa(topology, [(str(i), i) for i in sorted(indices) if i not in parents])
    devices = _by_numa(topology, [(label, int(label.split(":")[0])) for label in mig])
    if devices:
        devices[0] = f"MIG {devices[0]}"
    return ", ".join(whole + devices) or "-"


def _by_numa(topology: Topology, items: Sequence[tuple[str, int]]) -> list[str]:
    """Labels (each with its GPU) grouped by consecutive NUMA node: ``0,1 (NUMA 3)``."""
    groups: list[tuple[int | None, list[str]]] = []
    for label, gpu in items:
        node = topology.gpus[gpu].numa_node
        if groups and groups[-1][0] == node:
            groups[-1][1].append(label)
        else:
            groups.append((node, [label]))
    return [
        ",".join(labels) + (f" (NUMA {node})" if node is not None else " (no NUMA)")
        for node, labels in groups
    ]


def summary_line(report: AdmitReport) -> str:
    s = report.settings
    topo = report.topology
    node = s.simulate or topo.name
    cpu = s.cpu_manager_policy
    if s.reserved_cpus:
        cpu += f" (reserved {format_cpu_list(parse_cpu_list(s.reserved_cpus))})"
    return (
        f"node {node}: {len(topo.gpus)} GPUs, {len(topo.numa_nodes)} NUMA nodes, "
        f"{len(topo.cpus.cpus)} CPUs; topology manager {s.topology_manager_policy} "
        f"(scope {s.topology_manager_scope}); CPU manager {cpu}"
    )


def to_table(report: AdmitReport) -> str:
    """For people: one row per container; a rejected pod's reason under its row."""
    header = ("POD", "CONTAINER", "RESULT", "GPUS", "CPUS", "NUMA")
    rows: list[tuple[str, ...]] = []
    reasons: dict[int, str] = {}
    for result in report.results:
        if not result.admitted:
            names = ",".join(c.name for c in result.containers) or "-"
            rows.append((result.pod, names, "rejected", "-", "-", "-"))
            reasons[len(rows) - 1] = f"{result.reason}: {result.message}"
            continue
        for i, c in enumerate(result.containers):
            numa = "-" if c.numa_nodes is None else ",".join(map(str, c.numa_nodes))
            rows.append(
                (
                    result.pod if i == 0 else "",
                    c.name,
                    "admitted" if i == 0 else "",
                    format_gpus(report.topology, c.gpu_indices, c.mig_devices)
                    + ("" if c.mps is None else f", {c.mps.label()}"),
                    format_cpu_list(c.cpus) or "shared",
                    numa,
                )
            )
    widths = [max(len(r[k]) for r in [header, *rows]) for k in range(len(header))]

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    out = [summary_line(report), "", line(header)]
    for n, row in enumerate(rows):
        out.append(line(row))
        if n in reasons:
            out.append(f"  -> {reasons[n]}")
    admitted = sum(r.admitted for r in report.results)
    out.append("")
    out.append(f"{admitted} of {len(report.results)} pods admitted")
    for note in report.notes:
        out.append(f"note: {note}")
    return "\n".join(out) + "\n"
