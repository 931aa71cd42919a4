"""Writing node files: what ``nvplugin node import`` and ``nvplugin node capture`` print.

The output is the same plain YAML people write by hand (one GPU per line, the link matrix under
``links: |2``), with comments saying where each value came from and what was guessed, and it is
always read back through :func:`~nvplugin.nodefile.reader.parse_node` before anyone sees it.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import yaml

from nvplugin.node.model import Driver, format_cpu_list
from nvplugin.nodefile.cpus import CpuForm, CpuLists
from nvplugin.nodefile.reader import VERSION

WIDTH = 99
_PLAIN_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._()/+-]*$")


@dataclass(frozen=True)
class GpuDraft:
    """One ``gpus`` entry: its fields in the order written, and an optional trailing comment."""

    fields: tuple[tuple[str, object], ...]
    comment: str | None = None


@dataclass(frozen=True)
class NodeDraft:
    """A node file to write. ``cells[i][j]`` is the links cell text (``X`` on the diagonal);
    ``notes`` holds comment lines written above a top-level key (and ``""``: the file);
    ``machine`` and ``driver`` are written when given."""

    name: str
    gpus: tuple[GpuDraft, ...]
    cells: tuple[tuple[str, ...], ...]
    numa_distances: tuple[tuple[int, ...], ...] | None = None
    cpus: CpuForm | None = None
    notes: Mapping[str, Sequence[str]] = field(default_factory=dict)
    memory_mib: int | None = None
    """The host's memory (MiB), as the kubelet reports it; None: not written."""
    machine: str | None = None
    driver: Driver | None = None


def scalar(value: object) -> str:
    """``value`` as a YAML flow scalar: plain when that reads back the same, else quoted; a
    list or tuple as a flow sequence of them (a GPU's ``mig`` profiles)."""
    if isinstance(value, list | tuple):
        return "[" + ", ".join(scalar(item) for item in value) + "]"
    if value is None:
        return "null"
    if isinstance(value, bool | int):
        return json.dumps(value)
    text = str(value)
    if _PLAIN_RE.match(text) and text == text.strip() and yaml.safe_load(text) == text:
        return text
    return json.dumps(text)


def comment(text: str, indent: str = "") -> list[str]:
    """``text`` as ``#`` comment lines of at most :data:`WIDTH` characters."""
    return textwrap.wrap(
        text,
        WIDTH,
        initial_indent=f"{indent}# ",
        subsequent_indent=f"{indent}# ",
        break_on_hyphens=False,
        break_long_words=False,
    )


def render(draft: NodeDraft) -> str:
    """The node-file text of ``draft``."""
    notes = draft.notes
    out: list[str] = []

    def section(key: str) -> None:
        for note in notes.get(key, ()):
            out.extend(comment(note))

    section("")
    out += [f"version: {VERSION}", f"name: {scalar(draft.name)}"]
    if draft.memory_mib is not None:
        section("memory_mib")
        out.append(f"memory_mib: {draft.memory_mib}")
    if draft.machine is not None:
        out.append(f"machine: {scalar(draft.machine)}")
    if draft.driver is not None:
        cuda = f"{draft.driver.cuda[0]}.{draft.driver.cuda[1]}"
        out.append(f"driver: {{version: {scalar(draft.driver.version)}, cuda: {scalar(cuda)}}}")
    if draft.numa_distances is not None:
        section("numa_distances")
        rows = [f"[{', '.join(map(str, row))}]" for row in draft.numa_distances]
        if len(rows) <= 4:
            out.append(f"numa_distances: [{', '.join(rows)}]")
        else:
            out.append("numa_distances:")
            out += [f"  - {row}" for row in rows]
    if draft.cpus is not None:
        section("cpus")
        out += _cpus(draft.cpus)
    section("gpus")
    out.append("gpus:")
    for gpu in draft.gpus:
        entry = "  - {" + ", ".join(f"{k}: {scalar(v)}" for k, v in gpu.fields) + "}"
        out.append(f"{entry}  # {gpu.comment}" if gpu.comment else entry)
    section("links")
    out.append("links: |2")
    out += ["  " + line for line in matrix(draft.cells)]
    return "\n".join(out) + "\n"


def _cpus(form: CpuForm) -> list[str]:
    if not isinstance(form, CpuLists):
        return [
            f"cpus: {{sockets: {form.sockets}, cores_per_socket: {form.cores_per_socket}, "
            f"threads_per_core: {form.threads_per_core}}}"
        ]

    def lists(cpus: Sequence[Sequence[int]]) -> str:
        return "[" + ", ".join(json.dumps(format_cpu_list(c)) for c in cpus) + "]"

    return [
        "cpus:",
        f"  numa_cpus: {lists(form.numa_cpus)}",
        f"  socket_cpus: {lists(form.socket_cpus)}",
        f"  threads_per_core: {form.threads_per_core}",
    ]


def matrix(cells: Sequence[Sequence[str]]) -> list[str]:
    """The link matrix as ``nvidia-smi topo -m`` lays it out: header, then one row per GPU."""
    n = len(cells)
    first = max(len(f"GPU{n - 1}"), 4) + 2
    width = max([len(f"GPU{n - 1}"), *(len(c) for row in cells for c in row)]) + 2
    lines = [" " * first + "".join(f"GPU{j}".ljust(width) for j in range(n)).rstrip()]
    for i, row in enumerate(cells):
        lines.append((f"GPU{i}".ljust(first) + "".join(c.ljust(width) for c in row)).rstrip())
    return lines
