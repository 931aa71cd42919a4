"""The brute-force reference must itself be right: every partition, each exactly once."""

from __future__ import annotations

import math

import pytest

from tests.support.reference import partitions


@pytest.mark.parametrize(("n", "s"), [(n, s) for n in range(0, 9) for s in range(1, 5)])
def test_partitions_are_all_distinct_and_complete(n: int, s: int) -> None:
    items = tuple(range(n))
    q, r = divmod(n, s)
    expected = math.factorial(n) // (math.factorial(s) ** q * math.factorial(q) * math.factorial(r))
    seen = set()
    for groups, leftover in partitions(items, s):
        assert all(len(g) == s for g in groups) and len(groups) == q and len(leftover) == r
        assert sorted(i for g in (*groups, leftover) for i in g) == list(items)
        seen.add((frozenset(groups), leftover))
    assert len(seen) == expected
