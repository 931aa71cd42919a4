"""The best groups a resource's free GPUs can still form: for each request size k up to 8, the
group the exact allocator (best-effort, what ``nvplugin preferred`` answers) would give a pod of
k GPUs now, its score (the sum of its pairs' scores, 0 for one GPU) and whether every pair in it
is NVLinked. An attribute no other producer has: a scheduler can prefer the node where a pod of
k GPUs still gets an NVLinked group, before the kubelet is asked.

The value is ``k:score:nvlinked`` for k = 1..min(8, free GPUs), comma-separated
(``1:0:1,2:250:1``): the attribute ``nvplugin.io/best-groups.<resource>``.
"""

from __future__ import annotations

from collections.abc import Sequence

from nvplugin.allocator import make_policy
from nvplugin.allocator.base import Policy
from nvplugin.node.model import Topology

ATTRIBUTE_PREFIX = "nvplugin.io/best-groups."
MAX_SIZE = 8
POLICY = "best-effort"


def attribute_name(resource: str) -> str:
    return ATTRIBUTE_PREFIX + resource


class BestGroups:
    """The allocator over one node's GPUs, made once (its precomputation is the costly part)."""

    def __init__(self, topology: Topology, policy: Policy | None = None) -> None:
        self.topology = topology
        self.policy = policy if policy is not None else make_policy(POLICY, topology)

    def group(self, free: Sequence[int], size: int) -> tuple[int, ...]:
        """The group a pod of ``size`` GPUs gets among ``free`` (GPU indices)."""
        return tuple(self.policy.allocate(sorted(free), [], size))

    def nvlinked(self, group: Sequence[int]) -> bool:
        return all(
            self.topology.link(a, b).nvlinks > 0
            for i, a in enumerate(group)
            for b in group[i + 1 :]
        )

    def value(self, free: Sequence[int]) -> str:
        """The attribute's value for these free GPUs ("" when none is free)."""
        parts = []
        for size in range(1, min(MAX_SIZE, len(free)) + 1):
            group = self.group(free, size)
            if len(group) != size:
                break
            score = self.topology.group_score(group)
            parts.append(f"{size}:{score}:{int(self.nvlinked(group))}")
        return ",".join(parts)
