"""A node file once validated (:mod:`nvplugin.nodefile.reader` reads and checks it): the GPUs,
links, NUMA layout, CPUs and scripted health events the simulated NVML and sysfs present, and the
topology discovery is expected to find on such a node."""

from __future__ import annotations

from dataclasses import dataclass

from nvplugin.node.gpumodels import PCI_CLASS_3D
from nvplugin.node.mig import MigInstance, mig_model
from nvplugin.node.mig import simulated_devices as simulated_mig_devices
from nvplugin.node.model import CpuLayout, Driver, Gpu, Link, Topology
from nvplugin.nodefile.cpus import CpuForm

DEFAULT_DRIVER = Driver("550.127.05", (12, 4))
"""The driver a simulated node has unless its node file says otherwise (``driver``)."""


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One simulated GPU. ``nvswitch_links`` = NVLinks into an NVSwitch fabric (0 = none);
    ``mig`` its MIG instances (None: MIG mode off); ``compute_capability`` None: NVML cannot
    tell; ``pci_class`` what its sysfs ``class`` file says."""

    index: int
    name: str
    uuid: str
    memory_mib: int
    pci_bus_id: str
    numa_node: int | None
    nvswitch_links: int = 0
    mig: tuple[MigInstance, ...] | None = None
    compute_capability: tuple[int, int] | None = None
    pci_class: int = PCI_CLASS_3D

    @property
    def mig_capable(self) -> bool:
        """Whether the simulated GPU supports MIG: its model has a MIG profile table."""
        return mig_model(self.name) is not None


@dataclass(frozen=True, slots=True)
class EventSpec:
    """A scripted health event; ``after_s`` counts from the simulated ``nvmlInit``.

    Exactly one kind: ``xid`` (an Xid critical error of ``gpu``), ``lost`` (``gpu`` falls off the
    bus), ``recover`` (``gpu`` answers again), ``wait_error`` (the event wait fails for
    ``for_s`` seconds); or a change of what the health signals read: ``fabric`` (the GPU's
    fabric state and status from now on), ``ecc`` / ``pcie_replays`` (that many more volatile
    uncorrectable ECC errors / PCIe replays), ``remap`` (``pending`` or ``failed``),
    ``nvlink`` with ``nvlink_errors`` (more errors on that link) or ``nvlink_up`` (the link goes
    down / up), ``reset`` (a GPU reset: the pending remap applied, volatile ECC count zeroed).
    """

    after_s: float
    gpu: int | None = None
    xid: int | None = None
    lost: bool = False
    recover: bool = False
    wait_error: bool = False
    for_s: float = 0.0
    fabric: FabricSpec | None = None
    ecc: int = 0
    pcie_replays: int = 0
    remap: str | None = None
    nvlink: int | None = None
    nvlink_errors: int = 0
    nvlink_up: bool | None = None
    reset: bool = False


@dataclass(frozen=True, slots=True)
class FabricSpec:
    """A GPU's fabric registration as NVML reports it: ``state`` (``not-started``,
    ``in-progress``, ``completed``) and ``status`` (``success`` or an NVML error's name without
    ``NVML_ERROR_``, lower case: ``unknown``, ``not_ready``...)."""

    state: str = "completed"
    status: str = "success"


@dataclass(frozen=True)
class NodeSpec:
    """A validated node file: what the simulated NVML and sysfs present.

    ``links[i][j]`` holds the link as discovery must find it (NVSwitch pairs included);
    ``machine`` the DMI product name (None: the simulated sysfs has none).
    """

    name: str
    source: str
    gpus: tuple[GpuSpec, ...]
    links: tuple[tuple[Link | None, ...], ...]
    numa_distances: tuple[tuple[int, ...], ...]
    cpus: CpuForm
    cpu_layout: CpuLayout
    events: tuple[EventSpec, ...] = ()
    memory_mib: int | None = None
    """The host's memory (the kubelet's node memory capacity); None: the file does not say."""
    driver: Driver = DEFAULT_DRIVER
    machine: str | None = None

    def direct_nvlinks(self, a: int, b: int) -> int:
        """NVLinks the fake NVML reports as direct GPU-GPU links between ``a`` and ``b``.

        Between two fabric GPUs the links go to the switches instead, so none are direct.
        """
        return _direct(self.gpus, self.links, a, b)

    def nvlink_count(self, index: int) -> int:
        """How many NVLinks GPU ``index`` has (direct ones, then those into the fabric)."""
        return nvlink_count(self.gpus, self.links, index)

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
                g.mig_capable,
                g.compute_capability,
                g.pci_class,
            )
            for g in self.gpus
        )
        return Topology(self.name, gpus, self.links, self.numa_distances, self.cpu_layout)


def _direct(
    gpus: tuple[GpuSpec, ...], links: tuple[tuple[Link | None, ...], ...], a: int, b: int
) -> int:
    link = links[a][b]
    if link is None or (gpus[a].nvswitch_links and gpus[b].nvswitch_links):
        return 0
    return link.nvlinks


def nvlink_count(
    gpus: tuple[GpuSpec, ...], links: tuple[tuple[Link | None, ...], ...], index: int
) -> int:
    """How many NVLinks GPU ``index`` of a node file has: its direct links to each peer, then
    its links into the NVSwitch fabric (the simulated NVML's link indices, in that order)."""
    direct = sum(_direct(gpus, links, index, p) for p in range(len(gpus)) if p != index)
    return direct + gpus[index].nvswitch_links
