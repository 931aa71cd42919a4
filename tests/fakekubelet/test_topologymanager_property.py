"""Property tests: the fast merge equals the kubelet's naive cross-product merge, exactly.

Random machines of 1-4 NUMA nodes (with random distances), up to 3 providers each answering
nothing / nil / [] / random hints (nil, empty and out-of-machine masks included), every policy,
with and without prefer-closest-numa-nodes. A second property shows why Go's random map order
cannot matter: the naive merge is the same however lists and hints are ordered."""

from __future__ import annotations

import random

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from nvplugin.fakekubelet.topologymanager import (
    BitMask,
    HintMerger,
    NumaInfo,
    PolicyOptions,
    ProviderHints,
    TopologyHint,
    new_policy,
)
from nvplugin.fakekubelet.topologymanager.policy import filter_providers_hints

POLICIES = ["best-effort", "restricted", "single-numa-node"]


@st.composite
def machines(draw: st.DrawFn) -> NumaInfo:
    n = draw(st.integers(1, 4))
    far = st.sampled_from([11, 12, 20, 21, 32])
    rows = [[10 if a == b else draw(far) for b in range(n)] for a in range(n)]
    return NumaInfo.from_distances(rows)


def hints(n: int) -> st.SearchStrategy[TopologyHint]:
    # Masks mostly within the machine, sometimes empty or reaching past its last node.
    mask = st.one_of(
        st.none(),
        st.integers(1, (1 << n) - 1).map(BitMask),
        st.integers(0, (1 << (n + 1)) - 1).map(BitMask),
    )
    return st.builds(TopologyHint, mask, st.booleans())


@st.composite
def provider_answers(draw: st.DrawFn, n: int) -> list[ProviderHints]:
    answers: list[ProviderHints] = []
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["none", "empty", "resources"]))
        if kind == "none":
            answers.append(None)
        elif kind == "empty":
            answers.append({})
        else:
            resources: dict[str, list[TopologyHint] | None] = {}
            for r in range(draw(st.integers(1, 2))):
                shape = draw(st.sampled_from(["nil", "impossible", "hints", "hints", "hints"]))
                if shape == "nil":
                    resources[f"r{r}"] = None
                elif shape == "impossible":
                    resources[f"r{r}"] = []
                else:
                    resources[f"r{r}"] = draw(st.lists(hints(n), min_size=1, max_size=4))
            answers.append(resources)
    return answers


@st.composite
def cases(draw: st.DrawFn) -> tuple[NumaInfo, list[ProviderHints], str, PolicyOptions]:
    numa = draw(machines())
    answers = draw(provider_answers(len(numa.nodes)))
    policy = draw(st.sampled_from(POLICIES))
    options = PolicyOptions(prefer_closest_numa=draw(st.booleans()))
    return numa, answers, policy, options


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(cases())
def test_fast_merge_equals_naive_merge(
    case: tuple[NumaInfo, list[ProviderHints], str, PolicyOptions],
) -> None:
    numa, answers, policy, options = case
    fast = new_policy(policy, numa, options).merge(answers)
    naive = new_policy(policy, numa, options, naive=True).merge(answers)
    assert fast == naive


@settings(max_examples=200, deadline=None)
@given(cases(), st.randoms(use_true_random=False))
def test_naive_merge_does_not_depend_on_order(
    case: tuple[NumaInfo, list[ProviderHints], str, PolicyOptions], rnd: random.Random
) -> None:
    numa, answers, policy, options = case
    filtered = filter_providers_hints(answers)
    expected = HintMerger(numa, filtered, policy, options).merge_naive()
    shuffled = [list(x) for x in filtered]
    rnd.shuffle(shuffled)
    for hint_list in shuffled:
        rnd.shuffle(hint_list)
    assert HintMerger(numa, shuffled, policy, options).merge_naive() == expected


def test_eight_nodes_three_resources_every_mask() -> None:
    """The benchmark's shape at full size: 255 hints per resource, 3 resources."""
    numa = NumaInfo.from_distances(
        [[10 if a == b else (12 if a // 4 == b // 4 else 30) for b in range(8)] for a in range(8)]
    )
    every = [BitMask(v) for v in range(1, 256)]

    def resource(min_size: int) -> list[TopologyHint]:
        return [TopologyHint(m, m.count() == min_size) for m in every if m.count() >= min_size]

    answers: list[ProviderHints] = [{"gpu": resource(2), "nic": resource(1)}, {"cpu": resource(1)}]
    for options in (PolicyOptions(), PolicyOptions(prefer_closest_numa=True)):
        hint, admit = new_policy("restricted", numa, options).merge(answers)
        # Only two-node masks are preferred for the GPUs; the others must agree exactly.
        assert hint.preferred is False and admit is False
        assert hint.numa_affinity is not None and hint.numa_affinity.count() == 2


@st.composite
def wide_cases(draw: st.DrawFn) -> tuple[NumaInfo, list[list[TopologyHint]], PolicyOptions]:
    """5 to 8 NUMA nodes (ids not always contiguous), 1 to 3 lists of up to 40 hints."""
    n = draw(st.integers(5, 8))
    far = st.sampled_from([11, 12, 20, 21, 32])
    rows = [[10 if a == b else draw(far) for b in range(n)] for a in range(n)]
    ids = tuple(range(n)) if draw(st.booleans()) else tuple(2 * i for i in range(n))
    numa = NumaInfo(ids, tuple(tuple(r) for r in rows))
    every = (1 << (max(ids) + 1)) - 1
    mask = st.one_of(st.none(), st.integers(1, every).map(BitMask))
    hint = st.builds(TopologyHint, mask, st.booleans())
    lists = draw(st.lists(st.lists(hint, min_size=1, max_size=40), min_size=1, max_size=3))
    return numa, lists, PolicyOptions(prefer_closest_numa=draw(st.booleans()))


@settings(max_examples=300, deadline=None)
@given(wide_cases())
def test_the_non_preferred_search_equals_folding_every_merged_hint(
    case: tuple[NumaInfo, list[list[TopologyHint]], PolicyOptions],
) -> None:
    """Up to 8 nodes, where the naive merge is too slow to draw from: the first mask in the
    compare order that a combination makes is the fold of the set of all merged hints."""
    numa, lists, options = case
    merger = HintMerger(numa, lists, "best-effort", options)
    assume(not merger.merged_hints(preferred_only=True))  # the search is for that case alone
    folded = None
    for hint in merger.merged_hints():
        if not hint.preferred:
            folded = merger.compare(folded, hint)
    assert merger.best_non_preferred() == folded


def test_a_mask_inside_every_list_is_no_merged_hint_unless_a_combination_makes_it() -> None:
    """Node 1 lies in a mask of each list and B = 1 puts it first, but no combination makes
    it (1110 & 0110 = 0110); 1110 & 1000 makes node 3, the hint the kubelet's merge keeps."""
    numa = NumaInfo((0, 1, 2, 3))
    lists = [
        [TopologyHint(BitMask(0b0001), False), TopologyHint(BitMask(0b1110), False)],
        [TopologyHint(BitMask(0b0110), False), TopologyHint(BitMask(0b1000), False)],
    ]
    merger = HintMerger(numa, lists, "best-effort", PolicyOptions())
    assert merger.merge_naive() == TopologyHint(BitMask(0b1000), False)
    assert merger.merge() == merger.merge_naive()
