"""Preferred allocation among MIG devices: keep a pod's devices together, and whole GPUs free.

MIG devices share no NVLink (a MIG device has neither NVLink nor peer-to-peer access), so the
link scores the GPU policies maximise mean nothing here. What matters is where the devices sit:

1. on as few parent GPUs as possible (one, when it can);
2. then on parents spanning as few NUMA nodes as possible (the kubelet's topology manager has
   already narrowed ``available`` to the NUMA nodes it allows; this keeps the rest together);
3. then breaking as few untouched parents as possible: a parent all of whose devices (of this
   resource) are free stays free for a pod that needs the whole GPU's worth, so partly used
   parents go first;
4. then the tightest fit: the chosen parents keep as few free devices as possible;
5. ties: the lowest parent indices; within a parent its lowest devices, the parents with the
   fewest free devices filled first.

The policy is made once per resource from its devices (each with its parent GPU and NUMA node);
a request is then a search: the fewest parents follows from the free counts, the fewest NUMA
nodes from trying NUMA sets by size, and within those sets only parent *groups* are enumerated
(parents alike in NUMA node, free count and untouchedness are interchangeable, so only how many
of each to take matters). That is exact and small on real nodes; beyond :data:`MAX_CANDIDATES`
candidates the parents are taken greedily in the order of the rules above (rule 1 and 2 still
hold).

Same contract as the GPU policies (:class:`nvplugin.allocator.base.Policy`): positions into the
device list, ascending; ``[]`` for impossible requests; AllocationError for malformed ones.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from nvplugin.allocator.base import check_request
from nvplugin.node.model import MigDevice, Topology

MAX_CANDIDATES = 20000
"""Most parent combinations one request enumerates before falling back to the greedy order."""


@dataclass(frozen=True, slots=True)
class _Parent:
    """A parent GPU as one request sees it."""

    index: int
    numa: int | None
    free: tuple[int, ...]  # available positions on it, ascending
    total: int  # its devices in this resource

    @property
    def untouched(self) -> bool:
        return len(self.free) == self.total


class MigPolicy:
    """Preferred allocation over one resource's MIG devices (see the module docstring)."""

    name = "mig"

    def __init__(self, topology: Topology, devices: Sequence[MigDevice]) -> None:
        self._devices = tuple(devices)
        self._parent = tuple(device.parent for device in self._devices)
        self._numa = {gpu.index: gpu.numa_node for gpu in topology.gpus}
        self._totals: dict[int, int] = {}
        for parent in self._parent:
            self._totals[parent] = self._totals.get(parent, 0) + 1

    @property
    def devices(self) -> tuple[MigDevice, ...]:
        return self._devices

    def allocate(
        self, available: Sequence[int], must_include: Sequence[int], size: int
    ) -> list[int]:
        request = check_request(len(self._devices), available, must_include, size)
        if request.impossible:
            return []
        free: dict[int, list[int]] = {}
        for position in request.available:
            free.setdefault(self._parent[position], []).append(position)
        parents = [
            _Parent(p, self._numa.get(p), tuple(f), self._totals[p])
            for p, f in sorted(free.items())
        ]
        forced = {self._parent[position] for position in request.must_include}
        chosen = self._choose(parents, forced, request.size)
        return self._fill(chosen, request.must_include, request.size)

    # --- which parents ---

    def _choose(self, parents: list[_Parent], forced: set[int], size: int) -> list[_Parent]:
        fixed = [p for p in parents if p.index in forced]
        others = [p for p in parents if p.index not in forced]
        need = size - sum(len(p.free) for p in fixed)
        if need <= 0:
            return fixed
        # The fewest extra parents that can hold the rest: the largest first.
        extra = _fewest(others, need)
        assert extra is not None, "a possible request has room for its size"
        # Then the fewest NUMA nodes: try NUMA sets by size; the first size where some pick fits
        # is the optimum, and every pick that fits at that size spans exactly that set.
        fixed_numa = {p.numa for p in fixed}
        spare = sorted({p.numa for p in others} - fixed_numa, key=_numa_order)
        for more in range(len(spare) + 1):
            pools = []
            for numa in itertools.combinations(spare, more):
                allowed = fixed_numa | set(numa)
                pool = [p for p in others if p.numa in allowed]
                if _fewest(pool, need) == extra:
                    pools.append(_groups(pool))
            if pools:
                break
        if sum(_combinations(groups, extra) for groups in pools) > MAX_CANDIDATES:
            # greedy within the first NUMA set: the largest first (rules 1 and 2 hold), ties
            # in the rules' order
            ranked = sorted(
                (p for group in pools[0] for p in group),
                key=lambda p: (-len(p.free), _key([*fixed, p])),
            )
            pick: list[_Parent] = []
            for parent in ranked:
                if sum(len(p.free) for p in pick) >= need:
                    break
                pick.append(parent)
            return fixed + pick
        best: tuple[object, ...] | None = None
        best_pick: list[_Parent] = []
        for groups in pools:
            for pick in _picks(groups, extra):
                if sum(len(p.free) for p in pick) < need:
                    continue
                key = _key(fixed + pick)
                if best is None or key < best:
                    best, best_pick = key, pick
        return fixed + best_pick

    # --- which devices on them ---

    def _fill(self, chosen: list[_Parent], must: Sequence[int], size: int) -> list[int]:
        picked = set(must)
        for parent in sorted(chosen, key=lambda p: (len(p.free), p.index)):
            for position in parent.free:
                if len(picked) == size:
                    break
                picked.add(position)
        return sorted(picked)


def _fewest(parents: Sequence[_Parent], need: int) -> int | None:
    """The fewest of ``parents`` that hold ``need`` devices (largest first); None if all can't."""
    held = 0
    for count, free in enumerate(sorted((len(p.free) for p in parents), reverse=True), 1):
        held += free
        if held >= need:
            return count
    return None


def _numa_order(numa: int | None) -> tuple[bool, int]:
    return numa is None, numa or 0


def _key(parents: Sequence[_Parent]) -> tuple[object, ...]:
    """The rules of the module docstring as one sort key (smaller is better)."""
    numa = {p.numa for p in parents}
    return (
        len(parents),
        len(numa),
        sum(1 for p in parents if p.untouched),
        sum(len(p.free) for p in parents),
        sorted(p.index for p in parents),
    )


def _groups(parents: Sequence[_Parent]) -> list[list[_Parent]]:
    """Interchangeable parents (same NUMA node, free count and untouchedness), each group in
    index order: taking ``k`` of a group always means its first ``k``."""
    groups: dict[tuple[object, ...], list[_Parent]] = {}
    for parent in parents:
        groups.setdefault((parent.numa, len(parent.free), parent.untouched), []).append(parent)
    return list(groups.values())


def _combinations(groups: Sequence[Sequence[_Parent]], k: int) -> int:
    """How many group-count vectors choose ``k`` parents (an upper bound is enough)."""
    return math.comb(k + len(groups) - 1, len(groups) - 1) if groups else 0


def _picks(groups: Sequence[Sequence[_Parent]], k: int) -> Iterator[list[_Parent]]:
    """Every way to take ``k`` parents: the first ``c_i`` of each group, with sum c_i = k."""

    def counts(i: int, left: int) -> Iterator[tuple[int, ...]]:
        if i == len(groups) - 1:
            if left <= len(groups[i]):
                yield (left,)
            return
        for c in range(min(left, len(groups[i])) + 1):
            for rest in counts(i + 1, left - c):
                yield (c, *rest)

    for vector in counts(0, k):
        yield [parent for group, c in zip(groups, vector, strict=True) for parent in group[:c]]
