"""Node files beyond 16 GPUs for benchmarks and tests, generated (128 x 128 link matrices are
better written by code than by hand).

- ``pcie-switch-<N>``: two sockets, two PCIe switches per socket, N/4 GPUs under each (PIX
  within a switch, NODE between the switches of a socket, SYS across): a 4U server of single-slot
  L4 cards, four classes of interchangeable GPUs.
- ``nvswitch-<N>``: every GPU on one NVSwitch fabric (18 links each: NV18 between every pair),
  half the GPUs on each socket, each behind its own PCIe switch (NODE within a socket, SYS
  across), as on a DGX H100 scaled up: two classes.
- ``mesh-20``: twenty GPUs where no two are interchangeable: GPU pairs share a PCIe switch, ten
  per socket, and NVLink bridges join each GPU to the next (two links) and, for every third GPU,
  to the one seven further (one link): the node without structure.
- ``l4-20``, ``l4-24``, ``l4-24-uneven``, ``l4-32``, ``l4-32-uneven``, ``l4-32-one-socket``: 4U
  servers of single-slot L4 cards behind five to eight PCIe switches under two sockets, or one
  (:data:`SERVERS`: the switch sizes per socket; PIX within a switch, NODE between switches of a
  socket, SYS across): five to eight classes.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from nvplugin.nodefile.cpus import CpuSpec
from nvplugin.nodefile.writer import GpuDraft, NodeDraft, render

SIZES = (20, 24, 32, 64, 128)


def _document(
    name: str, comment: str, gpus: list[dict[str, object]], cells: list[list[str]]
) -> str:
    draft = NodeDraft(
        name,
        tuple(GpuDraft(tuple(gpu.items())) for gpu in gpus),
        tuple(tuple(row) for row in cells),
        ((10, 21), (21, 10)),
        CpuSpec(2, 32, 2),
        {"": [comment]},
    )
    return render(draft)


def _gpu(name: str, numa: int, nvswitch: int = 0) -> dict[str, object]:
    gpu: dict[str, object] = {"name": name, "memory_mib": 23034, "numa_node": numa}
    if nvswitch:
        gpu["nvswitch_links"] = nvswitch
    return gpu


def pcie_switch(n: int) -> str:
    """``pcie-switch-<n>`` (module docstring); n divisible by 4."""
    per = n // 4
    switch = [i // per for i in range(n)]

    def cell(i: int, j: int) -> str:
        if i == j:
            return "X"
        if switch[i] == switch[j]:
            return "PIX"
        return "NODE" if switch[i] // 2 == switch[j] // 2 else "SYS"

    cells = [[cell(i, j) for j in range(n)] for i in range(n)]
    gpus = [_gpu("NVIDIA L4", switch[i] // 2) for i in range(n)]
    comment = f"{n} L4 GPUs: 2 sockets x 2 PCIe switches x {per} GPUs (generated)."
    return _document(f"pcie-switch-{n}", comment, gpus, cells)


def nvswitch(n: int) -> str:
    """``nvswitch-<n>`` (module docstring); n even."""
    cells = [["X" if i == j else "NV18" for j in range(n)] for i in range(n)]
    gpus = [_gpu("NVIDIA H100 80GB HBM3", 0 if i < n // 2 else 1, 18) for i in range(n)]
    comment = f"{n} H100 GPUs on one NVSwitch fabric, {n // 2} per socket (generated)."
    return _document(f"nvswitch-{n}", comment, gpus, cells)


def mesh(n: int = 20) -> str:
    """``mesh-<n>`` (module docstring): no two GPUs interchangeable."""
    links = [[0] * n for _ in range(n)]
    for i in range(n):
        links[i][(i + 1) % n] = links[(i + 1) % n][i] = 2
    for i in range(0, n, 3):
        j = (i + 7) % n
        links[i][j] = links[j][i] = max(links[i][j], 1)
    half = n // 2
    cells = []
    for i in range(n):
        row = []
        for j in range(n):
            if i == j:
                row.append("X")
                continue
            pcie = "PIX" if i // 2 == j // 2 else "NODE" if i // half == j // half else "SYS"
            row.append(f"NV{links[i][j]}+{pcie}" if links[i][j] else pcie)
        cells.append(row)
    gpus = [_gpu("NVIDIA A10", i // half) for i in range(n)]
    comment = f"{n} GPUs with irregular NVLink bridges: none interchangeable (generated)."
    return _document(f"mesh-{n}", comment, gpus, cells)


SERVERS: dict[str, tuple[tuple[int, ...], ...]] = {
    "l4-20": ((4, 4, 4), (4, 4)),
    "l4-24": ((4, 4, 4), (4, 4, 4)),
    "l4-24-uneven": ((6, 4, 2), (6, 4, 2)),
    "l4-32": ((4, 4, 4, 4), (4, 4, 4, 4)),
    "l4-32-uneven": ((8, 4, 2, 2), (6, 4, 4, 2)),
    "l4-32-one-socket": ((6, 6, 4, 4, 4, 4, 2, 2),),
}
"""PCIe-switch servers: GPUs per switch, switches per socket."""


def server(name: str) -> str:
    """A :data:`SERVERS` node (module docstring)."""
    sockets = SERVERS[name]
    where = [
        (socket, switch)
        for socket, sizes in enumerate(sockets)
        for switch, size in enumerate(sizes)
        for _ in range(size)
    ]
    n = len(where)

    def cell(i: int, j: int) -> str:
        if i == j:
            return "X"
        if where[i] == where[j]:
            return "PIX"
        return "NODE" if where[i][0] == where[j][0] else "SYS"

    cells = [[cell(i, j) for j in range(n)] for i in range(n)]
    gpus = [_gpu("NVIDIA L4", where[i][0]) for i in range(n)]
    layout = " + ".join("(" + ", ".join(map(str, sizes)) + ")" for sizes in sockets)
    comment = f"{n} L4 GPUs behind PCIe switches of {layout} GPUs, per socket (generated)."
    return _document(name, comment, gpus, cells)


NODES: dict[str, Callable[[], str]] = {
    **{f"pcie-switch-{n}": (lambda n=n: pcie_switch(n)) for n in SIZES},
    **{f"nvswitch-{n}": (lambda n=n: nvswitch(n)) for n in SIZES},
    "mesh-20": mesh,
    **{name: (lambda name=name: server(name)) for name in SERVERS},
}
"""Every generated node by name."""


def write(directory: str, name: str) -> str:
    """Write node ``name`` into ``directory``; returns the file's path."""
    path = os.path.join(directory, f"{name}.yaml")
    with open(path, "w", encoding="utf-8") as out:
        out.write(NODES[name]())
    return path
