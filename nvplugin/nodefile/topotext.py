"""The text of ``nvidia-smi topo -m``, as drivers from 2016 to today print it, read into a table.

What the drivers print, and what is read from it:

- A header line starting with ``GPU0``, then one row per device. Columns are separated by tabs
  (current drivers) or spaces (older ones, and most copies on the web); both, and any mix, are
  read the same. The header is found as the first line starting with ``GPU0`` whose next
  non-blank line starts with ``GPU0`` too, so a shell prompt, comments or other text above it
  are skipped; the matrix ends at the first line that is not a device row (a blank line, the
  ``Legend:``, a row title seen before), and everything after it (legends, the ``topo -p2p``
  matrix some pastes add) is ignored.
- Device columns: ``GPU0``..``GPUn-1`` first, then network devices (``mlx5_0``, ``NIC0`` with a
  ``NIC Legend``, ...), each with its own row: NIC cells and rows are skipped.
- Affinity columns after the devices, on GPU rows only: ``CPU Affinity`` (a Linux CPU list),
  ``NUMA Affinity`` (a node, a range such as ``6-7``, or ``N/A``) and ``GPU NUMA ID`` (the GPU's
  own memory node on coherent systems such as Grace Hopper, else ``N/A``).
- Cells: ``X`` on the diagonal; ``SYS`` (``SOC`` before driver 396), ``NODE``, ``PHB``, ``PXB``,
  ``PIX``, ``INT``; ``NV<k>`` for k bonded NVLinks, which hides the PCIe relation. A node file's
  ``links`` may also say both, ``NV12+PXB`` (what ``nvplugin node capture`` writes).

Every problem is a :class:`TopoTextError` naming the line and column (of the text given) and the
cell, never the whole block. :func:`guess_layout` and :func:`guess_nvswitch` derive what the text
implies but does not say: NUMA nodes, CPUs and NVSwitch links.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from nvplugin.errors import InputError
from nvplugin.errors import show as show_value
from nvplugin.node.model import (
    MAX_CPUS,
    MAX_GPUS,
    MAX_NUMA_NODES,
    MAX_NVLINKS,
    Pcie,
    parse_cpu_list,
)
from nvplugin.nodefile.cpus import CpuForm, fit_affinities

PCIE_WORDS = {
    "SYS": Pcie.SYS,
    "SOC": Pcie.SYS,  # drivers before 396: "the SMP link between CPU sockets"
    "NODE": Pcie.NODE,
    "PHB": Pcie.PHB,
    "PXB": Pcie.PXB,
    "PIX": Pcie.PIX,
    "INT": Pcie.INT,
}
CPU_AFFINITY = "CPU Affinity"
NUMA_AFFINITY = "NUMA Affinity"
GPU_NUMA_ID = "GPU NUMA ID"
_TITLES = (CPU_AFFINITY, NUMA_AFFINITY, GPU_NUMA_ID)
_NV_RE = re.compile(r"^NV(\d{1,3})$")
_GPU_RE = re.compile(r"^GPU(\d+)$")
_TOKEN_RE = re.compile(r"\S+")
_CELLS = (
    "X on the diagonal, else NV<k> (k = 1..18) and/or one of SYS (or SOC), NODE, PHB, PXB, "
    "PIX, INT joined by '+'"
)


class TopoTextError(InputError):
    """A problem at one place of the text: ``line`` and ``column`` count from 1."""

    def __init__(self, line: int, column: int, problem: str) -> None:
        self.line = line
        self.column = column
        self.problem = problem
        super().__init__(f"line {line}, column {column}: {problem}")


@dataclass(frozen=True, slots=True)
class Cell:
    """One GPU-GPU cell: its NVLinks, its PCIe relation (None: the text hides it under NV<k>),
    and where it stands."""

    nvlinks: int
    pcie: Pcie | None
    text: str
    line: int
    column: int


@dataclass(frozen=True)
class TopoTable:
    """The GPU part of the matrix and the GPUs' affinity columns (None: no such column; an
    entry None: ``N/A``)."""

    cells: tuple[tuple[Cell | None, ...], ...]
    cpu_affinity: tuple[tuple[int, ...] | None, ...] | None = None
    numa_affinity: tuple[tuple[int, ...] | None, ...] | None = None
    gpu_numa_id: tuple[int | None, ...] | None = None

    @property
    def size(self) -> int:
        return len(self.cells)

    def cell(self, a: int, b: int) -> Cell:
        cell = self.cells[a][b]
        if cell is None:
            raise ValueError(f"no cell between GPU{a} and itself")
        return cell


Token = tuple[str, int]  # text, 1-based column


def _tokens(line: str) -> list[Token]:
    return [(m.group(), m.start() + 1) for m in _TOKEN_RE.finditer(line)]


def parse_topo(text: str) -> TopoTable:
    """Read ``nvidia-smi topo -m`` text (see the module doc); raise :class:`TopoTextError`."""
    lines = text.splitlines()
    header = _find_header(lines)
    devices, affinity = _header(_tokens(lines[header]), header + 1)
    gpus = sum(1 for name, _ in devices if _GPU_RE.match(name))
    names = {name for name, _ in devices}
    rows: dict[str, tuple[int, list[Token]]] = {}
    for number in range(header + 1, len(lines)):
        tokens = _tokens(lines[number])
        if not tokens:
            if rows:
                break
            continue
        title = tokens[0][0]
        if title not in names or title in rows:  # a title seen before: a second matrix
            break
        rows[title] = (number + 1, tokens)
    for i in range(gpus):
        if f"GPU{i}" not in rows:
            raise TopoTextError(
                header + 1,
                1,
                f"the header has columns GPU0..GPU{gpus - 1} but there is no row GPU{i} below it",
            )
    width = len(devices)
    cells: list[list[Cell | None]] = []
    values: list[list[Token | None]] = []
    for i in range(gpus):
        number, tokens = rows[f"GPU{i}"]
        body = tokens[1:]
        if len(body) < width:
            end = len(lines[number - 1]) + 1
            raise TopoTextError(
                number, end, f"row GPU{i} has {len(body)} cells for {width} device columns"
            )
        extra = body[width + len(affinity) :]
        if extra:
            raise TopoTextError(
                number,
                extra[0][1],
                f"row GPU{i}: {show_value(extra[0][0])} is past the last column "
                f"({devices[-1][0] if not affinity else affinity[-1]})",
            )
        cells.append([_cell(body[j], i, j, number) for j in range(gpus)])
        given: list[Token | None] = list(body[width:])
        values.append(given + [None] * (len(affinity) - len(given)))
    _check_symmetric(cells)
    columns = _affinities(affinity, values, [rows[f"GPU{i}"] for i in range(gpus)], lines)
    return TopoTable(
        cells=tuple(tuple(row) for row in cells),
        cpu_affinity=columns.get(CPU_AFFINITY),  # type: ignore[arg-type]
        numa_affinity=columns.get(NUMA_AFFINITY),  # type: ignore[arg-type]
        gpu_numa_id=columns.get(GPU_NUMA_ID),  # type: ignore[arg-type]
    )


def _find_header(lines: Sequence[str]) -> int:
    """Index of the header: a line starting with GPU0 whose next non-blank line does too."""
    for number, line in enumerate(lines):
        tokens = line.split()
        if not tokens or tokens[0] != "GPU0":
            continue
        for below in lines[number + 1 :]:
            if below.strip():
                if below.split()[0] == "GPU0":
                    return number
                break
    raise TopoTextError(
        1,
        1,
        "no nvidia-smi topo -m matrix found: expected a header line starting with GPU0 and, "
        "below it, a row starting with GPU0",
    )


def _header(tokens: list[Token], line: int) -> tuple[list[Token], list[str]]:
    """(device columns, affinity column titles) of the header line."""
    titles: list[Token] = []
    k = 0
    while k < len(tokens):
        for title in _TITLES:
            words = title.split()
            if [t for t, _ in tokens[k : k + len(words)]] == words:
                titles.append((title, tokens[k][1]))
                k += len(words)
                break
        else:
            titles.append(tokens[k])
            k += 1
    devices: list[Token] = []
    affinity: list[str] = []
    for name, column in titles:
        if name in _TITLES:
            if name in affinity:
                raise TopoTextError(line, column, f"a second {name!r} column")
            affinity.append(name)
            continue
        if affinity:
            raise TopoTextError(
                line,
                column,
                f"unknown column {show_value(name)} after the affinity columns "
                f"(known: {', '.join(_TITLES)})",
            )
        gpu = _GPU_RE.match(name)
        gpus = sum(1 for d, _ in devices if _GPU_RE.match(d))
        if gpu is not None:
            if gpus != len(devices) or int(gpu.group(1)) != gpus or name != f"GPU{gpus}":
                raise TopoTextError(
                    line,
                    column,
                    f"expected {'GPU' + str(gpus) if gpus == len(devices) else 'no GPU column'} "
                    f"here (GPU columns come first, in index order), got {show_value(name)}",
                )
            if gpus >= MAX_GPUS:
                raise TopoTextError(line, column, f"more than {MAX_GPUS} GPUs")
        elif any(d == name for d, _ in devices):
            raise TopoTextError(line, column, f"a second column {show_value(name)}")
        devices.append((name, column))
    return devices, affinity


def _cell(token: Token, row: int, col: int, line: int) -> Cell | None:
    text, column = token
    where = f"row GPU{row}, column GPU{col}"
    if row == col:
        if text != "X":
            raise TopoTextError(line, column, f"{where}: the diagonal must be X, got {text!r}")
        return None
    if text == "X":
        raise TopoTextError(line, column, f"{where}: X belongs on the diagonal only")
    nvlinks: int | None = None
    pcie: Pcie | None = None
    for part in text.split("+"):
        nv = _NV_RE.match(part)
        if nv is not None and nvlinks is None:
            nvlinks = int(nv.group(1))
            if not 1 <= nvlinks <= MAX_NVLINKS:
                raise TopoTextError(
                    line, column, f"{where}: NVLink count must be 1..{MAX_NVLINKS}, got {text!r}"
                )
            continue
        if part in PCIE_WORDS and pcie is None:
            pcie = PCIE_WORDS[part]
            continue
        raise TopoTextError(
            line, column, f"{where}: unknown cell {show_value(text)}: expected {_CELLS}"
        )
    return Cell(nvlinks or 0, pcie, text, line, column)


def _check_symmetric(cells: list[list[Cell | None]]) -> None:
    for i, row in enumerate(cells):
        for j in range(i + 1, len(row)):
            a, b = cells[i][j], cells[j][i]
            assert a is not None and b is not None
            if (a.nvlinks, a.pcie) != (b.nvlinks, b.pcie):
                raise TopoTextError(
                    a.line,
                    a.column,
                    f"row GPU{i}, column GPU{j} says {a.text!r} but row GPU{j}, column GPU{i} "
                    f"says {b.text!r}: the matrix must be symmetric",
                )


def _affinities(
    titles: list[str],
    values: list[list[Token | None]],
    rows: list[tuple[int, list[Token]]],
    lines: Sequence[str],
) -> dict[str, tuple[object, ...]]:
    """Each affinity column, read per GPU, by title."""
    out: dict[str, tuple[object, ...]] = {}
    for position, title in enumerate(titles):
        column: list[object] = []
        for i, given in enumerate(values):
            number = rows[i][0]
            token = given[position]
            if token is None:
                end = len(lines[number - 1]) + 1
                raise TopoTextError(number, end, f"row GPU{i} has no {title!r} value")
            column.append(_affinity(title, token, i, number))
        out[title] = tuple(column)
    return out


def _affinity(title: str, token: Token, gpu: int, line: int) -> object:
    text, column = token
    if text == "N/A":
        return None
    limit = {CPU_AFFINITY: MAX_CPUS - 1, NUMA_AFFINITY: MAX_NUMA_NODES - 1}.get(
        title, MAX_NUMA_NODES - 1
    )
    try:
        ids = parse_cpu_list(text, limit)
        if not ids:
            raise ValueError("empty")
        if title == GPU_NUMA_ID:
            if len(ids) != 1 or not text.isdigit():
                raise ValueError("not one node id")
            return ids[0]
        return ids
    except ValueError as exc:
        what = "CPU list" if title == CPU_AFFINITY else "NUMA node list"
        raise TopoTextError(
            line,
            column,
            f"row GPU{gpu}: {title} {show_value(text)} is not a {what} or N/A ({exc})",
        ) from None


# --- what the text implies -------------------------------------------------------------------


@dataclass(frozen=True)
class LayoutGuess:
    """NUMA node of each GPU, the NUMA node count and the CPUs a text implies.

    ``cpus`` is None when the text has no CPU lists. ``notes`` say what was guessed, for a
    comment in a node file; ``gpu_notes`` the same per GPU.
    """

    numa: tuple[int | None, ...]
    numa_nodes: int
    cpus: CpuForm | None
    notes: tuple[str, ...] = ()
    gpu_notes: tuple[str | None, ...] = ()


def guess_layout(table: TopoTable) -> LayoutGuess:
    """NUMA nodes and CPUs from the affinity columns.

    - ``NUMA Affinity`` gives each GPU's NUMA node; ``N/A`` gives none; a range (``6-7``, a GPU
      whose nearest CPUs span two nodes) gives its first node, as sysfs names one node per PCI
      device.
    - ``CPU Affinity`` lists give the CPUs (:func:`~nvplugin.nodefile.cpus.fit_affinities`).
    - Drivers without the NUMA Affinity column: each distinct CPU list that shares no CPU with
      another is one NUMA node, numbered as the fitted CPU layout numbers it.
    """
    n = table.size
    notes: list[str] = []
    gpu_notes: list[str | None] = [None] * n
    cpus = table.cpu_affinity or (None,) * n
    if table.numa_affinity is not None:
        numa: list[int | None] = []
        labeled: dict[tuple[int, ...], tuple[int, ...]] = {}
        conflict = False
        for i, nodes in enumerate(table.numa_affinity):
            numa.append(None if nodes is None else nodes[0])
            if nodes is not None and len(nodes) > 1:
                gpu_notes[i] = (
                    f"NUMA Affinity {_span(nodes)}: numa_node is the first; sysfs names one "
                    f"node, see /sys/bus/pci/devices/<bus id>/numa_node"
                )
            listed = cpus[i]
            if (
                nodes is not None
                and listed is not None
                and labeled.setdefault(nodes, listed) != listed
            ):
                conflict = True
        named = [node for nodes in table.numa_affinity if nodes for node in nodes]
        least = max(named) + 1 if named else 1
        unlabeled = []
        seen = sorted({cpu for c in cpus if c is not None for cpu in c})
        if not labeled and seen:  # no GPU names a NUMA node: their CPUs are one node's
            unlabeled = [tuple(seen)]
        fit = None if conflict else fit_affinities(labeled, unlabeled, least)
        if conflict:
            notes.append(
                "GPUs of the same NUMA Affinity show different CPU Affinity lists, so the CPUs "
                "are not taken from them"
            )
        if fit is None:
            return LayoutGuess(tuple(numa), least, None, tuple(notes), tuple(gpu_notes))
        return LayoutGuess(
            tuple(numa), fit.numa_nodes, fit.cpus, (*notes, *fit.notes), tuple(gpu_notes)
        )
    distinct = sorted({c for c in cpus if c is not None})
    alone = [c for c in distinct if all(c == d or not set(c) & set(d) for d in distinct)]
    fit = fit_affinities({}, alone, 1) if alone else None
    if fit is None:
        return LayoutGuess((None,) * n, 1, None)
    label = dict(zip(alone, fit.labels, strict=True))
    numa_of = tuple(label.get(c) if c is not None else None for c in cpus)
    notes.append(
        "numa_node: this nvidia-smi prints no NUMA Affinity column, so each distinct CPU "
        "Affinity list is a NUMA node, numbered as the CPU layout below numbers it"
    )
    for i, c in enumerate(cpus):
        if c is not None and c not in label:
            gpu_notes[i] = "its CPU Affinity overlaps another GPU's: NUMA node unknown"
    return LayoutGuess(numa_of, fit.numa_nodes, fit.cpus, (*notes, *fit.notes), tuple(gpu_notes))


def _span(nodes: tuple[int, ...]) -> str:
    return (
        f"{nodes[0]}-{nodes[-1]}"
        if nodes == tuple(range(nodes[0], nodes[-1] + 1))
        else (",".join(map(str, nodes)))
    )


def guess_nvswitch(table: TopoTable) -> tuple[int, ...] | None:
    """NVLinks each GPU has into an NVSwitch fabric, where direct links cannot explain the text.

    A GPU whose NV<k> cells add up to more than a GPU has links (18) reaches its peers through
    NVSwitches; among such GPUs every pair must show NV<min of the two> (what the fabric gives,
    a GPU with failed links showing fewer), and each has the most it shows. None when no GPU
    needs a fabric, or the text is not consistent with one.
    """
    n = table.size
    nv = [[0 if c is None else c.nvlinks for c in row] for row in table.cells]
    fabric_gpus = [i for i in range(n) if sum(nv[i]) > MAX_NVLINKS]
    if not fabric_gpus:
        return None
    links = [0] * n
    for i in fabric_gpus:
        links[i] = max(nv[i][j] for j in fabric_gpus if j != i) if len(fabric_gpus) > 1 else 0
    for x, i in enumerate(fabric_gpus):
        for j in fabric_gpus[x + 1 :]:
            if nv[i][j] != min(links[i], links[j]):
                return None
    if not all(links[i] for i in fabric_gpus):
        return None
    return tuple(links)
