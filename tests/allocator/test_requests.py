"""Malformed requests raise AllocationError naming the value; impossible ones answer []."""

from __future__ import annotations

import pytest

from nvplugin.allocator import (
    POLICIES,
    POLICY_NAMES,
    AllocationError,
    check_policy_name,
    explain_allocation,
    make_policy,
)
from nvplugin.errors import InputError
from tests.support.topologies import DGX1_VOLTA, EXAMPLE_4GPU


@pytest.mark.parametrize("policy", POLICY_NAMES)
@pytest.mark.parametrize(
    ("available", "must", "size", "message"),
    [
        ([0, 1, 2], [], -1, "size -1 is negative"),
        ([0, 1, 8], [], 2, "available: GPU index 8 out of range"),
        ([0, -1], [], 1, "available: GPU index -1 out of range"),
        ([0, 1, 1], [], 2, "available: GPU 1 listed twice"),
        ([0, 1, 2], [2, 2], 2, "must-include: GPU 2 listed twice"),
        ([0, 1, 2], [5], 2, "must-include GPU 5 is not available"),
        ([0, 1, 2], [9], 2, "must-include: GPU index 9 out of range"),
        ([0, "1"], [], 1, "available: '1' is not a GPU index"),
        ([0, True], [], 1, "available: True is not a GPU index"),
        # Malformed beats impossible: a bad index is reported even when size is 0.
        ([0, 1, 1], [], 0, "GPU 1 listed twice"),
    ],
)
def test_malformed_requests(
    policy: str, available: list[int], must: list[int], size: int, message: str
) -> None:
    with pytest.raises(AllocationError, match=message) as raised:
        make_policy(policy, DGX1_VOLTA).allocate(available, must, size)
    assert isinstance(raised.value, InputError)


@pytest.mark.parametrize("policy", POLICY_NAMES)
@pytest.mark.parametrize(
    ("available", "must", "size", "reason"),
    [
        ([0, 1, 2], [], 0, "size 0"),
        ([0, 1, 2], [], 4, "size 4 exceeds the 3 available"),
        ([], [], 1, "size 1 exceeds the 0 available"),
        ([0, 1, 2], [0, 1], 1, "2 must-include GPUs exceed size 1"),
    ],
)
def test_impossible_requests_answer_empty(
    policy: str, available: list[int], must: list[int], size: int, reason: str
) -> None:
    assert make_policy(policy, DGX1_VOLTA).allocate(available, must, size) == []
    explained = explain_allocation(policy, DGX1_VOLTA, available, must, size)
    assert explained.indices == () and explained.score is None
    assert reason in explained.reason


def test_unknown_policy() -> None:
    with pytest.raises(InputError, match="unknown allocation policy 'closest'"):
        make_policy("closest", DGX1_VOLTA)
    with pytest.raises(InputError, match=r"'closest'; have: best-effort, simple$"):
        check_policy_name("closest")


def test_every_policy_is_registered_once_by_name() -> None:
    """The names are the registry's, the default first; each makes its policy over GPUs."""
    assert POLICY_NAMES == tuple(POLICIES) == ("best-effort", "simple")
    for name in POLICIES:
        assert make_policy(name, DGX1_VOLTA).name == name


def test_explain_scores_simple_against_best_partition() -> None:
    """For simple, partition_score is the best partition containing simple's group."""
    explained = explain_allocation("simple", EXAMPLE_4GPU, [0, 1, 2, 3], [], 2)
    assert explained.policy == "simple"
    assert explained.indices == (0, 1)
    assert (explained.score, explained.partition_score) == (50, 100)
    assert explained.groups == ((0, 1), (2, 3))
    best = explain_allocation("best-effort", EXAMPLE_4GPU, [0, 1, 2, 3], [], 2)
    assert (best.indices, best.partition_score) == ((0, 3), 420)


def test_numpy_and_range_indices_are_accepted() -> None:
    import numpy as np

    policy = make_policy("best-effort", DGX1_VOLTA)
    assert policy.allocate(np.arange(8), np.array([6]), np.int64(2)) == [6, 7]
    assert policy.allocate(range(8), (), 2) == [2, 3]
