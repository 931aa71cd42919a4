"""The tree method (nodes of 9-16 GPUs whose classes of twins hang from a tree: a DGX-2, 16-card
PCIe servers) answers exactly what the objective of docs/allocation.md asks: on random PCIe trees
of 9-16 GPUs (uneven switches under one or two sockets, host bridges and upstream switches, with
or without an NVSwitch fabric over every GPU) against the subset tables; on every real
`nvidia-smi topo -m` output here that is a tree, against the tables (beyond eight GPUs) or brute
force; on small nodes whose class scores are any ultrametric, inside scores anything (steps that
go down), against brute force. Nodes whose scores do not nest go to the other methods, and a
DGX-2's `--explain` (which builds the branch search) shows the tree's answer."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.bench_allocator import queries
from nvplugin.allocator import explain_allocation
from nvplugin.allocator.besteffort import BestEffort
from nvplugin.allocator.methods.smalltables import SmallTables
from nvplugin.allocator.methods.tables import Tables
from nvplugin.allocator.methods.tree import TreeSearch, hierarchy
from nvplugin.node.model import Topology
from nvplugin.nodefile.reader import load_node, parse_node
from nvplugin.nodefile.topoimport import Source, import_topo
from tests.support.reference import BruteForce
from tests.support.topologies import check_solved, draw_request, from_classes, pcie_server

Query = tuple[list[int], list[int], int]

TOPO = sorted((Path(__file__).parent.parent / "nodefile" / "topo").glob("*.txt"))
"""Real `nvidia-smi topo -m` outputs, restated (tests/nodefile/test_topoimport.py)."""


def _mask(indices: list[int]) -> int:
    return sum(1 << i for i in indices)


def _against_tables(topology: Topology, tables: Tables | SmallTables, work: list[Query]) -> None:
    """The tree's answer, OPT and own score are the tables'."""
    search = TreeSearch(topology.scores)
    assert search.root is not None
    for available, must, size in work:
        best = tables.best_group(_mask(available), _mask(must), size)
        assert best is not None
        group, own, opt = best
        answer = search.best(available, must, size)
        expected = [i for i in range(len(topology)) if group >> i & 1]
        assert list(answer.group) == expected, (available, must, size)
        assert (answer.opt, answer.own) == (opt, own), (available, must, size)


@pytest.mark.parametrize("seed", range(16))
def test_random_pcie_trees_against_the_subset_tables(seed: int) -> None:
    sizes, scores = pcie_server(seed, gpus=(9, 16), switches=(2, 8), fabric=True)
    topology = from_classes(f"tree-{seed}", sizes, scores)
    n = len(topology)
    policy = BestEffort(topology)
    assert policy.method == "tree"
    tables = Tables.build(topology.scores, range(1, n + 1))
    work = queries(n, seed)
    _against_tables(topology, tables, work)
    for available, must, size in work:  # the policy answers with the tree, alike
        expected = tables.best_group(_mask(available), _mask(must), size)
        assert expected is not None
        answer = policy.allocate(available, must, size)
        assert _mask(answer) == expected[0], (available, must, size)


def test_the_real_outputs_are_here() -> None:
    """The next test's inputs: a missing folder would leave it with none."""
    assert len(TOPO) >= 20
    assert any("dgx2" in path.name for path in TOPO)


@pytest.mark.parametrize("path", TOPO, ids=[p.name for p in TOPO])
def test_real_topologies_that_are_trees(path: Path) -> None:
    """Every real output that is a tree (a DGX-1's cube-mesh is not), against the tables: what
    the node gets (the DGX-2's 16 GPUs) or what it would get were it not a small node."""
    text = import_topo(Source(path.read_text(), f"topo file {path.name}"), path.stem)
    topology = parse_node(text, path.name).topology()
    n = len(topology)
    if TreeSearch(topology.scores).root is None:
        assert "dgx1" in path.name, path.name
        return
    if n > 8:
        assert BestEffort(topology).method == "tree"
        tables: Tables | SmallTables = Tables.build(topology.scores, range(1, n + 1))
    else:
        tables = SmallTables.build(topology.scores)
    _against_tables(topology, tables, queries(n, n))


SCORES = (10, 20, 30, 40, 50, 60, 110, 120, 140, 150, 210, 250, 410, 450, 610, 650)
"""Pair scores a node can have (a PCIe weight plus 100 per NVLink), ascending."""


@st.composite
def _ultrametric(draw: st.DrawFn) -> tuple[Topology, list[int], list[int], int]:
    """A node of up to 9 GPUs in classes whose scores between them are an ultrametric (a
    random tree, deeper common ancestor never lower), and inside each class any score: below,
    equal to or above its scores to others (a negative step at the leaf)."""
    m = draw(st.integers(1, 6))
    sizes = [draw(st.integers(1, 3)) for _ in range(m)]
    while sum(sizes) > 9:
        sizes[sizes.index(max(sizes))] -= 1
    blocks = [[c] for c in range(m)]
    scores = [[0] * m for _ in range(m)]
    level = draw(st.integers(len(SCORES) // 2, len(SCORES) - 1))
    while len(blocks) > 1:  # join two blocks at a score at or below every join so far
        pair = st.lists(st.integers(0, len(blocks) - 1), min_size=2, max_size=2, unique=True)
        a, b = sorted(draw(pair))
        for c in blocks[a]:
            for d in blocks[b]:
                scores[c][d] = scores[d][c] = SCORES[level]
        blocks = [k for i, k in enumerate(blocks) if i not in (a, b)] + [blocks[a] + blocks[b]]
        level = max(0, level - draw(st.sampled_from([0, 1, 3])))
    for c in range(m):
        scores[c][c] = draw(st.sampled_from(SCORES))
    return draw_request(draw, from_classes("ultrametric", sizes, scores))


@settings(max_examples=300, deadline=None)
@given(_ultrametric())
def test_any_ultrametric_against_brute_force(
    query: tuple[Topology, list[int], list[int], int],
) -> None:
    topology, available, must, size = query
    search = TreeSearch(topology.scores)
    assert search.root is not None
    reference = BruteForce(topology)
    answer = search.best(available, must, size)
    assert list(answer.group) == reference.answer(available, must, size)
    assert answer.opt == reference.opt(available, must, size)
    assert answer.own == topology.group_score(answer.group)


def test_scores_that_do_not_nest_are_not_a_tree() -> None:
    """Three classes where one pair scores below both others' (the three-point condition fails:
    an NVSwitch fabric over part of a PCIe tree), and the DGX-1's hybrid cube-mesh: no tree, and
    a 12-GPU such node gets another exact method."""
    fabric = [[650, 610, 10], [610, 650, 20], [10, 20, 50]]
    assert hierarchy(fabric, [4, 4, 4]) is None
    assert TreeSearch(load_node("dgx-1").topology().scores).root is None
    topology = from_classes("fabric-12", [4, 4, 4], fabric)
    policy = BestEffort(topology)
    assert policy.method != "tree"
    tables = Tables.build(topology.scores, range(1, 13))
    for available, must, size in queries(12, 3):
        expected = tables.best_group(_mask(available), _mask(must), size)
        assert expected is not None
        assert _mask(policy.allocate(available, must, size)) == expected[0]


def test_the_tree_of_a_dgx2() -> None:
    """Its class scores read as the machine is built: the system, two sockets, two PCIe switch
    pairs each (PXB under an upstream switch), two switches of two GPUs each."""
    search = TreeSearch(load_node("dgx-2").topology().scores)
    root = search.root
    assert root is not None
    assert [len(g) for g in search.members] == [2] * 8
    assert root.delta == 610  # SYS and the fabric's six links: every pair scores at least this
    assert [child.delta for child in root.children] == [10, 10]  # NODE
    pxb = [grand for child in root.children for grand in child.children]
    assert [node.delta for node in pxb] == [20] * 4  # PXB
    assert [leaf.delta for node in pxb for leaf in node.children] == [10] * 8  # PIX
    assert [leaf.leaf for node in pxb for leaf in node.children] == list(range(8))


def test_explain_on_a_dgx2_shows_the_trees_answer() -> None:
    topology = load_node("dgx-2").topology()
    policy = BestEffort(topology)
    assert policy.method == "tree"
    for available, must, size in queries(16, 7)[::10]:
        solved = explain_allocation("best-effort", topology, available, must, size)
        assert list(solved.indices) == policy.allocate(available, must, size)
        check_solved(topology, solved, available, size)
        simple = explain_allocation("simple", topology, available, must, size)
        assert simple.partition_score is not None and solved.partition_score is not None
        assert simple.partition_score <= solved.partition_score
