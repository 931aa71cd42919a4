"""Device units: what a resource advertises, each with its ID, NUMA node and the GPU whose health
it follows.

A resource serves *units* of one kind -- whole GPUs, or MIG devices -- and, when shared, each unit
several times: replicas. One :class:`Device` value describes all of them:

- a whole GPU: ID = its UUID; it follows its own health and NUMA node;
- a MIG device (``mig``): ID = its MIG UUID; it follows its parent GPU's (``gpu``) health and NUMA
  node (NVML reports Xids on the parent, and a MIG device has no PCI function of its own);
- a replica of either (``replica``): ID ``<uuid>::<n>``; everything else is its unit's.

A kind of sharing added later (an MPS share) is one more way of replicating a unit, not another
kind of device: it takes its unit's ID, health and NUMA node the same way.

``unit`` is what the resource's preferred-allocation policy counts in: a GPU's index (the GPU
policies work over the node's topology, shared by every resource of whole GPUs), or a MIG
device's ``position`` in its resource (its policy is made over that resource's MIG devices).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from nvplugin.node.model import Gpu, MigDevice

REPLICA_SEPARATOR = "::"
"""Replica IDs are ``<uuid>::<n>``, as in NVIDIA's plugin (tools that parse them keep working)."""


class Kind(Enum):
    """What a resource serves (before sharing)."""

    GPU = "GPU"
    MIG = "MIG device"


@dataclass(frozen=True, slots=True)
class Device:
    """One advertised device unit (see the module docstring). ``position``: a MIG device's place
    in its resource's MIG device list (None for whole GPUs and before the plan places it)."""

    id: str
    gpu: Gpu
    replica: int | None = None
    mig: MigDevice | None = None
    position: int | None = None

    @property
    def kind(self) -> Kind:
        return Kind.GPU if self.mig is None else Kind.MIG

    @property
    def unit(self) -> int:
        """What the resource's preferred-allocation policy counts in: the GPU's index, or the
        MIG device's position."""
        return self.gpu.index if self.position is None else self.position

    @property
    def uuid(self) -> str:
        """The UUID of the device a container gets: the MIG device's, else the GPU's."""
        return self.gpu.uuid if self.mig is None else self.mig.uuid

    @property
    def label(self) -> str:
        """The unit's index as NVIDIA writes it: ``3`` for GPU 3, ``3:1`` for its MIG device 1."""
        return str(self.gpu.index) if self.mig is None else self.mig.label

    @property
    def numa_node(self) -> int | None:
        """The NUMA node the kubelet is told: the GPU's (a MIG device: its parent's)."""
        return self.gpu.numa_node

    @property
    def order(self) -> tuple[int, int, int]:
        """Node order: GPU index, then MIG index (a whole GPU first), then replica number."""
        return (
            self.gpu.index,
            -1 if self.mig is None else self.mig.index,
            -1 if self.replica is None else self.replica,
        )


def whole_gpu(gpu: Gpu) -> Device:
    return Device(gpu.uuid, gpu)


def mig_device(gpu: Gpu, mig: MigDevice) -> Device:
    return Device(mig.uuid, gpu, mig=mig)


def replica_id(uuid: str, replica: int) -> str:
    return f"{uuid}{REPLICA_SEPARATOR}{replica}"


def base_devices(gpus: Sequence[Gpu]) -> tuple[Device, ...]:
    """Whole GPUs as a resource serves them: in index order."""
    return tuple(whole_gpu(gpu) for gpu in sorted(gpus, key=lambda gpu: gpu.index))


def sorted_replicas(devices: Sequence[Device]) -> list[Device]:
    """Devices in GPU index (MIG: position) order, then replica order."""
    return sorted(devices, key=lambda d: (d.unit, d.replica or 0))


def health_gpus(devices: Sequence[Device]) -> tuple[Gpu, ...]:
    """The GPUs whose health ``devices`` follow, each once, in index order."""
    return tuple(sorted({d.gpu.index: d.gpu for d in devices}.values(), key=lambda g: g.index))
