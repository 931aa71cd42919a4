"""Best-effort equals the objective of docs/allocation.md exactly: worked examples, exhaustive
comparison with brute force on every <= 8-GPU node, random topologies up to 10 GPUs, and the
16-GPU node against an independent memoised search."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nvplugin.allocator import make_policy
from nvplugin.allocator.besteffort import BestEffort
from nvplugin.allocator.methods.classes import twin_classes
from nvplugin.node.model import Topology
from tests.support.counts import CountOracle, applies
from tests.support.reference import BruteForce, MemoSearch
from tests.support.topologies import (
    DGX1_VOLTA,
    EXAMPLE_4GPU,
    SWITCHED_16,
    builtin_nodes,
    check_solved,
    from_scores,
)

BUILTIN = builtin_nodes()
SMALL = {"example-4gpu": EXAMPLE_4GPU, "dgx1-volta": DGX1_VOLTA} | {
    name: t for name, t in BUILTIN.items() if len(t) <= 8
}
LARGE = {"switched-16": SWITCHED_16} | {name: t for name, t in BUILTIN.items() if len(t) > 8}


def test_builtin_nodes_are_covered() -> None:
    """The built-in nodes are all here, the 16-GPU one among the large."""
    for name in ("workstation-4gpu", "dgx-1", "dgx-a100", "dgx-h100", "pcie-8gpu", "no-numa"):
        assert name in SMALL
    assert "dgx-2" in LARGE and len(LARGE["dgx-2"]) == 16


def test_worked_example_4gpu() -> None:
    policy = make_policy("best-effort", EXAMPLE_4GPU)
    assert policy.allocate([0, 1, 2, 3], [], 2) == [0, 3]
    assert policy.allocate([0, 1, 2, 3], [1], 2) == [1, 2]
    assert policy.allocate([0, 1, 2], [], 2) == [1, 2]
    solved = BestEffort(EXAMPLE_4GPU).solve([0, 1, 2, 3], [], 2)
    assert (solved.score, solved.partition_score) == (210, 420)
    assert solved.groups == ((0, 3), (1, 2)) and solved.leftover == ()


def test_worked_example_dgx1_size2() -> None:
    solved = BestEffort(DGX1_VOLTA).solve(range(8), [], 2)
    assert solved.indices == (2, 3)
    assert (solved.score, solved.partition_score) == (250, 920)
    assert solved.groups == ((2, 3), (0, 4), (1, 5), (6, 7))
    # The groups of both 920 partitions, best own score first, then index order.
    assert solved.contenders == (
        ((2, 3), 250),
        ((6, 7), 250),
        ((0, 3), 230),
        ((1, 2), 230),
        ((4, 7), 230),
        ((5, 6), 230),
        ((0, 4), 210),
        ((1, 5), 210),
    )


@pytest.mark.parametrize("name", sorted(SMALL))
def test_exhaustive_against_brute_force(name: str) -> None:
    """Every available subset, every size (0..|A|+1), every must-include of size <= 1."""
    topology = SMALL[name]
    n = len(topology)
    fast = BestEffort(topology)
    reference = BruteForce(topology)
    checked = 0
    for k in range(n + 1):
        for available in itertools.combinations(range(n), k):
            for size in range(k + 2):
                for must in [(), *((gpu,) for gpu in available)]:
                    expected = reference.answer(available, must, size)
                    assert fast.allocate(available, must, size) == expected, (
                        name,
                        available,
                        must,
                        size,
                    )
                    checked += 1
    assert checked > 2**n


@st.composite
def _queries(draw: st.DrawFn) -> tuple[Topology, list[int], list[int], int]:
    n = draw(st.one_of(st.integers(1, 10), st.integers(7, 10)))  # weight the large nodes
    # A small palette of pair scores makes ties (and so the tie-breaks) common.
    palette = draw(
        st.lists(
            st.builds(
                lambda pcie, links: pcie + 100 * links,
                st.sampled_from([10, 20, 30, 40, 50, 60]),
                st.integers(0, 18),
            ),
            min_size=1,
            max_size=4,
        )
    )
    scores = [[0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            scores[i][j] = scores[j][i] = draw(st.sampled_from(palette))
    everything = set(range(n))
    available = sorted(
        draw(
            st.one_of(
                st.just(everything),
                st.sets(st.integers(0, n - 1), max_size=2).map(lambda busy: everything - busy),
                st.sets(st.integers(0, n - 1), max_size=n),
            )
        )
    )
    size = draw(st.integers(0, len(available) + 1))
    must = sorted(draw(st.sets(st.sampled_from(available), max_size=size + 1))) if available else []
    return from_scores("random", scores), available, must, size


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(_queries())
def test_random_topologies_against_brute_force(
    query: tuple[Topology, list[int], list[int], int],
) -> None:
    topology, available, must, size = query
    expected = BruteForce(topology).answer(available, must, size)
    assert BestEffort(topology).allocate(available, must, size) == expected
    # The methods for nodes beyond the small tables answer the same (the tree where the scores
    # nest, the branch search, or tables over the available GPUs; a budget no load reaches keeps
    # the last exact), and so does the count search oracle where it applies.
    for methods in (("tree", "branch", "search"), ("branch", "search"), ("search",)):
        beyond = BestEffort(topology, methods=methods, budget_s=60.0)
        assert beyond.allocate(available, must, size) == expected, beyond.method
    if applies(twin_classes(topology.scores)):
        assert CountOracle(topology).answer(available, must, size) == expected


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(LARGE))
def test_sixteen_gpus_against_memoised_search(name: str) -> None:
    topology = LARGE[name]
    n = len(topology)
    fast = BestEffort(topology)
    reference = MemoSearch(topology)
    for size in range(1, n + 1):
        assert fast.allocate(range(n), [], size) == reference.answer(range(n), [], size), size
    rng = random.Random(20240316)
    for _ in range(50):
        available = sorted(rng.sample(range(n), rng.randint(1, n)))
        size = rng.randint(1, len(available))
        must = sorted(rng.sample(available, min(size, rng.randint(0, 2))))
        assert fast.allocate(available, must, size) == reference.answer(available, must, size), (
            available,
            must,
            size,
        )


def test_beyond_table_size_per_query_path() -> None:
    """A 17-GPU node takes the per-query path and still answers exactly."""
    rng = random.Random(7)
    n = 17
    scores = [[0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            scores[i][j] = scores[j][i] = rng.choice([10, 40, 650, 1220])
    topology = from_scores("wide-17", scores)
    fast = BestEffort(topology)
    assert fast.table_bytes == 0
    reference = MemoSearch(topology)
    for _ in range(4):
        available = sorted(rng.sample(range(n), rng.randint(9, 12)))
        size = rng.randint(2, 4)
        must = sorted(rng.sample(available, rng.randint(0, 1)))
        assert fast.allocate(available, must, size) == reference.answer(available, must, size)


def _all_nodes() -> list[Topology]:
    return [*SMALL.values(), *LARGE.values()]


@pytest.mark.parametrize("policy_name", ["best-effort", "simple"])
def test_invariants(policy_name: str) -> None:
    """Never outside available, never a duplicate, never short, must-include contained,
    ascending, whatever the request."""
    rng = random.Random(11)
    for topology in _all_nodes():
        n = len(topology)
        policy = make_policy(policy_name, topology)
        for _ in range(200):
            available = rng.sample(range(n), rng.randint(0, n))  # unordered on purpose
            size = rng.randint(0, n + 1)
            must = rng.sample(available, min(len(available), rng.randint(0, 3)))
            answer = policy.allocate(available, must, size)
            if size == 0 or size > len(available) or len(must) > size:
                assert answer == []
                continue
            assert len(answer) == size
            assert answer == sorted(set(answer))
            assert set(answer) <= set(available)
            assert set(must) <= set(answer)


def test_explain_partition_is_consistent() -> None:
    """The partition --explain shows covers A exactly and scores OPT."""
    rng = random.Random(3)
    for topology in (DGX1_VOLTA, SWITCHED_16):
        fast = BestEffort(topology)
        reference = BruteForce(topology) if len(topology) <= 8 else None
        n = len(topology)
        for _ in range(40):
            available = sorted(rng.sample(range(n), rng.randint(1, n)))
            size = rng.randint(1, len(available))
            must = rng.sample(available, min(size, rng.randint(0, 2)))
            solved = fast.solve(available, must, size)
            assert list(solved.indices) == fast.allocate(available, must, size)
            check_solved(topology, solved, available, size)
            if reference is not None:
                assert solved.partition_score == reference.opt(available, must, size)
