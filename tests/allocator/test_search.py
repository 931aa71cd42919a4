"""Nodes beyond 16 GPUs without a few classes of interchangeable GPUs: exact where the subset
tables fit the budget, else the best group a local search finds, said to be unproven."""

from __future__ import annotations

import random

import numpy as np
import pytest
from structlog.testing import capture_logs

from nvplugin.allocator import explain_allocation, make_policy
from nvplugin.allocator.besteffort import BestEffort
from nvplugin.allocator.methods.search import local_search, upper_bound
from nvplugin.node.model import Topology
from tests.support.reference import MemoSearch
from tests.support.topologies import from_scores

LONG = 60.0
"""A budget no request here reaches, for answers that must be exact whatever the load."""


def _unstructured(n: int, seed: int) -> Topology:
    """Every GPU different: a random mix of PCIe relations and NVLink bridges."""
    rng = random.Random(seed)
    scores = [[0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            scores[i][j] = scores[j][i] = rng.choice([10, 20, 40, 50, 110, 250, 650])
    return from_scores(f"mesh-{n}", scores)


MESH_20 = _unstructured(20, 1)


def test_method_and_nothing_prepared() -> None:
    policy = BestEffort(MESH_20)
    assert policy.method == "search" and policy.table_bytes == 0


def test_up_to_16_available_gpus_answer_exactly() -> None:
    policy = BestEffort(MESH_20, budget_s=LONG)
    reference = MemoSearch(MESH_20)
    rng = random.Random(2)
    for _ in range(12):
        available = sorted(rng.sample(range(20), rng.randint(2, 12)))
        size = rng.randint(1, len(available))
        must = sorted(rng.sample(available, min(size, rng.randint(0, 2))))
        expected = reference.answer(available, must, size)
        assert policy.allocate(available, must, size) == expected
        assert policy.solve(available, must, size).proven


@pytest.mark.parametrize("budget_s", [1e-9, 0.05])
def test_beyond_16_available_the_answer_is_valid_and_unproven(budget_s: float) -> None:
    """Whatever the budget (even none: the greedy start is the answer), a well-formed group,
    holding the must-include GPUs, and a debug line that says it is not proven optimal."""
    policy = BestEffort(MESH_20, budget_s=budget_s)
    rng = random.Random(3)
    for _ in range(20):
        available = sorted(rng.sample(range(20), rng.randint(17, 20)))
        size = rng.randint(2, len(available) - 1)
        must = sorted(rng.sample(available, min(size - 1, rng.randint(0, 3))))
        with capture_logs() as logs:
            answer = policy.allocate(available, must, size)
        assert len(answer) == size and answer == sorted(set(answer))
        assert set(must) <= set(answer) <= set(available)
        lines = [e for e in logs if e["event"] == "preferred allocation not proven optimal"]
        assert len(lines) == 1 and lines[0]["log_level"] == "debug"
        assert lines[0]["gap"] == lines[0]["bound"] - lines[0]["partition_score"] >= 0


def test_forced_answers_need_no_search() -> None:
    policy = BestEffort(MESH_20)
    with capture_logs() as logs:
        assert policy.allocate(range(20), [], 20) == list(range(20))
        assert policy.allocate(range(20), [3, 9], 2) == [3, 9]
        assert policy.allocate(range(1, 20), [], 1) == [1]
        assert policy.allocate(range(20), [7], 1) == [7]
    assert not logs


def test_search_partition_and_bound() -> None:
    """The partition found covers the available GPUs, scores what it says, and stays under the
    bound; the answer group is its best full group."""
    rng = random.Random(4)
    for seed in range(6):
        topology = _unstructured(rng.randint(17, 30), seed)
        n = len(topology)
        size = rng.randint(2, n // 2)
        found = local_search(topology.scores, range(n), [], size, deadline=float("inf"))
        members = sorted(i for g in (*found.groups, found.leftover) for i in g)
        assert members == list(range(n))
        total = sum(topology.group_score(g) for g in (*found.groups, found.leftover))
        assert total == found.partition_score <= found.bound
        assert found.score == topology.group_score(found.groups[0])
        assert found.score == max(topology.group_score(g) for g in found.groups)


def test_upper_bound_caps_the_optimum() -> None:
    """On 10 GPUs, against brute force: no partition beats the bound."""
    from tests.support.reference import BruteForce

    for seed in range(5):
        topology = _unstructured(10, seed)
        pairs = np.asarray(topology.scores, dtype=np.int64)
        for size in range(1, 11):
            opt = BruteForce(topology).opt(range(10), [], size)
            assert opt <= upper_bound(pairs, size)


def test_explain_says_unproven() -> None:
    answer = explain_allocation("best-effort", MESH_20, list(range(20)), [], 6)
    assert not answer.proven and answer.bound is not None
    assert answer.partition_score is not None and answer.partition_score <= answer.bound
    simple = explain_allocation("simple", MESH_20, list(range(20)), [], 6)
    assert simple.indices == (0, 1, 2, 3, 4, 5) and not simple.proven


def test_budget_reaches_the_policy() -> None:
    policy = make_policy("best-effort", MESH_20, budget_s=0.25)
    assert isinstance(policy, BestEffort) and policy.budget_s == 0.25
