"""The simple policy: must-include first, then the other available GPUs in index order."""

from __future__ import annotations

import pytest

from nvplugin.allocator import make_policy
from tests.support.topologies import DGX1_VOLTA


@pytest.mark.parametrize(
    ("available", "must", "size", "expected"),
    [
        ([0, 1, 2, 3, 4, 5, 6, 7], [], 3, [0, 1, 2]),
        ([7, 5, 3, 1], [], 2, [1, 3]),  # index order, whatever order the request lists
        ([0, 1, 2, 3, 4, 5, 6, 7], [6], 3, [0, 1, 6]),
        ([2, 4, 6], [6, 4], 2, [4, 6]),
        ([2, 4, 6], [6], 3, [2, 4, 6]),
        ([2, 4, 6], [], 4, []),  # more than available: empty answer
        ([2, 4, 6], [2, 4], 1, []),  # more must-include than size
        ([2, 4, 6], [], 0, []),
    ],
)
def test_simple_table(
    available: list[int], must: list[int], size: int, expected: list[int]
) -> None:
    assert make_policy("simple", DGX1_VOLTA).allocate(available, must, size) == expected


def test_simple_ignores_links() -> None:
    """Where best-effort picks the NV2+PIX pair, simple still takes the lowest indices."""
    assert make_policy("simple", DGX1_VOLTA).allocate(range(8), [], 2) == [0, 1]
    assert make_policy("best-effort", DGX1_VOLTA).allocate(range(8), [], 2) == [2, 3]
    assert make_policy("simple", DGX1_VOLTA).name == "simple"
