"""Node files: a simulated node described in YAML, parsed and validated strictly.

A node file is a contract users write by hand (often by pasting ``nvidia-smi topo -m``), so every
mistake gets one message naming the file, the field (or matrix line, column and cell) and the
value, and nothing is silently ignored: unknown keys, duplicate keys and wrong types are errors.
It is plain YAML that any YAML tool loads; ``links`` is a text block holding either a GPU matrix
or a whole ``nvidia-smi topo -m`` paste (read by :mod:`nvplugin.nodefile.topotext`).

Defaults, chosen so a pasted matrix "just works":

- ``uuid``: ``GPU-`` + a UUID derived (SHA-1) from the node name, the GPU's name and its index:
  stable across runs, distinct per GPU.
- ``pci_bus_id``: ``00000000:<0x10 + index>:00.0`` (NVML's 8-digit domain form).
- ``memory_mib``: 16384.
- ``numa_node``: the paste's ``NUMA Affinity`` (the first node of a range), else unknown (null).
- ``nvswitch_links``: 0, unless no GPU gives it and the matrix needs a fabric (GPUs whose
  NV<k> cells add up to more than 18 links): then what :func:`topotext.guess_nvswitch` finds.
- A links cell with only ``NV<k>`` gets ``NODE`` when both GPUs report the same NUMA node, else
  ``SYS``.
- ``numa_distances``: NUMA nodes 0..max(numa_node named by a GPU, or implied by the paste or by
  ``cpus.numa_cpus``) (one node 0 when nothing names one), distance 10 to self and 20 otherwise.
- ``cpus``: from the paste's ``CPU Affinity`` lists when it has them
  (:func:`cpuspec.fit_affinities`); else one socket per NUMA node, 16 cores per socket, 2 threads
  per core, numbered the way Linux numbers x86 servers (:meth:`CpuLayout.build`). The explicit
  form ``{numa_cpus, socket_cpus, threads_per_core}`` lists the CPUs instead
  (:class:`cpuspec.CpuLists`; ``socket_cpus`` defaults to one socket per NUMA node with CPUs,
  ``threads_per_core`` to 1).

The node's own memory, ``memory_mib`` at the top level (MiB, optional), is what the kubelet
reports as its memory capacity: ``nvplugin admit`` checks pods' memory requests against it (and
does not when it is not given). GPUs' memory is each GPU's ``memory_mib``.
What GPU Feature Discovery reads of a node: ``driver: {version: "550.54.15", cuda: "12.4"}``
(default :data:`~nvplugin.nodefile.spec.DEFAULT_DRIVER`), ``machine`` (the DMI product name; none
by default), and per GPU ``compute_capability`` (``"8.0"``; null: NVML cannot tell) and
``pci_class`` (``"0x030200"``), by default its model's (:mod:`nvplugin.node.gpumodels`; no
compute capability for a model not tabled).

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
from importlib import resources
from typing import Any, NoReturn

from nvplugin import yamlinput
from nvplugin.errors import InputError, shortened
from nvplugin.errors import show as show_value
from nvplugin.node.gpumodels import default_compute_capability, default_pci_class
from nvplugin.node.mig import MIG_MODELS, MigInstance, MigLayoutError, lay_out, mig_model
from nvplugin.node.model import (
    MAX_CPUS,
    MAX_GPUS,
    MAX_NUMA_NODES,
    MAX_NVLINKS,
    CpuLayout,
    Driver,
    Link,
    Pcie,
    parse_cpu_list,
)
from nvplugin.node.nvml import fabric_status_known
from nvplugin.nodefile.builtin import builtin_names
from nvplugin.nodefile.cpus import CpuForm, CpuLists, CpuSpec, layout_of
from nvplugin.nodefile.linksblock import block_start, links_hint
from nvplugin.nodefile.spec import (
    DEFAULT_DRIVER,
    EventSpec,
    FabricSpec,
    GpuSpec,
    NodeSpec,
    nvlink_count,
)
from nvplugin.nodefile.topotext import (
    TopoTable,
    TopoTextError,
    guess_layout,
    guess_nvswitch,
    parse_topo,
)

VERSION = "v1"
"""The one ``version`` node files and config files say (NVIDIA's spelling)."""
DEFAULT_MEMORY_MIB = 16384
DEFAULT_CORES_PER_SOCKET = 16
DEFAULT_THREADS_PER_CORE = 2

_TOP_KEYS = (
    "version",
    "name",
    "memory_mib",
    "machine",
    "driver",
    "numa_distances",
    "cpus",
    "gpus",
    "links",
    "events",
)
MAX_HOST_MEMORY_MIB = 1 << 32
"""The most host memory a node file may give (4 PiB)."""
_GPU_KEYS = (
    "name",
    "uuid",
    "memory_mib",
    "pci_bus_id",
    "numa_node",
    "nvswitch_links",
    "mig",
    "compute_capability",
    "pci_class",
)
_DRIVER_KEYS = ("version", "cuda")
_DRIVER_RE = re.compile(r"^[0-9]{1,4}\.[0-9]{1,4}(\.[0-9]{1,4})?$")
_VERSION_PAIR_RE = re.compile(r"^([0-9]{1,3})\.([0-9]{1,2})$")
_PCI_CLASS_RE = re.compile(r"^0x[0-9a-fA-F]{6}$")
MAX_MACHINE = 200
_CPU_KEYS = ("sockets", "cores_per_socket", "threads_per_core", "numa_cpus", "socket_cpus")
_EVENT_KEYS = (
    "after_s",
    "gpu",
    "xid",
    "lost",
    "recover",
    "wait_error",
    "for_s",
    "fabric",
    "ecc",
    "pcie_replays",
    "remap",
    "nvlink",
    "reset",
)
_GPU_EVENTS = (
    "xid",
    "lost",
    "recover",
    "fabric",
    "ecc",
    "pcie_replays",
    "remap",
    "nvlink",
    "reset",
)
_FABRIC_KEYS = ("state", "status")
_FABRIC_STATES = ("not-started", "in-progress", "completed")
_NVLINK_KEYS = ("link", "errors", "state")
_REMAPS = ("pending", "failed")
MAX_COUNTER_STEP = 1 << 32
_PCI_RE = re.compile(r"^([0-9a-fA-F]{1,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
_UUID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


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
            resource = resources.files("nvplugin.nodefile") / "nodes" / f"{name_or_path}.yaml"
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
        try:
            data = yamlinput.load(text, self.source)
        except InputError as exc:
            raise InputError(f"{exc}{links_hint(text)}") from None
        top = self.keys(data, "", _TOP_KEYS)
        for required in ("version", "name", "gpus", "links"):
            if required not in top:
                self.fail(required, "missing (required)", show=False)
        if top["version"] != VERSION:
            self.fail("version", f"must be {VERSION} (as in config files)", top["version"])
        name = self.string(top["name"], "name")

        raw_gpus = top["gpus"]
        if not isinstance(raw_gpus, list) or not raw_gpus:
            self.fail("gpus", "must be a non-empty list of GPUs", raw_gpus)
        if len(raw_gpus) > MAX_GPUS:
            self.fail("gpus", f"at most {MAX_GPUS} GPUs", len(raw_gpus))
        gpu_fields = [self.gpu_fields(g, i) for i, g in enumerate(raw_gpus)]
        table = self.table(top["links"], text, len(gpu_fields))

        guess = guess_layout(table)
        numa = [
            f["numa_node"] if "numa_node" in f else guess.numa[i] for i, f in enumerate(gpu_fields)
        ]
        form = self.cpu_form(top["cpus"]) if "cpus" in top else guess.cpus
        implied = [n + 1 for n in numa if n is not None]
        if isinstance(form, CpuLists):
            implied.append(len(form.numa_cpus))
        if (form is not None and form is guess.cpus) or any(
            "numa_node" not in f and guess.numa[i] is not None for i, f in enumerate(gpu_fields)
        ):
            implied.append(guess.numa_nodes)
        distances = self.numa_distances(top.get("numa_distances"), max([1, *implied]))
        fabric = None
        if not any("nvswitch_links" in f for f in gpu_fields):
            fabric = guess_nvswitch(table)
        gpus = self.gpus(name, gpu_fields, numa, len(distances), fabric)
        links = self.links(table, gpus)
        cpus, layout = self.cpus(form, len(distances))
        events = self.events(top.get("events"), len(gpus))
        self.check_signal_events(events, gpus, links)
        memory = None
        if "memory_mib" in top:
            memory = self.integer(top["memory_mib"], "memory_mib", 1, MAX_HOST_MEMORY_MIB)
        driver = self.driver(top["driver"]) if "driver" in top else DEFAULT_DRIVER
        machine = self.machine(top["machine"]) if "machine" in top else None
        return NodeSpec(
            name,
            self.source,
            gpus,
            links,
            distances,
            cpus,
            layout,
            events,
            memory_mib=memory,
            driver=driver,
            machine=machine,
        )

    def driver(self, raw: Any) -> Driver:
        """``driver``: its version (``X.Y[.Z]``, as NVML prints it) and the CUDA version it
        supports (``M.m``); each defaults to :data:`DEFAULT_DRIVER`'s."""
        data = self.keys(raw, "driver", _DRIVER_KEYS)
        version = DEFAULT_DRIVER.version
        if "version" in data:
            version = self.string(data["version"], "driver.version")
            if not _DRIVER_RE.match(version):
                self.fail("driver.version", "must look like 550.54.15 (X.Y or X.Y.Z)", version)
        cuda = DEFAULT_DRIVER.cuda
        if "cuda" in data:
            cuda = self.version_pair(data["cuda"], "driver.cuda", "12.4")
        return Driver(version, cuda)

    def machine(self, raw: Any) -> str:
        text = self.string(raw, "machine")
        if len(text) > MAX_MACHINE or "\n" in text or not text.isprintable():
            self.fail("machine", f"must be one printable line of at most {MAX_MACHINE} characters")
        return text.strip()

    def version_pair(self, raw: Any, field: str, example: str) -> tuple[int, int]:
        """``"8.0"`` (or the number 8.0 as YAML reads it) -> (8, 0)."""
        if isinstance(raw, float) and not isinstance(raw, bool):
            raw = repr(raw)
        match = _VERSION_PAIR_RE.match(raw) if isinstance(raw, str) else None
        if match is None:
            self.fail(field, f'must be a version such as "{example}" (major.minor)', raw)
        return int(match.group(1)), int(match.group(2))

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

    def table(self, raw: Any, text: str, gpu_count: int) -> TopoTable:
        """The links block read as nvidia-smi topo -m text; errors point into the file."""
        if not isinstance(raw, str):
            self.fail(
                "links",
                "must be a text block: a GPU matrix or a whole nvidia-smi topo -m paste, "
                "under 'links: |2'",
                raw,
            )
        try:
            table = parse_topo(raw)
        except TopoTextError as exc:
            place = self.links_place(text, raw, exc)
            raise InputError(f"{self.source}: {place}: {exc.problem}") from None
        if table.size != gpu_count:
            self.fail(
                "links",
                f"matrix has {table.size} GPU columns but gpus lists {gpu_count} GPUs",
                show=False,
            )
        return table

    def links_place(self, text: str, raw: str, exc: TopoTextError) -> str:
        """``links, line L, column C`` of the file where it can be told, else of the block."""
        start = block_start(text)
        if start is not None and start[1] == "|":
            file_lines = text.splitlines()
            block_lines = raw.splitlines()
            number = start[0] + exc.line - 1
            if number < len(file_lines) and exc.line <= len(block_lines):
                in_file, in_block = file_lines[number], block_lines[exc.line - 1]
                indent = len(in_file) - len(in_block) if in_file.endswith(in_block) else 0
                return f"links, line {number + 1}, column {exc.column + indent}"
        return f"links (line {exc.line} of its text), column {exc.column}"

    def numa_distances(self, raw: Any, count: int) -> tuple[tuple[int, ...], ...]:
        if raw is None:
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

    def gpus(
        self,
        node: str,
        fields: list[dict[str, Any]],
        numa: list[int | None],
        numa_count: int,
        fabric: tuple[int, ...] | None,
    ) -> tuple[GpuSpec, ...]:
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
            if numa[i] is not None and numa[i] >= numa_count:  # type: ignore[operator]
                self.fail(
                    f"{field}.numa_node",
                    f"not a NUMA node of numa_distances (nodes 0..{numa_count - 1})",
                    numa[i],
                )
            switch = 0 if fabric is None else fabric[i]
            if "nvswitch_links" in data:
                switch = self.integer(
                    data["nvswitch_links"], f"{field}.nvswitch_links", 0, MAX_NVLINKS
                )
            compute = default_compute_capability(name)
            if "compute_capability" in data:  # null: NVML cannot tell
                raw = data["compute_capability"]
                at = f"{field}.compute_capability"
                compute = None if raw is None else self.version_pair(raw, at, "8.0")
            pci_class = default_pci_class(name)
            if "pci_class" in data:
                raw_class = data["pci_class"]
                if not isinstance(raw_class, str) or not _PCI_CLASS_RE.match(raw_class):
                    self.fail(f"{field}.pci_class", 'must look like "0x030200"', raw_class)
                pci_class = int(raw_class, 16)
            gpus.append(
                GpuSpec(i, name, uuid, memory, bus_id, numa[i], switch, mig, compute, pci_class)
            )
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

    def links(
        self, table: TopoTable, gpus: tuple[GpuSpec, ...]
    ) -> tuple[tuple[Link | None, ...], ...]:
        """Each pair's link; a cell naming only NVLinks gets NODE within a NUMA node, else SYS."""
        n = len(gpus)
        cells: list[list[Link | None]] = [[None] * n for _ in range(n)]
        for i in range(n):
            for j in range(n):
                if i == j:
                    continue
                cell = table.cell(i, j)
                pcie = cell.pcie
                if pcie is None:
                    a, b = gpus[i].numa_node, gpus[j].numa_node
                    pcie = Pcie.NODE if a is not None and a == b else Pcie.SYS
                cells[i][j] = Link(pcie, cell.nvlinks)
        self.check_nvlinks(cells, gpus, table)
        return tuple(tuple(row) for row in cells)

    def check_nvlinks(
        self, cells: list[list[Link | None]], gpus: tuple[GpuSpec, ...], table: TopoTable
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
                            table.cell(i, j).text,
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

    def cpu_form(self, raw: Any) -> CpuForm:
        """The ``cpus`` mapping: the compact form, or the explicit one (``numa_cpus``)."""
        data = self.keys(raw, "cpus", _CPU_KEYS)
        if "numa_cpus" not in data:
            if "socket_cpus" in data:
                self.fail("cpus.socket_cpus", "only with numa_cpus", data["socket_cpus"])
            for key in ("sockets", "cores_per_socket", "threads_per_core"):
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
            return spec
        for key in ("sockets", "cores_per_socket"):
            if key in data:
                self.fail(f"cpus.{key}", "not with numa_cpus: list the sockets as socket_cpus")
        numa_cpus = self.cpu_lists(data["numa_cpus"], "cpus.numa_cpus", MAX_NUMA_NODES)
        if not any(numa_cpus):
            self.fail("cpus.numa_cpus", "names no CPU", data["numa_cpus"])
        sockets = tuple(c for c in numa_cpus if c)
        if "socket_cpus" in data:
            sockets = self.cpu_lists(data["socket_cpus"], "cpus.socket_cpus", 64)
        threads = self.integer(data.get("threads_per_core", 1), "cpus.threads_per_core", 1, 8)
        lists = CpuLists(numa_cpus, sockets, threads)
        try:
            lists.layout()
        except ValueError as exc:
            self.fail("cpus", str(exc), show=False)
        return lists

    def cpu_lists(self, raw: Any, field: str, most: int) -> tuple[tuple[int, ...], ...]:
        if not isinstance(raw, list) or not raw:
            self.fail(field, 'must be a non-empty list of CPU lists such as "0-19,40-59"', raw)
        if len(raw) > most:
            self.fail(field, f"at most {most} entries", len(raw))
        lists = []
        for n, item in enumerate(raw):
            if isinstance(item, bool) or not isinstance(item, str | int):
                self.fail(f"{field}[{n}]", 'must be a CPU list such as "0-19,40-59"', item)
            try:
                lists.append(parse_cpu_list(str(item), MAX_CPUS - 1))
            except ValueError as exc:
                self.fail(f"{field}[{n}]", f"not a CPU list: {exc}", item)
        return tuple(lists)

    def cpus(self, form: CpuForm | None, numa_count: int) -> tuple[CpuForm, CpuLayout]:
        if form is None:
            form = CpuSpec(numa_count, DEFAULT_CORES_PER_SOCKET, DEFAULT_THREADS_PER_CORE)
        try:
            layout = layout_of(form, numa_count)
        except ValueError as exc:
            field = "cpus.numa_cpus" if isinstance(form, CpuLists) else "cpus"
            self.fail(field, f"does not fit {numa_count} NUMA node(s): {exc}", show=False)
        return form, layout

    def signal_event(self, raw: Any, field: str, kind: str, after: float, gpu: int) -> EventSpec:
        """An event changing what GPU ``gpu``'s health signals read (see :class:`EventSpec`)."""
        if kind == "fabric":
            if isinstance(raw, str):
                raw = {"state": raw}
            data = self.keys(raw, field, _FABRIC_KEYS)
            state = data.get("state", "completed")
            if state not in _FABRIC_STATES:
                self.fail(f"{field}.state", f"must be one of {', '.join(_FABRIC_STATES)}", state)
            status = data.get("status", "success")
            if not isinstance(status, str) or not (
                status == "success" or fabric_status_known(status)
            ):
                self.fail(
                    f"{field}.status",
                    "must be success or an NVML error name without NVML_ERROR_ (unknown, "
                    "not_ready, ...)",
                    status,
                )
            return EventSpec(after, gpu=gpu, fabric=FabricSpec(state, status))
        if kind in ("ecc", "pcie_replays"):
            step = self.integer(raw, field, 1, MAX_COUNTER_STEP)
            if kind == "ecc":
                return EventSpec(after, gpu=gpu, ecc=step)
            return EventSpec(after, gpu=gpu, pcie_replays=step)
        if kind == "remap":
            if raw not in _REMAPS:
                self.fail(field, f"must be one of {', '.join(_REMAPS)}", raw)
            return EventSpec(after, gpu=gpu, remap=raw)
        if kind == "reset":
            if not self.flag(raw, field):
                self.fail(field, "must be true (a GPU reset)", raw)
            return EventSpec(after, gpu=gpu, reset=True)
        data = self.keys(raw, field, _NVLINK_KEYS)
        if "link" not in data:
            self.fail(f"{field}.link", "missing (required)", show=False)
        link = self.integer(data["link"], f"{field}.link", 0, MAX_NVLINKS - 1)
        if ("errors" in data) == ("state" in data):
            self.fail(field, "needs exactly one of errors, state", show=False)
        if "errors" in data:
            errors = self.integer(data["errors"], f"{field}.errors", 1, MAX_COUNTER_STEP)
            return EventSpec(after, gpu=gpu, nvlink=link, nvlink_errors=errors)
        if data["state"] not in ("up", "down"):
            self.fail(f"{field}.state", "must be up or down", data["state"])
        return EventSpec(after, gpu=gpu, nvlink=link, nvlink_up=data["state"] == "up")

    def check_signal_events(
        self,
        events: tuple[EventSpec, ...],
        gpus: tuple[GpuSpec, ...],
        links: tuple[tuple[Link | None, ...], ...],
    ) -> None:
        """Fabric events only for GPUs in an NVSwitch fabric; NVLink events only for links the
        GPU has: a scripted fault on something the node does not have is refused, naming it."""
        for n, event in enumerate(events):
            field = f"events[{n}]"
            if event.gpu is None:
                continue
            if event.fabric is not None and not gpus[event.gpu].nvswitch_links:
                self.fail(
                    f"{field}.fabric",
                    f"GPU {event.gpu} is not in an NVSwitch fabric (nvswitch_links: 0): NVML "
                    "reports no fabric state for it",
                    show=False,
                )
            if event.nvlink is not None:
                count = nvlink_count(gpus, links, event.gpu)
                if event.nvlink >= count:
                    self.fail(
                        f"{field}.nvlink.link",
                        f"GPU {event.gpu} has {count} NVLink(s)"
                        + (f" (0..{count - 1})" if count else ""),
                        event.nvlink,
                    )

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
            kinds = [k for k in (*_GPU_EVENTS, "wait_error") if k in data]
            if len(kinds) != 1:
                self.fail(
                    field,
                    f"needs exactly one of {', '.join((*_GPU_EVENTS, 'wait_error'))}",
                    ", ".join(kinds),
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
            elif kind != "lost" and kind != "recover":
                events.append(self.signal_event(data[kind], f"{field}.{kind}", kind, after, gpu))
            elif kind == "lost":
                events.append(
                    EventSpec(after, gpu=gpu, lost=self.flag(data["lost"], f"{field}.lost"))
                )
            else:
                flag = self.flag(data["recover"], f"{field}.recover")
                events.append(EventSpec(after, gpu=gpu, recover=flag))
        return tuple(events)
