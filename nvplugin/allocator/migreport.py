"""What ``nvplugin preferred`` reads and prints for a MIG resource: MIG device IDs in (MIG UUIDs
or NVIDIA's ``<gpu>:<mig index>``), the resource policy's answer out, with each device's parent
GPU and NUMA node -- what the plugin answers the kubelet for that resource.

The GPU policies' report (:mod:`nvplugin.allocator.report`) scores NVLink groups; MIG devices
have no NVLink, so this one says where the answer sits instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nvplugin.errors import InputError
from nvplugin.node.model import MigDevice, Topology


def resolve_mig_ids(
    devices: Sequence[MigDevice], text: str, option: str, resource: str
) -> tuple[int, ...]:
    """Comma-separated MIG UUIDs or ``<gpu>:<mig index>`` labels -> positions in ``devices``,
    in the order given; :class:`InputError` naming the ID for one not in the resource, or named
    twice."""
    if not text.strip():
        return ()
    position = {d.uuid: n for n, d in enumerate(devices)}
    position.update({d.label: n for n, d in enumerate(devices)})
    seen: dict[int, str] = {}
    for raw in text.split(","):
        token = raw.strip()
        if not token:
            raise InputError(f"{option}: empty device ID in {text!r}")
        found = position.get(token)
        if found is None:
            raise InputError(
                f"{option}: {token!r} is not a MIG device of {resource} (MIG UUIDs or "
                f"<gpu>:<mig index>, e.g. {devices[0].label})"
            )
        if found in seen:
            raise InputError(f"{option}: MIG device {devices[found].label} given twice")
        seen[found] = token
    return tuple(seen)


def check_mig_must_include(
    devices: Sequence[MigDevice], available: Sequence[int], must_include: Sequence[int]
) -> None:
    for position in must_include:
        if position not in available:
            raise InputError(
                f"--must-include: MIG device {devices[position].label} is not in --available"
            )


def _rows(
    topology: Topology, devices: Sequence[MigDevice], answer: Sequence[int]
) -> list[dict[str, Any]]:
    rows = []
    for position in answer:
        device = devices[position]
        rows.append(
            {
                "mig_device": device.label,
                "uuid": device.uuid,
                "profile": device.profile,
                "gpu": device.parent,
                "numa_node": topology.gpus[device.parent].numa_node,
            }
        )
    return rows


def mig_to_json(
    topology: Topology,
    devices: Sequence[MigDevice],
    answer: Sequence[int],
    resource: str,
    policy: str,
) -> dict[str, Any]:
    """``{"resource", "devices": [uuids], "mig_devices": [labels], "gpus", "numa_nodes",
    "policy"}`` (the MIG policy is ``mig``)."""
    rows = _rows(topology, devices, answer)
    return {
        "resource": resource,
        "devices": [row["uuid"] for row in rows],
        "mig_devices": [row["mig_device"] for row in rows],
        "gpus": sorted({row["gpu"] for row in rows}),
        "numa_nodes": sorted({row["numa_node"] for row in rows if row["numa_node"] is not None}),
        "policy": policy,
    }


def mig_to_text(
    topology: Topology,
    devices: Sequence[MigDevice],
    answer: Sequence[int],
    resource: str,
    size: int,
    policy: str,
) -> str:
    """One line with the answer, then one line per MIG device."""
    if not answer:
        return (
            f"{resource}: no preferred allocation of {size} (impossible request: the kubelet "
            "chooses on its own)"
        )
    rows = _rows(topology, devices, answer)
    gpus = sorted({row["gpu"] for row in rows})
    where = f"GPU {gpus[0]}" if len(gpus) == 1 else f"GPUs {', '.join(map(str, gpus))}"
    lines = [
        f"{resource}: {', '.join(row['mig_device'] for row in rows)} "
        f"({len(rows)} MIG device(s) on {where}; policy {policy})"
    ]
    for row in rows:
        numa = "N/A" if row["numa_node"] is None else row["numa_node"]
        lines.append(
            f"  {row['mig_device']:<6} {row['profile']:<10} {row['uuid']}  GPU {row['gpu']}, "
            f"NUMA {numa}"
        )
    return "\n".join(lines)
