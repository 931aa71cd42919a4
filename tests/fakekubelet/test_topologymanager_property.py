"""Property tests: the fast merge equals the kubelet's naive cross-product merge, exactly.

Random machines of 1-4 NUMA nodes (with random distances), up to 3 providers each answering
nothing / nil / [] / random hints (nil, empty and out-of-machine masks included), every policy,
with and without prefer-closest-numa-nodes. A second property shows why Go's random map order
cannot matter: the naive merge is the same however lists and hints are ordered."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
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
