"""Node files: a simulated node described in YAML, parsed and validated strictly.

A node file is a contract users write by hand (often by pasting ``nvidia-smi topo -m``), so every
mistake gets one message naming the file, the field (or matrix row/column) and the value, and
nothing is silently ignored: unknown keys, duplicate keys and wrong types are errors.

Defaults, chosen so a pasted matrix "just works":

- ``uuid``: ``GPU-`` + a UUID derived (SHA-1) from the node name, the GPU's name and its index:
  stable across runs, distinct per GPU.
- ``pci_bus_id``: ``00000000:<0x10 + index>:00.0`` (NVML's 8-digit domain form).
- ``memory_mib``: 16384.
- ``numa_node``: unknown (null).
- A links cell with only ``NV<k>`` gets ``NODE`` when both GPUs report the same NUMA node, else
  ``SYS``.
- ``numa_distances``: NUMA nodes 0..max(numa_node named by a GPU) (one node 0 when no GPU names
  one), distance 10 to self and 20 otherwise.
- ``cpus``: one socket per NUMA node, 16 cores per socket, 2 threads per core, numbered the way
  Linux numbers x86 servers (:meth:`CpuLayout.build`).

MIG: a GPU may carry ``mig: [<profile>, ...]``. The key present means MIG mode on (``mig: []``:
on, no instances yet), absent means off. Each profile is one GPU instance with one compute
instance spanning it, in MIG index order; the list is checked against the model's profile table
(:mod:`nvplugin.node.mig`) and laid out as the driver would place it. A GPU with ``mig`` and no
``memory_mib`` gets its model's memory (profile names depend on it).
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid as uuidlib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, NoReturn

from nvplugin import yamlinput
from nvplugin.errors import InputError, shortened
from nvplugin.errors import show as show_value
from nvplugin.node.mig import MIG_MODELS, MigInstance, MigLayoutError, lay_out, mig_model
from nvplugin.node.mig import simulated_devices as simulated_mig_devices
from nvplugin.node.model import MAX_NVLINKS, CpuLayout, Gpu, Link, Pcie, Topology

MAX_GPUS = 128
MAX_NUMA_NODES = 64
MAX_CPUS = 4096
DEFAULT_MEMORY_MIB = 16384
DEFAULT_CORES_PER_SOCKET = 16
DEFAULT_THREADS_PER_CORE = 2

_TOP_KEYS = ("version", "name", "numa_distances", "cpus", "gpus", "links", "events")
_GPU_KEYS = ("name", "uuid", "memory_mib", "pci_bus_id", "numa_node", "nvswitch_links", "mig")
_CPU_KEYS = ("sockets", "cores_per_socket", "threads_per_core")
_EVENT_KEYS = ("after_s", "gpu", "xid", "lost", "recover", "wait_error", "for_s")
_PCI_RE = re.compile(r"^([0-9a-fA-F]{1,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
_UUID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_NV_RE = re.compile(r"^NV(\d+)$")
_GPU_RE = re.compile(r"^GPU(\d+)$")


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One simulated GPU. ``nvswitch_links`` = NVLinks into an NVSwitch fabric (0 = none);
    ``mig`` its MIG instances (None: MIG mode off)."""

    index: int
    name: str
    uuid: str
    memory_mib: int
    pci_bus_id: str
    numa_node: int | None
    nvswitch_links: int = 0
    mig: tuple[MigInstance, ...] | None = None


@dataclass(frozen=True, slots=True)
class CpuSpec:
    sockets: int
    cores_per_socket: int
    threads_per_core: int


@dataclass(frozen=True, slots=True)
class EventSpec:
    """A scripted health event; ``after_s`` counts from the simulated ``nvmlInit``.

    Exactly one kind: ``xid`` (an Xid critical error of ``gpu``), ``lost`` (``gpu`` falls off the
    bus), ``recover`` (``gpu`` answers again), ``wait_error`` (the event wait fails for
    ``for_s`` seconds).
    """

    after_s: float
    gpu: int | None = None
    xid: int | None = None
    lost: bool = False
    recover: bool = False
    wait_error: bool = False
    for_s: float = 0.0


@dataclass(frozen=True)
class NodeSpec:
    """A validated node file: what the simulated NVML and sysfs present.

    ``links[i][j]`` holds the link as discovery must find it (NVSwitch pairs included).
    """

    name: str
    source: str
    gpus: tuple[GpuSpec, ...]
    links: tuple[tuple[Link | None, ...], ...]
    numa_distances: tuple[tuple[int, ...], ...]
    cpus: CpuSpec
    cpu_layout: CpuLayout
    events: tuple[EventSpec, ...] = ()

    def direct_nvlinks(self, a: int, b: int) -> int:
        """NVLinks the fake NVML reports as direct GPU-GPU links between ``a`` and ``b``.

        Between two fabric GPUs the links go to the switches instead, so none are direct.
        """
        link = self.links[a][b]
        if link is None:
            return 0
        if self.gpus[a].nvswitch_links and self.gpus[b].nvswitch_links:
            return 0
        return link.nvlinks

    def topology(self) -> Topology:
        """The topology discovery is expected to find on this node."""
        gpus = tuple(
            Gpu(
                g.index,
                g.uuid,
                g.name,
                g.memory_mib,
                g.pci_bus_id,
                g.index,
                g.numa_node,
                g.mig is not None,
                simulated_mig_devices(g.index, g.index, g.uuid, g.mig or ()),
            )
            for g in self.gpus
        )
        return Topology(self.name, gpus, self.links, self.numa_distances, self.cpu_layout)


def builtin_names() -> list[str]:
    """Names of the built-in nodes (``nvplugin/node/nodes/<name>.yaml``), sorted."""
    folder = resources.files("nvplugin.node") / "nodes"
    return sorted(
        entry.name.removesuffix(".yaml")
        for entry in folder.iterdir()
        if entry.name.endswith(".yaml")
    )


def load_node(name_or_path: str) -> NodeSpec:
    """Load a built-in node by name, or a node file by path; raise InputError when bad.

    A bare name (no ``/``, no ``.yaml``/``.yml`` suffix) that is a built-in wins over a file of
    that name in the working directory; write ``./name`` to load the file.
    """
    looks_like_path = (
        os.sep in name_or_path or "/" in name_or_path or name_or_path.endswith((".yaml", ".yml"))
    )
    if not looks_like_path:
        names = builtin_names()
        if name_or_path in names:
            resource = resources.files("nvplugin.node") / "nodes" / f"{name_or_path}.yaml"
            return parse_node(resource.read_text(encoding="utf-8"), f"built-in node {name_or_path}")
        if not os.path.exists(name_or_path):
            raise InputError(
                f"unknown node {name_or_path!r}: not a built-in node "
                f"(built-in nodes: {', '.join(names)}) and no such node file"
            )
    source = f"node file {name_or_path}"
    return parse_node(yamlinput.read_text(name_or_path, source), source)


def parse_node(text: str, source: str) -> NodeSpec:
    """Parse and validate node-file text; ``source`` names it in error messages."""
    return _Parser(source).parse(text)


_LINKS_KEY_RE = re.compile(r"^links:[ \t]*\|([-+]?)[ \t]*(#.*)?$")


def _indent_links_block(text: str) -> str:
    """Give a top-level ``links: |`` block an explicit indentation indicator when needed.

    ``nvidia-smi topo -m`` indents its header row further than the rows below it; YAML takes a
    block's indentation from its first line, so a pasted matrix (and the documented example)
    would end the block at the first row. Indenting the block by its least-indented line keeps
    the text as written, and line numbers in YAML errors stay true.
    """
    lines = text.split("\n")
    for n, line in enumerate(lines):
        match = _LINKS_KEY_RE.match(line)
        if not match:
            continue
        indents = []
        for body in lines[n + 1 :]:
            if not body.strip():
                continue
            indent = len(body) - len(body.lstrip(" "))
            if indent == 0:
                break
            indents.append(indent)
        if indents and indents[0] > min(indents) and min(indents) <= 9:
            lines[n] = f"links: |{min(indents)}{match.group(1)}"
            if match.group(2):
                lines[n] += f" {match.group(2)}"
        break
    return "\n".join(lines)


def _parse_pcie(text: str) -> Pcie | None:
    try:
        return Pcie[text]
    except KeyError:
        return None


class _Parser:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, field: str, problem: str, value: Any = None, *, show: bool = True) -> NoReturn:
        shown = f" (got {show_value(value)})" if show else ""
        raise InputError(f"{self.source}: {field}: {problem}{shown}")

    # -- typed field readers ------------------------------------------------------------------
    def keys(self, data: Any, field: str, allowed: tuple[str, ...]) -> Mapping[str, Any]:
        if not isinstance(data, dict):
            self.fail(field or "top level", "must be a mapping", data)
        for key in data:
            if key not in allowed:
                shown = shortened(str(key), 40)
                where = f"{field}.{shown}" if field else shown
                self.fail(where, f"unknown key (allowed: {', '.join(allowed)})", key)
        return data

    def integer(self, value: Any, field: str, low: int, high: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(field, "must be an integer", value)
        if not low <= value <= high:
            self.fail(field, f"must be between {low} and {high}", value)
        return value

    def number(self, value: Any, field: str, low: float) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.fail(field, "must be a number", value)
        if not value >= low or value != value or value == float("inf"):
            self.fail(field, f"must be a finite number >= {low}", value)
        return float(value)

    def string(self, value: Any, field: str) -> str:
        if not isinstance(value, str) or not value.strip():
            self.fail(field, "must be a non-empty string", value)
        return value

    def flag(self, value: Any, field: str) -> bool:
        if value is not True:
            self.fail(field, "must be true when given", value)
        return True

    # -- the file -----------------------------------------------------------------------------
    def parse(self, text: str) -> NodeSpec:
        data = yamlinput.load(_indent_links_block(text), self.source)
        top = self.keys(data, "", _TOP_KEYS)
        for required in ("version", "name", "gpus", "links"):
            if required not in top:
                self.fail(required, "missing (required)", show=False)
        if top["version"] != 1 or isinstance(top["version"], bool):
            self.fail("version", "must be 1", top["version"])
        name = self.string(top["name"], "name")

        raw_gpus = top["gpus"]
        if not isinstance(raw_gpus, list) or not raw_gpus:
            self.fail("gpus", "must be a non-empty list of GPUs", raw_gpus)
        if len(raw_gpus) > MAX_GPUS:
            self.fail("gpus", f"at most {MAX_GPUS} GPUs", len(raw_gpus))
        gpu_fields = [self.gpu_fields(g, i) for i, g in enumerate(raw_gpus)]

        distances = self.numa_distances(top.get("numa_distances"), gpu_fields)
        gpus = self.gpus(name, gpu_fields, len(distances))
        links = self.links(top["links"], gpus)
        cpus, layout = self.cpus(top.get("cpus"), len(distances))
        events = self.events(top.get("events"), len(gpus))
        return NodeSpec(name, self.source, gpus, links, distances, cpus, layout, events)

    def gpu_fields(self, raw: Any, i: int) -> dict[str, Any]:
        field = f"gpus[{i}]"
        data = dict(self.keys(raw, field, _GPU_KEYS))
        if "name" not in data:
            self.fail(f"{field}.name", "missing (required)", show=False)
        self.string(data["name"], f"{field}.name")
        numa = data.get("numa_node")
        if numa is not None:
            self.integer(numa, f"{field}.numa_node", 0, MAX_NUMA_NODES - 1)
        return data

    def numa_distances(
        self, raw: Any, gpu_fields: list[dict[str, Any]]
    ) -> tuple[tuple[int, ...], ...]:
        if raw is None:
            named = [g["numa_node"] for g in gpu_fields if g.get("numa_node") is not None]
            count = max(named) + 1 if named else 1
            return tuple(tuple(10 if a == b else 20 for b in range(count)) for a in range(count))
        if not isinstance(raw, list) or not raw:
            self.fail("numa_distances", "must be a non-empty list of rows", raw)
        if len(raw) > MAX_NUMA_NODES:
            self.fail("numa_distances", f"at most {MAX_NUMA_NODES} NUMA nodes", len(raw))
        rows = []
        for a, row in enumerate(raw):
            field = f"numa_distances[{a}]"
            if not isinstance(row, list) or len(row) != len(raw):
                self.fail(field, f"must be a list of {len(raw)} distances (square matrix)", row)
            values = []
            for b, value in enumerate(row):
                cell = f"{field}[{b}]"
                if a == b:
                    if value != 10 or isinstance(value, bool):
                        self.fail(cell, "a node's distance to itself must be 10", value)
                    values.append(10)
                else:
                    values.append(self.integer(value, cell, 11, 255))
            rows.append(tuple(values))
        return tuple(rows)

    def gpus(self, node: str, fields: list[dict[str, Any]], numa_count: int) -> tuple[GpuSpec, ...]:
        gpus: list[GpuSpec] = []
        uuids: dict[str, int] = {}
        buses: dict[str, int] = {}
        for i, data in enumerate(fields):
            field = f"gpus[{i}]"
            name = data["name"]
            if "uuid" in data:
                uuid = self.string(data["uuid"], f"{field}.uuid")
                if not _UUID_RE.match(uuid):
                    self.fail(f"{field}.uuid", "may hold only letters, digits, '.', '_', '-'", uuid)
            else:
                digest = hashlib.sha1(f"{node}/{name}/{i}".encode()).digest()[:16]
                uuid = f"GPU-{uuidlib.UUID(bytes=digest)}"
            if uuid in uuids:
                self.fail(f"{field}.uuid", f"duplicate: gpus[{uuids[uuid]}] has it too", uuid)
            uuids[uuid] = i
            memory = DEFAULT_MEMORY_MIB
            if "memory_mib" in data:
                memory = self.integer(data["memory_mib"], f"{field}.memory_mib", 1, 1 << 24)
            mig = None
            if "mig" in data:
                mig, memory = self.mig(data, i, memory if "memory_mib" in data else None)
            if "pci_bus_id" in data:
                raw_bus = self.string(data["pci_bus_id"], f"{field}.pci_bus_id")
                match = _PCI_RE.match(raw_bus)
                if not match:
                    self.fail(
                        f"{field}.pci_bus_id",
                        "must look like 00000000:18:00.0 (domain:bus:dev.fn)",
                        raw_bus,
                    )
                domain, bus, dev, fn = (int(part, 16) for part in match.groups())
                if dev > 0x1F:
                    self.fail(f"{field}.pci_bus_id", "device number must be 00..1f", raw_bus)
                bus_id = f"{domain:08X}:{bus:02X}:{dev:02X}.{fn:X}"
            else:
                if 0x10 + i > 0xFF:
                    self.fail(f"{field}.pci_bus_id", "required beyond 240 GPUs", show=False)
                bus_id = f"00000000:{0x10 + i:02X}:00.0"
            if bus_id in buses:
                self.fail(
                    f"{field}.pci_bus_id", f"duplicate: gpus[{buses[bus_id]}] has it too", bus_id
                )
            buses[bus_id] = i
            numa = data.get("numa_node")
            if numa is not None and numa >= numa_count:
                self.fail(
                    f"{field}.numa_node",
                    f"not a NUMA node of numa_distances (nodes 0..{numa_count - 1})",
                    numa,
                )
            switch = 0
            if "nvswitch_links" in data:
                switch = self.integer(
                    data["nvswitch_links"], f"{field}.nvswitch_links", 0, MAX_NVLINKS
                )
            gpus.append(GpuSpec(i, name, uuid, memory, bus_id, numa, switch, mig))
        return tuple(gpus)

    def mig(
        self, data: dict[str, Any], i: int, memory: int | None
    ) -> tuple[tuple[MigInstance, ...], int]:
        """``gpus[i].mig``: the instances laid out on the GPU's model, and the GPU's memory
        (the model's when ``memory_mib`` is not given)."""
        field = f"gpus[{i}].mig"
        name = data["name"]
        model = mig_model(name)
        if model is None:
            labels = ", ".join(m.label for m in MIG_MODELS)
            self.fail(
                field,
                f"GPU{i} ({shortened(name, 60)}) has no MIG profile table (MIG models: "
                f"{labels}); remove mig, or name one of their GPUs",
                show=False,
            )
        raw = data["mig"]
        if not isinstance(raw, list):
            self.fail(field, "must be a list of MIG profile names ([] = MIG on, no instances)", raw)
        if len(raw) > model.compute_slices:
            self.fail(
                field,
                f"GPU{i} ({model.label}) holds at most {model.compute_slices} MIG devices",
                len(raw),
            )
        for j, profile in enumerate(raw):
            self.string(profile, f"{field}[{j}]")
        if memory is not None and memory != model.memory_mib:
            self.fail(
                f"gpus[{i}].memory_mib",
                f"GPU{i} is a {model.label} with MIG: its memory is {model.memory_mib} MiB, which "
                "its MIG profile names depend on (leave memory_mib out to use it)",
                memory,
            )
        try:
            instances = lay_out(model, raw)
        except MigLayoutError as exc:
            where = field if exc.at is None else f"{field}[{exc.at}]"
            self.fail(where, f"GPU{i}: {exc}", show=False)
        return instances, model.memory_mib

    def cell(self, text: str, row: int, col: int, gpus: tuple[GpuSpec, ...]) -> Link:
        where = f"links row GPU{row} column GPU{col}"
        nvlinks: int | None = None
        pcie: Pcie | None = None
        allowed = "NV<k> (1..18) and/or one of INT, PIX, PXB, PHB, NODE, SYS joined by '+'"
        for part in text.split("+"):
            nv = _NV_RE.match(part)
            if nv and nvlinks is None:
                nvlinks = int(nv.group(1))
                if not 1 <= nvlinks <= MAX_NVLINKS:
                    self.fail(where, f"NVLink count must be 1..{MAX_NVLINKS}", text)
                continue
            kind = _parse_pcie(part)
            if kind is None or pcie is not None:
                self.fail(where, f"unknown cell: expected {allowed}", text)
            pcie = kind
        if pcie is None:
            a, b = gpus[row].numa_node, gpus[col].numa_node
            pcie = Pcie.NODE if a is not None and a == b else Pcie.SYS
        return Link(pcie, nvlinks or 0)

    def links(self, raw: Any, gpus: tuple[GpuSpec, ...]) -> tuple[tuple[Link | None, ...], ...]:
        if not isinstance(raw, str):
            self.fail(
                "links", "must be a text block (nvidia-smi topo -m style, use 'links: |')", raw
            )
        lines = [line.split() for line in raw.splitlines() if line.strip()]
        if not lines:
            self.fail("links", "is empty", raw)
        header = lines[0]
        for position, title in enumerate(header):
            if title != f"GPU{position}":
                self.fail(
                    f"links header column {position + 1}",
                    f"expected GPU{position} (GPU columns only, in index order)",
                    title,
                )
        n = len(header)
        if n != len(gpus):
            self.fail(
                "links",
                f"matrix has {n} GPU columns but gpus lists {len(gpus)} GPUs",
                " ".join(header),
            )
        rows = lines[1:]
        if len(rows) != n:
            self.fail("links", f"matrix has {len(rows)} rows for {n} columns (must be square)", raw)
        cells: list[list[Link | None]] = []
        for i, row in enumerate(rows):
            if row[0] != f"GPU{i}":
                self.fail(f"links row {i + 1}", f"expected row title GPU{i}", row[0])
            if len(row) - 1 != n:
                self.fail(
                    f"links row GPU{i}",
                    f"has {len(row) - 1} cells, expected {n} (must be square)",
                    " ".join(row[1:]),
                )
            parsed: list[Link | None] = []
            for j, text in enumerate(row[1:]):
                if i == j:
                    if text != "X":
                        self.fail(f"links row GPU{i} column GPU{j}", "diagonal must be X", text)
                    parsed.append(None)
                elif text == "X":
                    self.fail(
                        f"links row GPU{i} column GPU{j}", "X only belongs on the diagonal", text
                    )
                else:
                    parsed.append(self.cell(text, i, j, gpus))
            cells.append(parsed)
        for i in range(n):
            for j in range(i + 1, n):
                if cells[i][j] != cells[j][i]:
                    self.fail(
                        f"links row GPU{i} column GPU{j}",
                        f"asymmetric: row GPU{j} column GPU{i} says {rows[j][i + 1]!r}",
                        rows[i][j + 1],
                    )
        self.check_nvlinks(cells, gpus, rows)
        return tuple(tuple(row) for row in cells)

    def check_nvlinks(
        self, cells: list[list[Link | None]], gpus: tuple[GpuSpec, ...], rows: list[list[str]]
    ) -> None:
        """NVSwitch pairs must say min(links of each); no GPU may exceed its link budget."""
        for i, gpu in enumerate(gpus):
            direct = 0
            for j, other in enumerate(gpus):
                link = cells[i][j]
                if link is None:
                    continue
                if gpu.nvswitch_links and other.nvswitch_links:
                    expected = min(gpu.nvswitch_links, other.nvswitch_links)
                    if link.nvlinks != expected:
                        self.fail(
                            f"links row GPU{i} column GPU{j}",
                            f"both GPUs reach the NVSwitch fabric (nvswitch_links "
                            f"{gpu.nvswitch_links} and {other.nvswitch_links}), so the cell must "
                            f"say NV{expected}",
                            rows[i][j + 1],
                        )
                else:
                    direct += link.nvlinks
            total = direct + gpu.nvswitch_links
            if total > MAX_NVLINKS:
                self.fail(
                    f"gpus[{i}]",
                    f"GPU{i} has {total} NVLinks in all (direct links in its links row plus "
                    f"nvswitch_links); a GPU has at most {MAX_NVLINKS}",
                    total,
                )

    def cpus(self, raw: Any, numa_count: int) -> tuple[CpuSpec, CpuLayout]:
        if raw is None:
            spec = CpuSpec(numa_count, DEFAULT_CORES_PER_SOCKET, DEFAULT_THREADS_PER_CORE)
        else:
            data = self.keys(raw, "cpus", _CPU_KEYS)
            for key in _CPU_KEYS:
                if key not in data:
                    self.fail(f"cpus.{key}", "missing (required)", show=False)
            spec = CpuSpec(
                self.integer(data["sockets"], "cpus.sockets", 1, 64),
                self.integer(data["cores_per_socket"], "cpus.cores_per_socket", 1, 1024),
                self.integer(data["threads_per_core"], "cpus.threads_per_core", 1, 8),
            )
        total = spec.sockets * spec.cores_per_socket * spec.threads_per_core
        if total > MAX_CPUS:
            self.fail("cpus", f"at most {MAX_CPUS} logical CPUs", total)
        try:
            layout = CpuLayout.build(
                spec.sockets, spec.cores_per_socket, spec.threads_per_core, numa_count
            )
        except ValueError as exc:
            self.fail("cpus", f"does not fit {numa_count} NUMA node(s): {exc}", raw)
        return spec, layout

    def events(self, raw: Any, gpu_count: int) -> tuple[EventSpec, ...]:
        if raw is None:
            return ()
        if not isinstance(raw, list):
            self.fail("events", "must be a list", raw)
        events = []
        for n, item in enumerate(raw):
            field = f"events[{n}]"
            data = self.keys(item, field, _EVENT_KEYS)
            if "after_s" not in data:
                self.fail(f"{field}.after_s", "missing (required)", show=False)
            after = self.number(data["after_s"], f"{field}.after_s", 0.0)
            kinds = [k for k in ("xid", "lost", "recover", "wait_error") if k in data]
            if len(kinds) != 1:
                self.fail(
                    field, "needs exactly one of xid, lost, recover, wait_error", ", ".join(kinds)
                )
            kind = kinds[0]
            if kind == "wait_error":
                self.flag(data["wait_error"], f"{field}.wait_error")
                if "gpu" in data:
                    self.fail(f"{field}.gpu", "a wait_error event has no gpu", data["gpu"])
                if "for_s" not in data:
                    self.fail(f"{field}.for_s", "missing (required with wait_error)", show=False)
                for_s = self.number(data["for_s"], f"{field}.for_s", 0.0)
                events.append(EventSpec(after, wait_error=True, for_s=for_s))
                continue
            if "for_s" in data:
                self.fail(f"{field}.for_s", "only a wait_error event has for_s", data["for_s"])
            if "gpu" not in data:
                self.fail(f"{field}.gpu", f"missing (required with {kind})", show=False)
            gpu = data["gpu"]
            if isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 <= gpu < gpu_count:
                self.fail(
                    f"{field}.gpu", f"must be a GPU index of this node (0..{gpu_count - 1})", gpu
                )
            if kind == "xid":
                xid = self.integer(data["xid"], f"{field}.xid", 0, 1 << 32)
                events.append(EventSpec(after, gpu=gpu, xid=xid))
            elif kind == "lost":
                events.append(
                    EventSpec(after, gpu=gpu, lost=self.flag(data["lost"], f"{field}.lost"))
                )
            else:
                flag = self.flag(data["recover"], f"{field}.recover")
                events.append(EventSpec(after, gpu=gpu, recover=flag))
        return tuple(events)
