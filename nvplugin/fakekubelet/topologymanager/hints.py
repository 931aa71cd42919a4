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
from functools import lru_cache
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
    masks_of: dict[object, int] = {}
    node_masks: dict[ID, int] = {}
    for item, nodes in all_devices_numa.items():
        nodes_key = tuple(nodes or ())
        value = masks_of.get(nodes_key)
        if value is None:
            value = masks_of[nodes_key] = BitMask.of(*nodes_key).value
        node_masks[item] = value
    # Items grouped by their node mask: counting per group keeps 8 nodes x 1000s of items cheap.
    capacity = tuple(_count_by_mask(node_masks.values()).items())
    free = tuple(_count_by_mask(node_masks[item] for item in available).items())
    reuse_masks = [node_masks[item] for item in reusable]
    reuse_masks = [m for m in reuse_masks if m]
    reused = len(reuse_masks)

    min_affinity_size = len(numa_nodes)
    found: list[tuple[tuple[TopologyHint, TopologyHint], int]] = []
    if all(m & (m - 1) == 0 for m, _ in capacity):
        # Every item on one node: a subset's count is its lowest node's plus the rest's,
        # and the rest, a smaller subset, came earlier.
        per_node, free_per_node = dict(capacity), dict(free)
        in_masks, free_in_masks = {0: 0}, {0: 0}
        for m, size, hint in _subsets(tuple(numa_nodes)):
            rest = m & (m - 1)
            low = m ^ rest
            in_mask = in_masks[m] = in_masks[rest] + per_node.get(low, 0)
            matching = free_in_masks[m] = free_in_masks[rest] + free_per_node.get(low, 0)
            if size < min_affinity_size and in_mask >= request:
                min_affinity_size = size
            if reused and any(not r & m for r in reuse_masks):
                continue
            if matching + reused >= request:
                found.append((hint, size))
        return [hint[size == min_affinity_size] for hint, size in found]
    for m, size, hint in _subsets(tuple(numa_nodes)):
        # Subsets come smallest first: once one could hold the request, no later one is smaller.
        if size < min_affinity_size:
            in_mask = 0
            for dev_mask, n in capacity:
                if dev_mask & m:
                    in_mask += n
            if in_mask >= request:
                min_affinity_size = size
        if reused and any(not r & m for r in reuse_masks):
            continue
        matching = reused
        for dev_mask, n in free:
            if dev_mask & m:
                matching += n
        if matching >= request:
            found.append((hint, size))
    return [hint[size == min_affinity_size] for hint, size in found]


@lru_cache(maxsize=64)
def _subsets(
    numa_nodes: tuple[int, ...],
) -> tuple[tuple[int, int, tuple[TopologyHint, TopologyHint]], ...]:
    """Every non-empty subset of the nodes in the kubelet's order, as (mask value, size, its
    (non-preferred, preferred) hints); hints are immutable, so these are shared."""
    return tuple(
        (mask.value, mask.count(), (TopologyHint(mask, False), TopologyHint(mask, True)))
        for mask in iterate_bitmasks(numa_nodes)
    )


def _count_by_mask(masks: Iterable[int]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for m in masks:
        if m:
            counts[m] = counts.get(m, 0) + 1
    return counts
