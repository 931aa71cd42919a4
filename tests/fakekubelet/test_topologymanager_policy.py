"""Merging and policies: docs/kubelet-behaviour.md#worked-examples (1-7) and the scenarios of
the upstream kubelet's policy tests, restated as data in the hint notation of
tests/support/hints.py.

Every case runs through both the fast merge and the kubelet's naive iteration."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from nvplugin.fakekubelet.topologymanager import (
    HintMerger,
    NumaInfo,
    PolicyOptions,
    ProviderHints,
    TopologyHint,
    new_policy,
)
from nvplugin.fakekubelet.topologymanager.policy import (
    filter_providers_hints,
    max_of_min_affinity_counts,
    merge_permutation,
)
from tests.support.hints import h, hs, show

TWO = NumaInfo.from_distances([[10, 11], [11, 10]])
FOUR = NumaInfo.from_distances(
    [[10, 11, 12, 12], [11, 10, 12, 12], [12, 12, 10, 11], [12, 12, 11, 10]]
)
# The upstream tests' eight-node machine: two groups of four, far apart (not quite symmetric).
EIGHT = NumaInfo.from_distances(
    [
        [10, 11, 12, 12, 30, 30, 30, 30],
        [11, 10, 12, 12, 30, 30, 30, 30],
        [12, 12, 10, 11, 30, 30, 30, 30],
        [12, 12, 11, 10, 30, 30, 30, 30],
        [30, 30, 30, 30, 10, 11, 12, 12],
        [30, 30, 30, 30, 11, 10, 12, 12],
        [30, 30, 30, 30, 12, 12, 10, 11],
        [30, 30, 30, 30, 12, 12, 13, 10],
    ]
)
CLOSEST = PolicyOptions(prefer_closest_numa=True)


def providers(*answers: Mapping[str, Sequence[str] | None] | None) -> list[ProviderHints]:
    """Provider answers with hints written in notation."""
    return [
        None if answer is None else {r: None if v is None else hs(*v) for r, v in answer.items()}
        for answer in answers
    ]


def merge(
    policy: str,
    numa: NumaInfo,
    provider_hints: list[ProviderHints],
    options: PolicyOptions | None = None,
) -> tuple[str, bool]:
    fast, admit = new_policy(policy, numa, options).merge(provider_hints)
    naive, admit_naive = new_policy(policy, numa, options, naive=True).merge(provider_hints)
    assert (fast, admit) == (naive, admit_naive)
    return show(fast), admit


# --- docs/kubelet-behaviour.md#worked-examples, merge examples 1-7 ---


def test_example_1_same_single_node() -> None:
    p = providers({"r1": ["0P"]}, {"r2": ["0P"]})
    assert merge("best-effort", TWO, p) == ("0P", True)


def test_example_2_common_node() -> None:
    p = providers({"r1": ["0P", "1P"]}, {"r2": ["1P"]})
    assert merge("best-effort", TWO, p) == ("1P", True)


def test_example_3_preferred_beats_wider() -> None:
    p = providers({"r1": ["1P", "0,1N"]}, {"r2": ["0P", "1P", "0,1N"]})
    assert merge("best-effort", TWO, p) == ("1P", True)


def test_example_4_no_common_node() -> None:
    p = providers({"r1": ["0P"]}, {"r2": ["1P"]})
    assert merge("best-effort", TWO, p) == ("0,1N", True)
    assert merge("restricted", TWO, p) == ("0,1N", False)
    assert merge("single-numa-node", TWO, p) == ("nilN", False)


def test_example_5_different_masks_are_not_preferred() -> None:
    p = providers({"r1": ["0P"]}, {"r2": ["0,1P"]})
    assert merge("best-effort", TWO, p) == ("0N", True)


def test_example_6_no_providers() -> None:
    assert merge("best-effort", TWO, []) == ("0,1P", True)
    assert merge("single-numa-node", TWO, []) == ("nilP", True)


def test_example_7_non_preferred_count_rule_and_closest_nodes() -> None:
    p = providers({"r1": ["0,1,2,3N", "0,1N"]}, {"r2": ["1,2N", "2,3N"]})
    assert merge("best-effort", FOUR, p) == ("1,2N", True)
    assert merge("best-effort", FOUR, p, CLOSEST) == ("2,3N", True)
    # Never by distance under single-numa-node (and these hints are all filtered out there).
    assert merge("single-numa-node", FOUR, p, CLOSEST) == ("nilN", False)


# --- upstream policy tests, restated ---

COMMON = [
    # (what, providers, result for best-effort / restricted)
    ("same mask, both preferred (node 0)", [{"r1": ["0P"]}, {"r2": ["0P"]}], "0P"),
    ("same mask, both preferred (node 1)", [{"r1": ["1P"]}, {"r2": ["1P"]}], "1P"),
    ("a provider without hints (node 0)", [{}, {"r": ["0P"]}], "0P"),
    ("a provider without hints (node 1)", [{}, {"r": ["1P"]}], "1P"),
    ("two hints against one (node 0)", [{"r1": ["0P", "1P"]}, {"r2": ["0P"]}], "0P"),
    ("two hints against one (node 1)", [{"r1": ["0P", "1P"]}, {"r2": ["1P"]}], "1P"),
    ("narrower preferred common to both", [{"r1": ["0P", "1P"]}, {"r2": ["0P", "0,1N"]}], "0P"),
    (
        "a less narrow preferred beats a narrower non-preferred",
        [{"r1": ["1P", "0,1N"]}, {"r2": ["0P", "1P", "0,1N"]}],
        "1P",
    ),
    (
        "two resources of one provider",
        [{"r1": ["1P", "0,1N"], "r2": ["0P", "1P", "0,1N"]}],
        "1P",
    ),
]

BEST_EFFORT_ONLY = [
    (
        "same masks with different bits",
        [{"r1": ["0,1P", "0,2P"]}, {"r2": ["0,1P", "0,2P"]}],
        "0,1P",
    ),
    ("no providers", [], "0,1,2,3P"),
    ("a provider answering {}", [{}], "0,1,2,3P"),
    ("a provider answering None", [None], "0,1,2,3P"),
    ("a resource answering nil", [{"r": None}], "0,1,2,3P"),
    ("a resource answering []", [{"r": []}], "0,1,2,3N"),
    ("a single nil preferred hint", [{"r": ["nilP"]}], "0,1,2,3P"),
    ("a single nil non-preferred hint", [{"r": ["nilN"]}], "0,1,2,3N"),
    ("no common mask", [{"r1": ["0P"]}, {"r2": ["1P"]}], "0,1,2,3N"),
    ("same mask, one not preferred (node 0)", [{"r1": ["0P"]}, {"r2": ["0N"]}], "0N"),
    ("same mask, one not preferred (node 1)", [{"r1": ["1P"]}, {"r2": ["1N"]}], "1N"),
    ("one wider mask, both preferred (node 0)", [{"r1": ["0P"]}, {"r2": ["0,1P"]}], "0N"),
    ("one wider mask, both preferred (node 1)", [{"r1": ["1P"]}, {"r2": ["0,1P"]}], "1N"),
    ("two hints against one non-preferred", [{"r1": ["0P", "1P"]}, {"r2": ["0,1N"]}], "0N"),
    ("B count (1)", [{"r1": ["0,1,2,3N", "0,1N"]}, {"r2": ["0,1N"]}], "0,1N"),
    ("B count (2)", [{"r1": ["0,1,2,3N", "0,1N"]}, {"r2": ["0,3N"]}], "0,3N"),
    ("B count (3)", [{"r1": ["0,1,2,3N", "0,1N"]}, {"r2": ["1,2N"]}], "1,2N"),
    ("B count (4)", [{"r1": ["0,1,2,3N", "0,1N"]}, {"r2": ["2,3N"]}], "2,3N"),
    ("B count (5)", [{"r1": ["0,1,2,3N", "0,1N"]}, {"r2": ["1,2N", "2,3N"]}], "1,2N"),
    (
        "B count (6)",
        [{"r1": ["0,1,2,3N", "0,1N"]}, {"r2": ["1,2,3N", "1,2N", "1,3N", "2,3N"]}],
        "1,2N",
    ),
]

CLOSEST_CASES = [
    # (what, machine, providers, result with prefer-closest-numa-nodes)
    (
        "equal width: the closer pair",
        EIGHT,
        [{"r1": ["0,4P", "0,2P"]}, {"r2": ["0,4P", "0,2P"]}],
        "0,2P",
    ),
    (
        "narrower still wins over closer",
        EIGHT,
        [{"r1": ["4P", "0,2P"]}, {"r2": ["4P", "0,2P"]}],
        "4P",
    ),
    ("B count (5)", FOUR, [{"r1": ["0,1,2,3N", "0,1N"]}, {"r2": ["1,2N", "2,3N"]}], "2,3N"),
    (
        "B count (6)",
        FOUR,
        [{"r1": ["0,1,2,3N", "0,1N"]}, {"r2": ["1,2,3N", "1,2N", "1,3N", "2,3N"]}],
        "2,3N",
    ),
]

SINGLE_NUMA_NODE = [
    ("no providers", [], "nilP"),
    ("a provider answering {}", [{}], "nilP"),
    ("a resource answering nil", [{"r": None}], "nilP"),
    ("a resource answering []", [{"r": []}], "nilN"),
    ("a single nil preferred hint", [{"r": ["nilP"]}], "nilP"),
    ("a single nil non-preferred hint", [{"r": ["nilN"]}], "nilN"),
    ("no common mask", [{"r1": ["0P"]}, {"r2": ["1P"]}], "nilN"),
    ("same mask, one not preferred (node 0)", [{"r1": ["0P"]}, {"r2": ["0N"]}], "nilN"),
    ("same mask, one not preferred (node 1)", [{"r1": ["1P"]}, {"r2": ["1N"]}], "nilN"),
    ("two hints against one non-preferred", [{"r1": ["0P", "1P"]}, {"r2": ["0,1N"]}], "nilN"),
    (
        "a two-node preferred hint is dropped",
        [{"r1": ["0,1P"], "r2": ["0P", "1P", "0,1N"]}],
        "nilN",
    ),
    ("a no-preference provider", [{"r1": ["0P", "1P", "0,1N"]}, None], "0P"),
]


@pytest.mark.parametrize(("what", "answers", "expected"), COMMON, ids=[c[0] for c in COMMON])
@pytest.mark.parametrize("policy", ["best-effort", "restricted"])
def test_common_cases(
    what: str, answers: list[dict[str, list[str]]], expected: str, policy: str
) -> None:
    hint, admit = merge(policy, TWO, providers(*answers))
    assert hint == expected
    assert admit


@pytest.mark.parametrize(("what", "answers", "expected"), COMMON, ids=[c[0] for c in COMMON])
def test_common_cases_single_numa_node(
    what: str, answers: list[dict[str, list[str]]], expected: str
) -> None:
    # Every common case resolves to one preferred node, which single-numa-node keeps as is.
    assert merge("single-numa-node", TWO, providers(*answers)) == (expected, True)


@pytest.mark.parametrize(
    ("what", "answers", "expected"), BEST_EFFORT_ONLY, ids=[c[0] for c in BEST_EFFORT_ONLY]
)
def test_best_effort_and_restricted(
    what: str, answers: list[Mapping[str, Sequence[str] | None] | None], expected: str
) -> None:
    p = providers(*answers)
    assert merge("best-effort", FOUR, p) == (expected, True)
    assert merge("restricted", FOUR, p) == (expected, expected.endswith("P"))


@pytest.mark.parametrize(
    ("what", "numa", "answers", "expected"), CLOSEST_CASES, ids=[c[0] for c in CLOSEST_CASES]
)
def test_prefer_closest_numa_nodes(
    what: str,
    numa: NumaInfo,
    answers: list[Mapping[str, Sequence[str] | None] | None],
    expected: str,
) -> None:
    assert merge("best-effort", numa, providers(*answers), CLOSEST)[0] == expected


@pytest.mark.parametrize(
    ("what", "answers", "expected"), SINGLE_NUMA_NODE, ids=[c[0] for c in SINGLE_NUMA_NODE]
)
def test_single_numa_node(
    what: str, answers: list[Mapping[str, Sequence[str] | None] | None], expected: str
) -> None:
    assert merge("single-numa-node", TWO, providers(*answers)) == (expected, expected.endswith("P"))


def test_none_policy_admits_without_merging() -> None:
    hint, admit = new_policy("none", TWO).merge(providers({"r1": ["0P"]}, {"r2": ["1P"]}))
    assert (hint, admit) == (TopologyHint(None, False), True)


# --- pieces ---


def test_filtering_keeps_provider_then_resource_order() -> None:
    answers = providers({"a": ["0P"], "b": None, "c": []}, None, {})
    assert [[show(x) for x in hints] for hints in filter_providers_hints(answers)] == [
        ["0P"],
        ["nilP"],
        ["nilN"],
        ["nilP"],
        ["nilP"],
    ]


def test_merge_permutation() -> None:
    default = TWO.default_affinity
    assert show(merge_permutation(default, hs("nilP", "0P", "0P"))) == "0P"
    assert show(merge_permutation(default, hs("nilP", "0P", "0,1P"))) == "0N"
    assert show(merge_permutation(default, hs("nilN", "1P"))) == "1N"
    assert show(merge_permutation(default, hs("0P", "1P"))) == "-N"
    assert show(merge_permutation(default, [])) == "0,1P"


@pytest.mark.parametrize(
    ("lists", "expected"),
    [
        ([], 0),
        ([["-P"]], 0),
        ([["0P"]], 1),
        ([["0,1P"]], 2),
        ([["0,1P", "0,1,2P"]], 2),
        ([["0,1P", "0,1,2P"], ["0,1,2P"]], 3),
        ([["0,1P", "0,1,2P"], ["0,1,2P", "0,1,2,3P"]], 3),
        ([["nilP"], ["nilN", "2N"]], 1),
    ],
)
def test_max_of_min_affinity_counts(lists: list[list[str]], expected: int) -> None:
    assert max_of_min_affinity_counts([hs(*x) for x in lists]) == expected


COMPARE = [
    # (B, current or None, candidate, winner)
    (-1, None, "-N", "current"),
    (-1, "-P", "-N", "current"),
    (-1, None, "0P", "candidate"),
    (-1, None, "0N", "candidate"),
    (-1, "0N", "0P", "candidate"),
    (-1, "0P", "0N", "current"),
    (-1, "0P", "0P", "current"),
    (-1, "0,1P", "0P", "candidate"),
    (-1, "0P", "0,1P", "current"),
    (1, "0,1N", "0,1N", "current"),
    (1, "1,2N", "0,1N", "candidate"),
    (1, "0,1N", "1,2N", "current"),
    (2, "0,1N", "0N", "current"),
    (2, "0,1N", "0,1N", "current"),
    (2, "1,2N", "0,1N", "candidate"),
    (2, "0,1N", "1,2N", "current"),
    (2, "0N", "0,1,2N", "current"),
    (2, "0N", "0,1N", "candidate"),
    (3, "0N", "0,1N", "candidate"),
    (3, "0N", "1,2N", "candidate"),
    (4, "0,1N", "1,2,3N", "candidate"),
    (4, "1,2,3N", "0,1N", "current"),
    (4, "0,1,2N", "0,1,2N", "current"),
    (4, "0,1,2N", "1,2,3N", "current"),
    (4, "1,2,3N", "0,1,2N", "candidate"),
]


@pytest.mark.parametrize(("bound", "current", "candidate", "winner"), COMPARE)
def test_compare(bound: int, current: str | None, candidate: str, winner: str) -> None:
    merger = HintMerger(NumaInfo(()), [], "best-effort", PolicyOptions())
    merger.best_non_preferred_count = bound
    cur = None if current is None else h(current)
    cand = h(candidate)
    result = merger.compare(cur, cand)
    assert result is (cur if winner == "current" else cand)
