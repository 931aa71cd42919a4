"""Topologies for allocator tests: hand-built ones from docs/allocation.md, and the built-in
nodes."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

from nvplugin.allocator.base import Allocation
from nvplugin.node.model import CpuLayout, Gpu, Link, Pcie, Topology


def parse_cell(cell: str) -> Link:
    """``NV2+PHB`` / ``PIX`` -> Link (the node-file cell syntax of :attr:`Link.cell`)."""
    if cell.startswith("NV"):
        links, _, pcie = cell[2:].partition("+")
        return Link(Pcie[pcie], int(links))
    return Link(Pcie[cell])


def topology(name: str, cells: Sequence[Sequence[str]]) -> Topology:
    """A Topology from an upper-triangle-or-full matrix of link cells ("X" on the diagonal)."""
    n = len(cells)
    links = [
        [None if i == j else parse_cell(cells[min(i, j)][max(i, j)]) for j in range(n)]
        for i in range(n)
    ]
    return from_links(name, links)


def from_links(name: str, links: Sequence[Sequence[Link | None]]) -> Topology:
    n = len(links)
    gpus = tuple(
        Gpu(i, f"GPU-{name}-{i:04d}", "Test GPU", 16384, f"00000000:{i + 16:02x}:00.0", i, 0)
        for i in range(n)
    )
    return Topology(
        name,
        gpus,
        tuple(tuple(row) for row in links),
        ((10,),),
        CpuLayout.build(1, 4, 1, 1),
    )


def from_scores(name: str, scores: Sequence[Sequence[int]]) -> Topology:
    """A Topology whose pair scores are ``scores`` (each must be 10..60 + 100 x links)."""
    n = len(scores)

    def link(value: int) -> Link:
        return Link(Pcie(value % 100), value // 100)

    return from_links(
        name, [[None if i == j else link(scores[i][j]) for j in range(n)] for i in range(n)]
    )


# docs/allocation.md#worked-examples, the first.
EXAMPLE_4GPU = topology(
    "example-4gpu",
    [
        ["X", "PIX", "SYS", "NV2+SYS"],
        ["", "X", "NV2+SYS", "SYS"],
        ["", "", "X", "PIX"],
        ["", "", "", "X"],
    ],
)

# DGX-1 Volta hybrid cube-mesh (docs/allocation.md#worked-examples, the second).
DGX1_VOLTA = topology(
    "dgx1-volta",
    [
        ["X", "NV1+PIX", "NV1+PHB", "NV2+PHB", "NV2+SYS", "SYS", "SYS", "SYS"],
        ["", "X", "NV2+PHB", "NV1+PHB", "SYS", "NV2+SYS", "SYS", "SYS"],
        ["", "", "X", "NV2+PIX", "SYS", "SYS", "NV1+SYS", "SYS"],
        ["", "", "", "X", "SYS", "SYS", "SYS", "NV1+SYS"],
        ["", "", "", "", "X", "NV1+PIX", "NV1+PHB", "NV2+PHB"],
        ["", "", "", "", "", "X", "NV2+PHB", "NV1+PHB"],
        ["", "", "", "", "", "", "X", "NV2+PIX"],
        ["", "", "", "", "", "", "", "X"],
    ],
)


def _switched16() -> Topology:
    """16 GPUs on an NVSwitch fabric (6 links each) with a PCIe tree under two sockets: pairs
    PIX, PXB, NODE or SYS; a few links down to 5 so that not every pair ties."""
    cells = [["X"] * 16 for _ in range(16)]
    for i in range(16):
        for j in range(i + 1, 16):
            if i // 8 != j // 8:
                pcie = "SYS"
            elif i // 4 != j // 4:
                pcie = "NODE"
            elif i // 2 != j // 2:
                pcie = "PXB"
            else:
                pcie = "PIX"
            nv = 5 if (i * 7 + j * 3) % 11 == 0 else 6
            cells[i][j] = f"NV{nv}+{pcie}"
    return topology("switched-16", cells)


SWITCHED_16 = _switched16()


def builtin_nodes() -> dict[str, Topology]:
    """Every built-in simulated node (``nvplugin/nodefile/nodes/*.yaml``), by name, as discovery
    would find it."""
    from nvplugin.nodefile.reader import builtin_names, load_node

    return {name: load_node(name).topology() for name in builtin_names()}


def from_classes(name: str, sizes: Sequence[int], scores: Sequence[Sequence[int]]) -> Topology:
    """A node of twin classes: class c has ``sizes[c]`` consecutive GPUs, and two GPUs of
    classes c and d have pair score ``scores[c][d]`` (the diagonal: inside a class)."""
    of = [c for c, size in enumerate(sizes) for _ in range(size)]
    n = len(of)
    return from_scores(
        name, [[0 if i == j else scores[of[i]][of[j]] for j in range(n)] for i in range(n)]
    )


def draw_request(draw: st.DrawFn, topology: Topology) -> tuple[Topology, list[int], list[int], int]:
    """A possible request on ``topology`` for a hypothesis strategy: some GPUs free, a size
    within them and up to three must-include GPUs."""
    n = len(topology)
    available = sorted(draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n)))
    size = draw(st.integers(1, len(available)))
    must = sorted(draw(st.sets(st.sampled_from(available), max_size=min(size, 3))))
    return topology, available, must, size


def pcie_server(
    seed: int,
    gpus: tuple[int, int] = (18, 32),
    switches: tuple[int, int] = (5, 8),
    fabric: bool = False,
) -> tuple[list[int], list[list[int]]]:
    """A random PCIe-switch server: one or two sockets, ``switches`` switches of uneven sizes
    (1-8 GPUs each, ``gpus`` in all), each switch under its own root port (NODE), or two under
    one host bridge (PHB) or one upstream switch (PXB); INT or PIX inside a switch. With
    ``fabric``, one server in three has no NVSwitch fabric and the others one that every GPU
    reaches with the same 6 or 12 links (as on a DGX-2). Returns the switch sizes and their pair
    scores, written out here (not derived by the code under test)."""
    import random

    rng = random.Random(seed)
    while True:
        count = rng.randint(*switches)
        sizes = [rng.randint(1, 8) for _ in range(count)]
        if gpus[0] <= sum(sizes) <= gpus[1]:
            break
    sockets = rng.randint(1, 2)
    socket = sorted(rng.randrange(sockets) for _ in range(count))
    bridge = [rng.randrange(3) for _ in range(count)]  # same bridge: PHB
    upstream = [rng.randrange(2) for _ in range(count)]  # same bridge and upstream: PXB
    inside = [rng.choice([50, 50, 60]) for _ in range(count)]
    links = 100 * rng.choice([0, 6, 12]) if fabric else 0

    def score(c: int, d: int) -> int:
        if c == d:
            return inside[c] + links
        if socket[c] != socket[d]:
            return 10 + links  # SYS
        if bridge[c] != bridge[d]:
            return 20 + links  # NODE
        return (30 if upstream[c] != upstream[d] else 40) + links  # PHB, PXB

    return sizes, [[score(c, d) for d in range(count)] for c in range(count)]


def class_members(sizes: Sequence[int]) -> list[list[int]]:
    """The GPU indices of each class of :func:`from_classes`."""
    out, start = [], 0
    for size in sizes:
        out.append(list(range(start, start + size)))
        start += size
    return out


def tree_scores(leaves: int, seed: int) -> list[list[int]]:
    """Class pair scores of a random PCIe tree over ``leaves`` classes: the deeper two classes'
    common ancestor, the higher the score (INT/PIX inside a class, then PXB, PHB, NODE, SYS), plus
    a random NVSwitch fabric (every GPU min(links of both) NVLinks; possibly none)."""
    import random

    rng = random.Random(seed)
    groups = [[c] for c in range(leaves)]
    depth = {(c, c): rng.choice([5, 6]) for c in range(leaves)}  # INT or PIX inside a class
    level = 4
    while len(groups) > 1:  # merge two random subtrees one level up: PXB, PHB, NODE, SYS
        a, b = sorted(rng.sample(range(len(groups)), 2))
        for c in groups[a]:
            for d in groups[b]:
                depth[(c, d)] = depth[(d, c)] = max(1, level)
        merged = groups[a] + groups[b]
        groups = [g for k, g in enumerate(groups) if k not in (a, b)] + [merged]
        level -= rng.choice([0, 1])
    links = [rng.choice([0, 0, 6, 12, 18]) for _ in range(leaves)] if rng.random() < 0.5 else None
    out = [[0] * leaves for _ in range(leaves)]
    for c in range(leaves):
        for d in range(leaves):
            nv = min(links[c], links[d]) if links is not None else 0
            out[c][d] = 10 * depth[(c, d)] + 100 * nv
    return out


def check_solved(
    topology: Topology, solved: Allocation, available: Sequence[int], size: int
) -> None:
    """What every explained answer must hold: the answer leads the contenders and the
    partition, the partition covers ``available`` exactly with full groups of ``size`` and the
    leftover, and the scores are the groups' own."""
    assert solved.contenders[0] == (solved.indices, solved.score)
    assert solved.groups[0] == solved.indices
    members = [i for g in (*solved.groups, solved.leftover) for i in g]
    assert sorted(members) == sorted(available)
    assert all(len(g) == size for g in solved.groups)
    assert len(solved.leftover) == len(available) % size
    total = sum(topology.group_score(g) for g in (*solved.groups, solved.leftover))
    assert total == solved.partition_score
    assert solved.score == topology.group_score(solved.indices)
