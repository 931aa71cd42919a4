"""The count search oracle (tests/support/counts.py: nodes of a few classes of interchangeable
GPUs) answers exactly what the objective of docs/allocation.md asks: against brute force, against
the subset tables on every <= 16-GPU node it applies to, and against a plain count-vector
recursion on larger nodes. Then the product against it: the branch search up to 32 GPUs, and
beyond, where the budgeted search answers, its partitions never claim more than OPT."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nvplugin.allocator.besteffort import BestEffort
from nvplugin.allocator.methods.classes import twin_classes
from nvplugin.allocator.methods.counting import compositions
from nvplugin.node.model import Topology
from nvplugin.nodefile.reader import parse_node
from tests.support.bignodes import NODES
from tests.support.counts import CountOracle, CountSearch, applies, conditionally_psd, convex
from tests.support.forests import shapes
from tests.support.reference import BruteForce, CountReference
from tests.support.topologies import (
    builtin_nodes,
    check_solved,
    class_members,
    draw_request,
    from_classes,
    tree_scores,
)

BUILTIN = builtin_nodes()


def _queries(n: int, seed: int, count: int) -> list[tuple[list[int], list[int], int]]:
    """Every size with all GPUs free, then ``count`` random requests (0-2 must-include)."""
    rng = random.Random(seed)
    out = [(list(range(n)), [], size) for size in range(1, n + 1)]
    for _ in range(count):
        available = sorted(rng.sample(range(n), rng.randint(1, n)))
        size = rng.randint(1, len(available))
        out.append((available, sorted(rng.sample(available, min(size, rng.randint(0, 2)))), size))
    return out


def test_classes_of_builtin_nodes() -> None:
    """One PCIe switch = one class; NVSwitch sockets = one class each; meshes = singletons."""
    assert twin_classes(BUILTIN["pcie-8gpu"].scores).members == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert twin_classes(BUILTIN["dgx-h100"].scores).members == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert len(twin_classes(BUILTIN["dgx-2"].scores)) == 8
    assert len(twin_classes(BUILTIN["dgx-1"].scores)) == 8
    h100 = twin_classes(BUILTIN["dgx-h100"].scores)
    assert h100.scores.tolist() == [[1820, 1810], [1810, 1820]]
    assert convex(h100)


def test_conditionally_psd_is_exact() -> None:
    assert conditionally_psd(np.array([[50, 20], [20, 50]]))
    assert conditionally_psd(np.array([[50, 50], [50, 50]]))  # a zero direction is fine
    assert not conditionally_psd(np.array([[10, 250], [250, 10]]))  # pairs across score more
    assert conditionally_psd(np.array([[50]]))
    rng = np.random.default_rng(3)
    for _ in range(200):
        m = int(rng.integers(2, 5))
        raw = rng.integers(0, 300, size=(m, m))
        matrix = raw + raw.T
        basis = np.eye(m)[:, :-1] - np.eye(m)[:, -1:]
        lowest = np.linalg.eigvalsh(basis.T @ matrix @ basis).min()
        if abs(lowest) > 1e-6:  # the float answer is clear: the exact one must agree
            assert conditionally_psd(matrix) == (lowest > 0)


def test_compositions_and_levels_list_exactly_the_vectors() -> None:
    rng = random.Random(5)
    search = CountSearch(twin_classes(from_classes("t", [3, 3, 3, 3], tree_scores(4, 1)).scores))
    for _ in range(60):
        m = len(search.classes)
        high = np.array([rng.randint(0, 3) for _ in range(m)], dtype=np.int64)
        low = np.array([rng.randint(0, int(h)) for h in high], dtype=np.int64)
        total = rng.randint(int(low.sum()), int(high.sum()))
        every = [
            v
            for v in itertools.product(
                *(range(int(a), int(b) + 1) for a, b in zip(low, high, strict=True))
            )
            if sum(v) == total
        ]
        listed = compositions(low, high, total)
        assert [tuple(v) for v in listed.tolist()] == every
        twice = {v: int(search.twice(np.array([v]))[0]) for v in every}
        for target in set(twice.values()):
            found = search.level(low, high, total, target)
            assert sorted(tuple(v) for v in found.tolist()) == sorted(
                v for v in every if twice[v] == target
            )


def test_shape_counts() -> None:
    """The vertex shapes (forests) per number of classes: what the module docstrings quote."""
    assert len(shapes(4, designated=True, leftover=True)) == 1934
    assert len(shapes(2, designated=False, leftover=False)) == 2  # none, or {0,1} mixed
    assert len(shapes(1, designated=True, leftover=True)) == 1


def test_non_convex_nodes_are_left_to_the_branch_search() -> None:
    """Pairs across two classes scoring more than pairs within: the vertex argument fails, and
    the branch search (which needs no convexity) answers, exactly."""
    topology = from_classes("crossed", [3, 3], [[10, 250], [250, 10]])
    assert not applies(twin_classes(topology.scores))
    policy = BestEffort(topology, methods=("branch", "search"))
    assert policy.method == "branch"
    reference = BruteForce(topology)
    for available, must, size in _queries(6, 3, 40):
        assert policy.allocate(available, must, size) == reference.answer(available, must, size)


@st.composite
def _structured(draw: st.DrawFn) -> tuple[Topology, list[int], list[int], int]:
    m = draw(st.integers(1, 4))
    sizes = [draw(st.integers(1, 4)) for _ in range(m)]
    while sum(sizes) > 10:
        sizes[sizes.index(max(sizes))] -= 1
    scores = tree_scores(m, draw(st.integers(0, 10**6)))
    return draw_request(draw, from_classes("structured", sizes, scores))


@pytest.mark.slow
@settings(max_examples=250, deadline=None)
@given(_structured())
def test_against_brute_force_on_random_structured_nodes(
    query: tuple[Topology, list[int], list[int], int],
) -> None:
    topology, available, must, size = query
    oracle = CountOracle(topology)
    assert oracle.answer(available, must, size) == BruteForce(topology).answer(
        available, must, size
    )


COUNTED = sorted(n for n, t in BUILTIN.items() if applies(twin_classes(t.scores)))


def test_which_builtin_nodes_are_counted() -> None:
    """Every built-in node but the NVLink meshes of DGX-1 and DGX-2's PIX pairs (eight classes)."""
    assert sorted(set(BUILTIN) - set(COUNTED)) == ["dgx-1", "dgx-2"]


@pytest.mark.parametrize("name", COUNTED)
def test_against_the_tables_on_builtin_nodes(name: str) -> None:
    topology = BUILTIN[name]
    counted = CountOracle(topology)
    tables = BestEffort(topology)
    for available, must, size in _queries(len(topology), 7, 200):
        assert counted.answer(available, must, size) == tables.allocate(available, must, size)


@pytest.mark.parametrize("seed", range(12))
def test_against_the_tables_on_random_structured_nodes(seed: int) -> None:
    rng = random.Random(seed)
    m = rng.randint(2, 4)
    sizes = [rng.randint(1, 6) for _ in range(m)]
    while sum(sizes) > 16:
        sizes[sizes.index(max(sizes))] -= 1
    topology = from_classes(f"random-{seed}", sizes, tree_scores(m, seed))
    counted = CountOracle(topology)
    tables = BestEffort(topology)
    for available, must, size in _queries(len(topology), seed, 60):
        assert counted.answer(available, must, size) == tables.allocate(available, must, size)


@pytest.mark.slow
@pytest.mark.parametrize(("sizes", "seed"), [([6, 6, 6, 6], 1), ([5, 7, 4, 8], 2), ([10, 10], 3)])
def test_larger_nodes_against_a_count_recursion(sizes: list[int], seed: int) -> None:
    """Beyond subset tables: a plain memoised recursion over count vectors (no shapes), and the
    branch search the product answers these nodes with."""
    scores = tree_scores(len(sizes), seed)
    topology = from_classes("large", sizes, scores)
    counted = CountOracle(topology)
    policy = BestEffort(topology)
    assert policy.method == "branch"
    reference = CountReference(class_members(sizes), scores)
    for available, must, size in _queries(len(topology), seed, 25):
        expected = reference.answer(available, must, size)
        assert counted.answer(available, must, size) == expected
        assert policy.allocate(available, must, size) == expected


def test_explain_partition_is_consistent() -> None:
    """The product's explanation on a node the count search applies to (the branch search's):
    its partition scores what the count recursion and the oracle say OPT is."""
    topology = from_classes("explain", [5, 5, 5, 5], tree_scores(4, 9))
    policy = BestEffort(topology)
    assert policy.method == "branch"
    oracle = CountOracle(topology)
    reference = CountReference(class_members([5, 5, 5, 5]), tree_scores(4, 9))
    for available, must, size in _queries(len(topology), 4, 30):
        solved = policy.solve(available, must, size)
        assert solved.partition_score == oracle.opt(available, must, size)
        assert list(solved.indices) == policy.allocate(available, must, size)
        check_solved(topology, solved, available, size)
        a = tuple(len([i for i in available if i in c]) for c in reference.classes)
        x = tuple(len([i for i in solved.indices if i in c]) for c in reference.classes)
        rest = tuple(p - q for p, q in zip(a, x, strict=True))
        assert solved.partition_score == reference.score(x) + reference.rest(rest, size)


@pytest.mark.parametrize("seed", range(8))
def test_the_branch_search_against_the_oracle_on_larger_nodes(seed: int) -> None:
    """17-32 GPUs in two to four classes of a random PCIe tree (with or without a fabric): what
    the count search had before the branch search took them, answered alike."""
    rng = random.Random(seed)
    m = rng.randint(2, 4)
    while True:
        sizes = [rng.randint(2, 10) for _ in range(m)]
        if 17 <= sum(sizes) <= 32:
            break
    topology = from_classes(f"larger-{seed}", sizes, tree_scores(m, seed))
    oracle = CountOracle(topology)
    policy = BestEffort(topology, budget_s=60.0)
    assert policy.method == "branch"
    for available, must, size in _queries(len(topology), seed, 20):
        assert policy.allocate(available, must, size) == oracle.answer(available, must, size)


BEYOND = ["pcie-switch-64", "nvswitch-64", "pcie-switch-128", "nvswitch-128"]


@pytest.mark.slow
@pytest.mark.parametrize("name", BEYOND)
def test_beyond_32_gpus_the_budgeted_search_stays_under_opt(name: str) -> None:
    """The generated nodes beyond 32 GPUs get the budgeted search: a valid answer whose
    partition scores at most OPT (the oracle's), and whose bound is at least OPT; when it says
    it is proven, it is the oracle's answer."""
    topology = parse_node(NODES[name](), f"<{name}>").topology()
    policy = BestEffort(topology)
    assert policy.method == "search"
    oracle = CountOracle(topology)
    n = len(topology)
    work = [(list(range(n)), [], size) for size in (2, 3, 8, n // 2 - 1)]
    work += _queries(n, 5, 6)[n:]
    for available, must, size in work:
        solved = policy.solve(available, must, size)
        check_solved(topology, solved, available, size)
        assert set(must) <= set(solved.indices)
        expected, opt = oracle.found(available, must, size)
        assert solved.partition_score is not None and solved.partition_score <= opt
        assert solved.bound is None or opt <= solved.bound
        if solved.proven:
            assert list(solved.indices) == expected
