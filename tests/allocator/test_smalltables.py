"""The plain-Python tables of nodes up to eight GPUs hold the same numbers and give the same
answers as the numpy tables, on every query of random nodes; and a policy for such a node
never loads numpy."""

from __future__ import annotations

import itertools
import random
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

from nvplugin.allocator.besteffort import BestEffort
from nvplugin.allocator.methods.smalltables import SMALL_GPUS, SmallTableMethod, SmallTables
from nvplugin.allocator.methods.tables import Tables
from tests.support.bignodes import write
from tests.support.topologies import builtin_nodes

SCORES = (0, 10, 20, 40, 60, 80, 650, 1220, 1800)


def _random_scores(rng: random.Random, n: int) -> list[list[int]]:
    """Pair scores drawn from few values (many ties: the tie rules are what could differ)."""
    values = rng.sample(SCORES, rng.randint(1, 4))
    scores = [[0] * n for _ in range(n)]
    for i, j in itertools.combinations(range(n), 2):
        scores[i][j] = scores[j][i] = rng.choice(values)
    return scores


def _nodes() -> list[tuple[str, list[list[int]]]]:
    rng = random.Random(8)
    builtin = [
        (name, [list(row) for row in t.scores])
        for name, t in sorted(builtin_nodes().items())
        if len(t) <= SMALL_GPUS
    ]
    drawn = [(f"random-{k}", _random_scores(rng, rng.randint(0, SMALL_GPUS))) for k in range(12)]
    return builtin + drawn


@pytest.mark.parametrize(("name", "scores"), _nodes(), ids=[name for name, _ in _nodes()])
def test_same_tables_and_same_answer_to_every_query(name: str, scores: list[list[int]]) -> None:
    n = len(scores)
    small = SmallTables.build(scores)
    big = Tables.build(scores, range(1, n + 1))
    assert small.setscore == big.setscore.tolist()
    for s in range(1, n + 1):
        # rest[s] is exact (and read) up to popcount n - s only; above that both keep setscore
        assert small.rest[s] == big.rest[s].tolist(), s
        assert small.groups[s] == big.groups[s].tolist(), s
    full = (1 << n) - 1
    for available in range(full + 1):
        members = [1 << i for i in range(n) if available >> i & 1]
        for s in range(1, len(members) + 1):
            for k in range(min(2, s) + 1):
                for required in itertools.combinations(members, k):
                    mask = sum(required)
                    expected = big.best_group(available, mask, s)
                    assert small.best_group(available, mask, s) == expected, (available, mask)
                    if k == 0:
                        assert small.ranked(available, mask, s) == big.ranked(available, mask, s)


def test_partitions_read_back_from_either_form_agree() -> None:
    scores = _random_scores(random.Random(3), 8)
    small = SmallTables.build(scores)
    big = Tables.build(scores, range(1, 9))
    for s in range(1, 5):
        for mask in range(1 << 8):
            if mask.bit_count() <= 8 - s:
                assert small.split(mask, s) == big.split(mask, s)


def test_best_effort_up_to_eight_gpus_takes_them() -> None:
    for name, topology in builtin_nodes().items():
        policy = BestEffort(topology)
        if len(topology) <= SMALL_GPUS:
            assert policy.method == "tables", name
            assert isinstance(policy._method, SmallTableMethod), name
        else:
            assert not isinstance(policy._method, SmallTableMethod), name
    with pytest.raises(ValueError, match="at most 8"):
        SmallTables.build([[0] * 9 for _ in range(9)])


@pytest.mark.process
def test_a_small_node_is_served_without_numpy() -> None:
    """What `serve` imports and builds for each resource of an eight-GPU node leaves numpy unloaded
    (docs/allocation.md#how-it-is-computed says what it would add), and a DGX-2's too (the tree
    method, tests/allocator/test_tree.py); a 20-GPU server's policy (the branch search) loads it."""
    code = textwrap.dedent(
        """
        import sys
        import nvplugin.cli
        from nvplugin.config import load_config
        from nvplugin.nodesession import load_topology
        from nvplugin.rm import plan_for, resource_policies

        for node in sys.argv[1:]:
            topology = load_topology(node)
            plan = plan_for(load_config(None), topology.gpus)
            resource = plan.resource("nvidia.com/gpu")
            policy = resource_policies("best-effort", topology, [resource], budget_s=0.1)
            policy[resource.name].allocate(range(len(topology)), [], 2)
            print(node, "numpy" in sys.modules)
        """
    )
    directory = tempfile.mkdtemp(dir="/tmp")
    try:
        large = write(directory, "l4-20")
        nodes = ("dgx-a100", "dgx-h100", "dgx-1", "workstation-4gpu", "dgx-2", large)
        result = subprocess.run(
            [sys.executable, "-c", code, *nodes], capture_output=True, text=True, timeout=120
        )
    finally:
        shutil.rmtree(directory)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "dgx-a100 False",
        "dgx-h100 False",
        "dgx-1 False",
        "workstation-4gpu False",
        "dgx-2 False",
        f"{large} True",
    ]
