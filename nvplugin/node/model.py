"""What a node has and how it is wired: GPUs, their pairwise links, NUMA nodes and CPUs.

Everything here is an immutable value. A :class:`Topology` is built once per process (by
discovery through NVML, real or simulated) and then only read: the allocator, the plugin and
the fake kubelet all work from the same object, so nothing on a request path touches NVML.

The pair-score weights live here and nowhere else (see docs/allocation.md#pair-scores).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from nvplugin.errors import printable

NVLINK_WEIGHT = 100
"""Score added per NVLink between two GPUs (direct, or through an NVSwitch fabric)."""

MAX_NVLINKS = 18
"""The most NVLinks one GPU has (H100/B200 through NVSwitch)."""

MAX_GPUS = 128
MAX_NUMA_NODES = 64
MAX_CPUS = 4096
"""The largest node a node file, ``nvidia-smi topo -m`` text or a capture may describe."""


class Pcie(enum.IntEnum):
    """PCIe relation of two GPUs, named as ``nvidia-smi topo -m`` prints it.

    The value is the relation's pair-score weight: the closer the common ancestor, the higher.
    """

    SYS = 10  # across CPU sockets (NVML_TOPOLOGY_SYSTEM)
    NODE = 20  # same NUMA node, different host bridges (NVML_TOPOLOGY_NODE)
    PHB = 30  # same host bridge (NVML_TOPOLOGY_HOSTBRIDGE)
    PXB = 40  # several PCIe switches (NVML_TOPOLOGY_MULTIPLE)
    PIX = 50  # one PCIe switch (NVML_TOPOLOGY_SINGLE)
    INT = 60  # same board (NVML_TOPOLOGY_INTERNAL)

    @property
    def weight(self) -> int:
        return int(self.value)


@dataclass(frozen=True, slots=True)
class Link:
    """How two distinct GPUs are connected: their PCIe relation and NVLink count."""

    pcie: Pcie
    nvlinks: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.nvlinks <= MAX_NVLINKS:
            raise ValueError(f"NVLink count {self.nvlinks} outside 0..{MAX_NVLINKS}")

    @property
    def score(self) -> int:
        """Pair score: PCIe weight + 100 per NVLink (docs/allocation.md#pair-scores)."""
        return self.pcie.weight + NVLINK_WEIGHT * self.nvlinks

    @property
    def cell(self) -> str:
        """The node-file cell for this link, e.g. ``NV12+NODE`` or ``PIX``."""
        if self.nvlinks:
            return f"NV{self.nvlinks}+{self.pcie.name}"
        return self.pcie.name

    @property
    def smi_cell(self) -> str:
        """The cell as ``nvidia-smi topo -m`` prints it: NVLinks hide the PCIe part."""
        return f"NV{self.nvlinks}" if self.nvlinks else self.pcie.name


@dataclass(frozen=True, slots=True)
class MigCaps:
    """The ``/dev/nvidia-caps/nvidia-cap<minor>`` minors a container needs for one MIG device:
    its GPU instance's and its compute instance's access capabilities (``mig-minors``)."""

    gpu_instance: int
    compute_instance: int


@dataclass(frozen=True, slots=True)
class MigUnits:
    """What a MIG device gets of its GPU besides memory: streaming multiprocessors (SM), copy
    engines (CE), video decoders (DEC) and encoders (ENC), JPEG decoders and optical-flow
    accelerators (OFA), as ``nvidia-smi mig -lgip`` lists them per profile and NVML's device
    attributes report them per MIG device (``nvmlDeviceGetAttributes``)."""

    multiprocessors: int = 0
    copy_engines: int = 0
    decoders: int = 0
    encoders: int = 0
    jpeg: int = 0
    ofa: int = 0


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG device (a GPU instance with a compute instance) as NVML reports it.

    ``parent`` is the parent GPU's NVML index and ``index`` the MIG device's index under it
    (``nvmlDeviceGetMigDeviceHandleByIndex``): NVIDIA's ``deviceIDStrategy: index`` names it
    ``<parent>:<index>``. ``profile`` is the name NVIDIA's plugin and nvidia-smi use (``1g.5gb``,
    ``1c.3g.20gb``, ``1g.10gb+me``); ``slices`` the GPU instance's compute slices; ``placement``
    its (start, size) in memory slices. ``caps`` is None when the driver's ``mig-minors`` file
    could not be read; ``compute_slices`` its compute instance's slices (``slices`` or fewer)
    and ``units`` its multiprocessors and engines. The NUMA node is the parent's: a MIG device
    has no PCI function of its own.
    """

    parent: int
    index: int
    uuid: str
    profile: str
    gpu_instance: int
    compute_instance: int
    memory_mib: int
    slices: int
    placement: tuple[int, int]
    caps: MigCaps | None = None
    compute_slices: int = 0
    units: MigUnits = MigUnits()

    @property
    def label(self) -> str:
        """``<parent>:<index>``, as NVIDIA writes MIG device indices."""
        return f"{self.parent}:{self.index}"


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU as NVML reports it. ``index`` is the NVML index; ``numa_node`` None = unknown.

    ``mig_enabled`` is the current MIG mode (a GPU without MIG support reports False);
    ``mig_devices`` its MIG devices in MIG index order (none when MIG is off, and possibly none
    when it is on: instances are created separately); ``mig_capable``: the GPU supports MIG.
    ``compute_capability`` is CUDA's (major, minor), None when NVML cannot tell; ``pci_class``
    the PCI function's class (``0x030200``: a 3D controller), None when sysfs cannot tell.

    ``name`` is kept printable (:func:`nvplugin.errors.printable`), whoever made the GPU (NVML,
    a node file): it is printed in tables, reports and logs, and a driver's or a file's control
    characters must never reach a terminal raw.
    """

    index: int
    uuid: str
    name: str
    memory_mib: int
    pci_bus_id: str
    minor: int
    numa_node: int | None
    mig_enabled: bool = False
    mig_devices: tuple[MigDevice, ...] = ()
    mig_capable: bool = False
    compute_capability: tuple[int, int] | None = None
    pci_class: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", printable(self.name))


@dataclass(frozen=True, slots=True)
class Driver:
    """The node's NVIDIA driver: its version (``550.54.15``) and the newest CUDA version it
    supports, (major, minor)."""

    version: str
    cuda: tuple[int, int]


@dataclass(frozen=True, slots=True)
class Cpu:
    """One logical CPU (hardware thread)."""

    id: int
    socket: int
    core: int
    numa_node: int


def parse_cpu_list(text: str, limit: int | None = None) -> tuple[int, ...]:
    """Linux cpulist syntax (``"0-3,8"``; ``""`` is empty) -> sorted CPU ids.

    Raises ValueError with the problem (not the text: callers name the field and show the value
    bounded). ``limit``: the highest CPU id allowed, so ``0-99999999`` fails before it expands.
    """
    cpus: set[int] = set()
    if not text.strip():
        return ()
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise ValueError("empty item")
        first, sep, last = item.partition("-")
        start = _cpu_number(first)
        end = _cpu_number(last) if sep else start
        if start > end:
            raise ValueError(f"range {item} runs backwards")
        if limit is not None and end > limit:
            raise ValueError(f"CPU {end} is above {limit}")
        cpus.update(range(start, end + 1))
    return tuple(sorted(cpus))


def _cpu_number(text: str) -> int:
    text = text.strip()
    if not text.isdigit() or not text.isascii() or len(text) > 9:
        raise ValueError(f'"{text[:20]}" is not a CPU number')
    return int(text)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """CPU ids as Linux cpulist ranges (sysfs, the kubelet's flags): ``[0, 1, 2, 3, 8]`` ->
    ``"0-3,8"`` (empty -> ``""``)."""
    ordered = sorted(set(cpus))
    parts = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


@dataclass(frozen=True, slots=True)
class CpuLayout:
    """The node's logical CPUs, in id order."""

    cpus: tuple[Cpu, ...]

    @classmethod
    def build(
        cls, sockets: int, cores_per_socket: int, threads_per_core: int, numa_nodes: int
    ) -> CpuLayout:
        """Lay CPUs out the way Linux numbers them on x86 servers.

        CPU id = thread * (sockets * cores_per_socket) + socket * cores_per_socket + core: the
        first hardware thread of every core first, then the siblings. NUMA nodes split the
        sockets evenly: with more NUMA nodes than sockets (AMD NPS2/NPS4, Intel SNC) each socket's
        cores are divided in contiguous blocks; with fewer, consecutive sockets share a node.
        """
        for what, value in (
            ("sockets", sockets),
            ("cores_per_socket", cores_per_socket),
            ("threads_per_core", threads_per_core),
            ("numa nodes", numa_nodes),
        ):
            if value < 1:
                raise ValueError(f"{what} must be >= 1, got {value}")
        if numa_nodes >= sockets:
            if numa_nodes % sockets:
                raise ValueError(
                    f"{numa_nodes} NUMA nodes cannot be split evenly over {sockets} sockets"
                )
            per_socket = numa_nodes // sockets
            if cores_per_socket % per_socket:
                raise ValueError(
                    f"{cores_per_socket} cores per socket cannot be split evenly over "
                    f"{per_socket} NUMA nodes per socket"
                )
            block = cores_per_socket // per_socket

            def node_of(socket: int, core: int) -> int:
                return socket * per_socket + core // block

        else:
            if sockets % numa_nodes:
                raise ValueError(
                    f"{sockets} sockets cannot be grouped evenly into {numa_nodes} NUMA nodes"
                )
            sockets_per_node = sockets // numa_nodes

            def node_of(socket: int, core: int) -> int:
                return socket // sockets_per_node

        cpus = []
        for thread in range(threads_per_core):
            for socket in range(sockets):
                for core in range(cores_per_socket):
                    cpu_id = thread * sockets * cores_per_socket + socket * cores_per_socket + core
                    cpus.append(Cpu(cpu_id, socket, core, node_of(socket, core)))
        return cls(tuple(cpus))

    @classmethod
    def from_lists(
        cls,
        numa_cpus: Sequence[Iterable[int]],
        socket_cpus: Sequence[Iterable[int]],
        threads_per_core: int,
    ) -> CpuLayout:
        """CPUs given as the lists Linux shows: each NUMA node's and each socket's CPU ids.

        Sibling threads follow the same rule as :meth:`build` (the x86 numbering): a socket's
        CPUs, in id order, split into ``threads_per_core`` equal runs, and core k is the k-th
        CPU of every run. :meth:`build`'s layouts come back unchanged through their lists.
        Raises ValueError when the lists disagree (a CPU in no node, or in two sockets).
        """
        if threads_per_core < 1:
            raise ValueError(f"threads_per_core must be >= 1, got {threads_per_core}")
        node_of: dict[int, int] = {}
        for node, members in enumerate(numa_cpus):
            for cpu in members:
                if cpu in node_of:
                    raise ValueError(f"CPU {cpu} is on NUMA nodes {node_of[cpu]} and {node}")
                node_of[cpu] = node
        cpus: dict[int, Cpu] = {}
        for socket, members in enumerate(socket_cpus):
            ordered = sorted(set(members))
            if len(ordered) % threads_per_core:
                raise ValueError(
                    f"socket {socket} has {len(ordered)} CPUs, not a multiple of "
                    f"{threads_per_core} threads per core"
                )
            cores = len(ordered) // threads_per_core
            for position, cpu in enumerate(ordered):
                if cpu in cpus:
                    raise ValueError(f"CPU {cpu} is in sockets {cpus[cpu].socket} and {socket}")
                if cpu not in node_of:
                    raise ValueError(f"CPU {cpu} of socket {socket} is on no NUMA node")
                cpus[cpu] = Cpu(cpu, socket, position % cores, node_of[cpu])
        missing = sorted(set(node_of) - set(cpus))
        if missing:
            raise ValueError(f"CPU {missing[0]} of NUMA node {node_of[missing[0]]} is in no socket")
        return cls(tuple(cpus[c] for c in sorted(cpus)))

    def normalized(self) -> CpuLayout:
        """The same CPUs with sockets and cores renumbered 0, 1, ... in order of their lowest
        CPU id: the grouping is what matters (Linux's core ids have gaps), and layouts from
        :meth:`build` and :meth:`from_lists` are already numbered so."""
        sockets: dict[int, int] = {}
        cores: dict[tuple[int, int], int] = {}
        per_socket: dict[int, int] = {}
        out = []
        for cpu in sorted(self.cpus, key=lambda c: c.id):
            socket = sockets.setdefault(cpu.socket, len(sockets))
            if (cpu.socket, cpu.core) not in cores:
                cores[(cpu.socket, cpu.core)] = per_socket.get(socket, 0)
                per_socket[socket] = per_socket.get(socket, 0) + 1
            out.append(Cpu(cpu.id, socket, cores[(cpu.socket, cpu.core)], cpu.numa_node))
        return CpuLayout(tuple(out))

    def on_socket(self, socket: int) -> tuple[int, ...]:
        """CPU ids of one socket, ascending."""
        return tuple(c.id for c in self.cpus if c.socket == socket)

    def on_node(self, numa_node: int) -> tuple[int, ...]:
        """CPU ids on one NUMA node, ascending."""
        return tuple(c.id for c in self.cpus if c.numa_node == numa_node)

    @property
    def sockets(self) -> int:
        return len({c.socket for c in self.cpus})

    @property
    def threads_per_core(self) -> int:
        if not self.cpus:
            return 0
        per_core: dict[tuple[int, int], int] = {}
        for c in self.cpus:
            per_core[(c.socket, c.core)] = per_core.get((c.socket, c.core), 0) + 1
        return max(per_core.values())


@dataclass(frozen=True)
class Topology:
    """A node: its GPUs in NVML index order, every pair's link, NUMA distances and CPUs.

    ``links[i][j]`` is the link between GPU i and GPU j (None on the diagonal); the matrix is
    square and symmetric. ``numa_distances[a][b]`` is the SLIT distance between NUMA nodes.
    """

    name: str
    gpus: tuple[Gpu, ...]
    links: tuple[tuple[Link | None, ...], ...]
    numa_distances: tuple[tuple[int, ...], ...]
    cpus: CpuLayout
    scores: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)
    _by_uuid: dict[str, Gpu] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        n = len(self.gpus)
        for position, gpu in enumerate(self.gpus):
            if gpu.index != position:
                raise ValueError(f"GPU at position {position} has index {gpu.index}")
        if len(self.links) != n or any(len(row) != n for row in self.links):
            raise ValueError(f"link matrix must be {n}x{n}")
        for i in range(n):
            if self.links[i][i] is not None:
                raise ValueError(f"link matrix diagonal at GPU{i} must be empty")
            for j in range(i + 1, n):
                if self.links[i][j] is None or self.links[i][j] != self.links[j][i]:
                    raise ValueError(f"link matrix not symmetric at GPU{i}/GPU{j}")
        k = len(self.numa_distances)
        if any(len(row) != k for row in self.numa_distances):
            raise ValueError("NUMA distance matrix must be square")
        for gpu in self.gpus:
            if gpu.numa_node is not None and not 0 <= gpu.numa_node < k:
                raise ValueError(f"GPU{gpu.index} NUMA node {gpu.numa_node} outside 0..{k - 1}")
        uuids = {g.uuid: g for g in self.gpus}
        if len(uuids) != n:
            raise ValueError("duplicate GPU UUIDs")
        _check_mig(self.gpus, set(uuids))
        scores = tuple(
            tuple(0 if link is None else link.score for link in row) for row in self.links
        )
        object.__setattr__(self, "scores", scores)
        object.__setattr__(self, "_by_uuid", uuids)

    def __len__(self) -> int:
        return len(self.gpus)

    def link(self, a: int, b: int) -> Link:
        link = self.links[a][b]
        if link is None:
            raise ValueError(f"no link between GPU{a} and itself")
        return link

    def score(self, a: int, b: int) -> int:
        """Pair score of two distinct GPUs (docs/allocation.md#pair-scores)."""
        return self.scores[a][b]

    def group_score(self, indices: Sequence[int]) -> int:
        """Sum of the pair scores within a group of GPU indices."""
        total = 0
        for x, a in enumerate(indices):
            row = self.scores[a]
            for b in indices[x + 1 :]:
                total += row[b]
        return total

    def pairs(self) -> Iterator[tuple[int, int, Link]]:
        """Every pair i < j with its link, in index order."""
        for i, row in enumerate(self.links):
            for j in range(i + 1, len(row)):
                link = row[j]
                assert link is not None
                yield i, j, link

    def gpu_by_uuid(self, uuid: str) -> Gpu | None:
        return self._by_uuid.get(uuid)

    def owner(self, uuid: str) -> tuple[Gpu, MigDevice | None] | None:
        """The GPU a device UUID is on, with the MIG device when it names one; None: neither a
        GPU nor a MIG device of this node."""
        gpu = self._by_uuid.get(uuid)
        if gpu is not None:
            return gpu, None
        for gpu in self.gpus:
            for mig in gpu.mig_devices:
                if mig.uuid == uuid:
                    return gpu, mig
        return None

    @property
    def mig_devices(self) -> tuple[MigDevice, ...]:
        """Every MIG device of the node, by parent GPU index, then MIG index."""
        return tuple(mig for gpu in self.gpus for mig in gpu.mig_devices)

    @property
    def numa_nodes(self) -> tuple[int, ...]:
        """The machine's NUMA node ids, 0..k-1."""
        return tuple(range(len(self.numa_distances)))


def _check_mig(gpus: Sequence[Gpu], gpu_uuids: set[str]) -> None:
    """MIG devices belong to a MIG-enabled parent, in MIG index order, with UUIDs unique on the
    node (a MIG UUID is a device ID the kubelet sees beside GPU UUIDs)."""
    seen = set(gpu_uuids)
    for gpu in gpus:
        if gpu.mig_devices and not gpu.mig_enabled:
            raise ValueError(f"GPU{gpu.index} has MIG devices but MIG mode off")
        indices = [mig.index for mig in gpu.mig_devices]
        if indices != sorted(set(indices)):
            raise ValueError(f"GPU{gpu.index} MIG devices not in MIG index order: {indices}")
        for mig in gpu.mig_devices:
            if mig.parent != gpu.index:
                raise ValueError(f"MIG device {mig.label} listed under GPU{gpu.index}")
            if mig.uuid in seen:
                raise ValueError(f"duplicate UUID {mig.uuid} (MIG device {mig.label})")
            seen.add(mig.uuid)
