"""``nvplugin node import``: a node file from the text of ``nvidia-smi topo -m``.

The text gives the GPU matrix, and in its affinity columns each GPU's NUMA node and CPUs (read
by :mod:`nvplugin.nodefile.topotext`). What it does not give comes from the optional CSV of
``nvidia-smi --query-gpu=index,name,uuid,memory.total,pci.bus_id --format=csv`` (models, UUIDs,
memory, bus ids), or takes the node file's defaults. Every value that is inferred rather than
read is said so in a comment of the file, so the user knows what to check.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass

from nvplugin.errors import InputError
from nvplugin.errors import show as show_value
from nvplugin.nodefile.reader import parse_node
from nvplugin.nodefile.topotext import (
    TopoTable,
    TopoTextError,
    guess_layout,
    guess_nvswitch,
    parse_topo,
)
from nvplugin.nodefile.writer import GpuDraft, NodeDraft, render

PLACEHOLDER_NAME = "NVIDIA GPU"
GPU_QUERY = "nvidia-smi --query-gpu=index,name,uuid,memory.total,pci.bus_id --format=csv"
_CSV_COLUMNS = ("index", "name", "uuid", "memory.total", "pci.bus_id")
_FIELD_OF = {
    "name": "name",
    "uuid": "uuid",
    "memory.total": "memory_mib",
    "pci.bus_id": "pci_bus_id",
}


@dataclass(frozen=True)
class Source:
    """An input's text and how messages name it (``topo file x.txt``, ``standard input``)."""

    text: str
    name: str


def import_topo(topo: Source, node_name: str, gpus: Source | None = None) -> str:
    """The node-file text for ``topo``; InputError naming the input, line and column."""
    try:
        table = parse_topo(topo.text)
    except TopoTextError as exc:
        raise InputError(f"{topo.name}: {exc}") from None
    details = parse_gpu_csv(gpus, table.size) if gpus is not None else None
    text = render(_draft(table, node_name, topo, gpus, details))
    parse_node(text, f"the node file imported from {topo.name}")  # never print a bad file
    return text


def _draft(
    table: TopoTable,
    node_name: str,
    topo: Source,
    gpus: Source | None,
    details: list[dict[str, object]] | None,
) -> NodeDraft:
    guess = guess_layout(table)
    fabric = guess_nvswitch(table)
    n = table.size
    header = [f"Imported by `nvplugin node import` from {topo.name} (nvidia-smi topo -m)."]
    if details is None:
        header.append(
            f"GPU names are placeholders, and uuid, memory_mib and pci_bus_id take the node-file "
            f"defaults: give --gpus the CSV of `{GPU_QUERY}` for the real ones."
        )
    else:
        header.append(f"Models, UUIDs, memory and bus ids from {gpus.name if gpus else ''}.")
    if table.gpu_numa_id is not None and any(g is not None for g in table.gpu_numa_id):
        own = ", ".join(f"GPU{i}: {g}" for i, g in enumerate(table.gpu_numa_id) if g is not None)
        header.append(
            f"GPU NUMA ID (a GPU's own memory as a NUMA node without CPUs) is not modelled: {own}."
        )
    notes: dict[str, list[str]] = {"": header}
    if guess.numa_nodes > 1:
        notes["numa_distances"] = [
            "numa_distances are placeholders (nvidia-smi topo -m does not show them): 10 to "
            "itself, 20 to others; the real ones are in /sys/devices/system/node/node*/distance."
        ]
    notes["cpus"] = list(guess.notes)
    if guess.cpus is None:
        notes["cpus"].append(
            "the text has no CPU Affinity column, so cpus take the node-file default"
        )
    drafts = []
    for i in range(n):
        fields: list[tuple[str, object]] = [("name", PLACEHOLDER_NAME)]
        if details is not None:
            fields = [(k, v) for k, v in details[i].items()]
        fields.append(("numa_node", guess.numa[i]))
        if fabric is not None and fabric[i]:
            fields.append(("nvswitch_links", fabric[i]))
        gpu_note = guess.gpu_notes[i] if guess.gpu_notes else None
        drafts.append(GpuDraft(tuple(fields), gpu_note))
    if fabric is not None:
        members = [i for i in range(n) if fabric[i]]
        notes["gpus"] = [
            f"nvswitch_links inferred: GPUs {_span(members)} show NV<k> to each other, more "
            f"NVLinks than a GPU has, so they reach each other through NVSwitches."
        ]
    cells = tuple(
        tuple("X" if c is None else _cell_text(c.nvlinks, c.pcie) for c in row)
        for row in table.cells
    )
    if any(c is not None and c.nvlinks and c.pcie is None for row in table.cells for c in row):
        notes["links"] = [
            "NV<k> alone: nvidia-smi hides the PCIe relation of NVLink pairs; such a cell reads "
            "as NODE within a NUMA node, SYS across (nvplugin node capture records it)."
        ]
    distances = tuple(
        tuple(10 if a == b else 20 for b in range(guess.numa_nodes))
        for a in range(guess.numa_nodes)
    )
    return NodeDraft(node_name, tuple(drafts), cells, distances, guess.cpus, notes)


def _cell_text(nvlinks: int, pcie: object) -> str:
    name = getattr(pcie, "name", None)
    if nvlinks and name:
        return f"NV{nvlinks}+{name}"
    return f"NV{nvlinks}" if nvlinks else str(name)


def _span(indices: Sequence[int]) -> str:
    if list(indices) == list(range(indices[0], indices[-1] + 1)):
        return f"{indices[0]}-{indices[-1]}"
    return ", ".join(map(str, indices))


def parse_gpu_csv(source: Source, count: int) -> list[dict[str, object]]:
    """Per GPU index 0..count-1: its name, uuid, memory_mib, pci_bus_id from the CSV.

    Reads ``--format=csv`` (with its header, any column order, ``[MiB]`` units) and
    ``--format=csv,noheader[,nounits]`` (the columns in :data:`GPU_QUERY`'s order).
    """
    rows = [
        (number, row)
        for number, row in enumerate(csv.reader(source.text.splitlines(), skipinitialspace=True), 1)
        if any(cell.strip() for cell in row)
    ]
    if not rows:
        raise InputError(f"{source.name}: no GPUs (expected the output of `{GPU_QUERY}`)")
    titles = list(_CSV_COLUMNS)
    if rows[0][1][0].strip().lower() == "index":
        number, header = rows.pop(0)
        titles = []
        for position, title in enumerate(header, 1):
            plain = title.strip().split(" [")[0].lower()
            if plain not in _CSV_COLUMNS or plain in titles:
                raise InputError(
                    f"{source.name}: line {number}, column {position}: "
                    f"{'a second' if plain in titles else 'unknown'} column {show_value(title)} "
                    f"(expected the columns of `{GPU_QUERY}`)"
                )
            titles.append(plain)
    gpus: dict[int, dict[str, object]] = {}
    for number, row in rows:
        if len(row) != len(titles):
            raise InputError(
                f"{source.name}: line {number}: {len(row)} values for the {len(titles)} columns "
                f"{', '.join(titles)}"
            )
        values = dict(zip(titles, (cell.strip() for cell in row), strict=True))
        index = _csv_index(values.get("index"), source.name, number, titles, count)
        if index in gpus:
            raise InputError(f"{source.name}: line {number}: a second line for GPU {index}")
        gpu: dict[str, object] = {"name": PLACEHOLDER_NAME}
        for title, value in values.items():
            if title == "index" or value in ("", "[N/A]", "N/A"):
                continue
            if title == "memory.total":
                gpu["memory_mib"] = _mib(value, source.name, number, titles.index(title) + 1)
            else:
                gpu[_FIELD_OF[title]] = value
        gpus[index] = gpu
    missing = [i for i in range(count) if i not in gpus]
    if missing:
        raise InputError(
            f"{source.name}: no line for GPU {missing[0]} (the topo text has GPU0..GPU{count - 1})"
        )
    order = ("name", "uuid", "memory_mib", "pci_bus_id")
    return [{k: gpus[i][k] for k in order if k in gpus[i]} for i in range(count)]


def _csv_index(value: str | None, name: str, line: int, titles: list[str], count: int) -> int:
    if value is None:
        raise InputError(f"{name}: no index column (expected the columns of `{GPU_QUERY}`)")
    column = titles.index("index") + 1
    if not value.isdigit() or int(value) >= count:
        raise InputError(
            f"{name}: line {line}, column {column}: index {show_value(value)} is not a GPU of the "
            f"topo text (GPU0..GPU{count - 1})"
        )
    return int(value)


def _mib(value: str, name: str, line: int, column: int) -> int:
    number = value.removesuffix("MiB").strip()
    if not number.isdigit() or not 0 < int(number) <= 1 << 24:
        raise InputError(
            f"{name}: line {line}, column {column}: memory.total {show_value(value)} is not a "
            "size in MiB"
        )
    return int(number)
