"""The device manager's topology hints, and how a stored hint splits free devices (the kubelet's
``topology_hints.go`` and ``filterByAffinity``; docs/kubelet-behaviour.md#topology-hints,
docs/kubelet-behaviour.md#device-allocation).

Pure functions of what the device manager knows about one resource: each device's NUMA nodes
(from the plugin's last ListAndWatch message), what is free, held or reusable. The same rules
serve both scopes: the container scope asks per container with its reusable devices, the pod
scope with the pod's effective request and none.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

from nvplugin.fakekubelet.pods import Container
from nvplugin.fakekubelet.topologymanager.bitmask import BitMask
from nvplugin.fakekubelet.topologymanager.hints import generate_hints
from nvplugin.fakekubelet.topologymanager.policy import TopologyHint

NumaMap = Mapping[str, tuple[int, ...]]
"""Device ID -> its NUMA nodes (empty: the plugin gave none)."""


def has_topology_alignment(numa: NumaMap) -> bool:
    """A resource has alignment when at least one known device has a NUMA node."""
    return any(numa.values())


def resource_hints(
    numa: NumaMap,
    machine_nodes: Sequence[int],
    requested: int,
    allocated: frozenset[str],
    available: frozenset[str],
    reusable: frozenset[str],
) -> list[TopologyHint] | None:
    """One resource's hints: None without NUMA alignment ("don't care"); for devices already
    held, hints over them if the count still matches (else none: impossible); else hints over
    what is free plus reusable, none when that is too little."""
    if not has_topology_alignment(numa):
        return None
    if allocated:
        if len(allocated) != requested:
            return []
        return _hints(numa, machine_nodes, allocated, (), requested)
    if len(available | reusable) < requested:
        return []
    return _hints(numa, machine_nodes, available, reusable, requested)


def _hints(
    numa: NumaMap,
    machine_nodes: Sequence[int],
    available: Collection[str],
    reusable: Collection[str],
    request: int,
) -> list[TopologyHint]:
    known = dict(numa)
    for d in [*available, *reusable]:
        known.setdefault(d, ())  # held or reusable but gone from the snapshot: no NUMA
    return generate_hints(available, reusable, request, known, machine_nodes)


def device_requests(
    containers: Iterable[Container], is_device_resource: Callable[[str], bool]
) -> dict[str, int]:
    """Resource -> count for the containers' device-plugin resources (a later container's
    limit replaces an earlier one's, as the kubelet's loop does)."""
    out: dict[str, int] = {}
    for c in containers:
        for resource, quantity in c.limits.items():
            if is_device_resource(resource):
                out[resource] = quantity.int_value
    return out


def filter_by_affinity(
    ordered: Sequence[str], numa: NumaMap, mask: BitMask | None
) -> tuple[list[str], list[str], list[str]]:
    """Split ``ordered`` devices by a hint's NUMA mask: aligned, unaligned, no NUMA information.

    With no mask (a nil hint, or no alignment for the resource) everything is "no affinity".
    A device on several NUMA nodes is aligned when any of them is in the mask.
    """
    if mask is None:
        return [], [], list(ordered)
    aligned, unaligned, none = [], [], []
    for d in ordered:
        nodes = numa.get(d, ())
        if not nodes:
            none.append(d)
        elif any(mask.is_set(n) for n in nodes):
            aligned.append(d)
        else:
            unaligned.append(d)
    return aligned, unaligned, none
