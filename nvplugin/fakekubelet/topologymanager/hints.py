"""The one hint generator shared by the device manager and the CPU manager
(docs/kubelet-behaviour.md#topology-hints; the kubelet's ``generateDeviceTopologyHints`` and the
static CPU policy's ``generateCPUTopologyHints``, which are the same algorithm).

For every non-empty subset of the machine's NUMA nodes (smallest first, kubelet order) a
non-preferred hint is emitted when the subset can hold the request from the reusable items (all
of which must lie in it) plus the available items in it; afterwards every hint whose size equals
the smallest subset that could hold the request from *all known items* (free or not) becomes
preferred. "Preferred" is thus measured against capacity, not against what is free.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import TypeVar

from nvplugin.fakekubelet.topologymanager.bitmask import BitMask, iterate_bitmasks
from nvplugin.fakekubelet.topologymanager.policy import TopologyHint

ID = TypeVar("ID", bound=Hashable)


def generate_hints(
    available: Iterable[ID],
    reusable: Iterable[ID],
    request: int,
    all_devices_numa: Mapping[ID, Sequence[int] | None],
    numa_nodes: Sequence[int],
) -> list[TopologyHint]:
    """Hints for ``request`` items of one resource.

    ``all_devices_numa`` maps every known item (device ID or CPU id) to its NUMA nodes; None or
    empty means "no NUMA information": such an item never counts towards a mask, and a reusable
    one does not constrain the mask. ``available`` and ``reusable`` are subsets of its keys.
    """
    node_masks = {
        item: BitMask.of(*(nodes or ())).value for item, nodes in all_devices_numa.items()
    }
    # Items grouped by their node mask: counting per group keeps 8 nodes x 1000s of items cheap.
    capacity = _count_by_mask(node_masks.values())
    free = _count_by_mask(node_masks[item] for item in available)
    reuse_masks = [node_masks[item] for item in reusable]
    reuse_masks = [m for m in reuse_masks if m]

    min_affinity_size = len(numa_nodes)
    hints: list[TopologyHint] = []
    for mask in iterate_bitmasks(numa_nodes):
        m = mask.value
        size = mask.count()
        in_mask = sum(n for dev_mask, n in capacity.items() if dev_mask & m)
        if in_mask >= request and size < min_affinity_size:
            min_affinity_size = size
        if any(not r & m for r in reuse_masks):
            continue
        matching = len(reuse_masks) + sum(n for dev_mask, n in free.items() if dev_mask & m)
        if matching >= request:
            hints.append(TopologyHint(mask, False))
    return [
        TopologyHint(h.numa_affinity, True)
        if h.numa_affinity is not None and h.numa_affinity.count() == min_affinity_size
        else h
        for h in hints
    ]


def _count_by_mask(masks: Iterable[int]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for m in masks:
        if m:
            counts[m] = counts.get(m, 0) + 1
    return counts
