"""The simple policy: must-include first, then the other available GPUs in index order.

It ignores how GPUs are wired. It exists for nodes where that does not matter (or is not
trusted), and as the baseline best-effort is measured against (``nvplugin preferred --policy
simple --explain`` shows what the partition would score).
"""

from __future__ import annotations

from collections.abc import Sequence

from nvplugin.allocator.base import check_request
from nvplugin.node.model import Topology


class Simple:
    """Must-include GPUs, then the lowest-indexed other available ones, until ``size``."""

    name = "simple"

    def __init__(self, topology: Topology) -> None:
        self._gpus = len(topology)

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
