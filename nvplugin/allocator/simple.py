"""The simple policy: must-include first, then the other available GPUs in index order.

It ignores how GPUs are wired. It exists for nodes where that does not matter (or is not
trusted), and as the baseline best-effort is measured against (``nvplugin preferred --policy
simple --explain`` shows what the partition would score). Over a resource's MIG devices it is the
same rule on their positions (parent index, then MIG index): the lowest first.
"""

from __future__ import annotations

from collections.abc import Sequence

from nvplugin.allocator.base import check_request


class Simple:
    """Must-include units, then the lowest other available ones, until ``size``; over ``units``
    units (a node's GPUs, or a resource's MIG devices)."""

    name = "simple"

    def __init__(self, units: int) -> None:
        self._gpus = units

    def allocate(
        self, available: Sequence[int], must_include: Sequence[int], size: int
    ) -> list[int]:
        request = check_request(self._gpus, available, must_include, size)
        if request.impossible:
            return []
        chosen = set(request.must_include)
        for gpu in request.available:
            if len(chosen) == request.size:
                break
            chosen.add(gpu)
        return sorted(chosen)
