"""Which GPUs and MIG devices a container sees, read from the plugin's Allocate response as the
NVIDIA container runtime reads it -- not from the plugin's device IDs, whose form (a UUID, a
time-slicing replica, ...) is the plugin's own business.

A response names devices in NVIDIA's documented forms, whichever device-list strategies the
plugin was configured with:

- ``NVIDIA_VISIBLE_DEVICES=<name>,<name>`` (``envvar``);
- mounts ``/var/run/nvidia-container-devices/<name>`` (``volume-mounts``; the variable then names
  that directory);
- CDI device names ``nvidia.com/gpu=<name>``, in ``cdi_devices`` (``cdi-cri``) or in the values
  of annotations (``cdi-annotations``);

where a name is a GPU's or MIG device's UUID, a GPU's NVML index (``3``) or a MIG device's
``<gpu index>:<mig index>`` (``deviceIDStrategy: index``). :func:`visible_devices` collects them
and resolves each against the node (:class:`~nvplugin.node.model.Topology`); names the node does
not have, and the runtime's ``all``/``none``/``void``, are left out.

An MPS client (``CUDA_MPS_PIPE_DIRECTORY`` set) has shares: :func:`mps_shares` reads its memory
limit per device ordinal (the container's GPUs in index order) and its thread percentage as CUDA
reads them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from nvplugin.api.nvidia import (
    CDI_KINDS,
    MPS_MEMORY_LIMIT_ENV,
    MPS_PIPE_ENV,
    MPS_THREADS_ENV,
    VISIBLE_DEVICES_ENV,
    VOLUME_MOUNTS_ROOT,
)
from nvplugin.api.v1beta1 import api_pb2
from nvplugin.node.model import Gpu, MigDevice, Topology


@dataclass(frozen=True)
class Visible:
    """One device a container sees: a GPU, or a MIG device on it."""

    gpu: int
    mig: int | None = None  # MIG index under ``gpu``

    @property
    def index(self) -> tuple[int, int]:
        """Index order: by GPU, a GPU before its MIG devices, then by MIG index."""
        return self.gpu, -1 if self.mig is None else self.mig

    @property
    def label(self) -> str:
        """``3``, or ``3:1`` for a MIG device (NVIDIA's index form)."""
        return str(self.gpu) if self.mig is None else f"{self.gpu}:{self.mig}"


def device_names(response: api_pb2.ContainerAllocateResponse) -> list[str]:
    """Every device name the response gives the container, in the order found, each once."""
    names: list[str] = []
    env = response.envs.get(VISIBLE_DEVICES_ENV, "")
    if env and env != VOLUME_MOUNTS_ROOT:
        names += env.split(",")
    for mount in response.mounts:
        directory, _, name = mount.container_path.rpartition("/")
        if directory == VOLUME_MOUNTS_ROOT:
            names.append(name)
    names += _cdi_names(device.name for device in response.cdi_devices)
    for value in response.annotations.values():
        names += _cdi_names(value.split(","))
    return list(dict.fromkeys(name.strip() for name in names if name.strip()))


def _cdi_names(qualified: Iterable[str]) -> list[str]:
    out = []
    for item in qualified:
        kind, _, name = item.strip().partition("=")
        if kind in CDI_KINDS and name:
            out.append(name)
    return out


def resolve(topology: Topology, name: str) -> Visible | None:
    """The node's GPU or MIG device ``name`` stands for (UUID or index form); None if none."""
    owner = topology.owner(name)
    if owner is not None:
        gpu, mig = owner
        return Visible(gpu.index, None if mig is None else mig.index)
    gpu_part, colon, mig_part = name.partition(":")
    found = _gpu(topology, gpu_part)
    if found is None:
        return None
    if not colon:
        return Visible(found.index)
    mig = _mig(found, mig_part)
    return None if mig is None else Visible(found.index, mig.index)


def _gpu(topology: Topology, index: str) -> Gpu | None:
    if not index.isdigit() or int(index) >= len(topology.gpus):
        return None
    return topology.gpus[int(index)]


def _mig(gpu: Gpu, index: str) -> MigDevice | None:
    if not index.isdigit():
        return None
    return next((m for m in gpu.mig_devices if m.index == int(index)), None)


def visible_devices(
    topology: Topology, response: api_pb2.ContainerAllocateResponse
) -> list[Visible]:
    """The node's devices the response makes visible, in index order."""
    found = (resolve(topology, name) for name in device_names(response))
    return sorted({v for v in found if v is not None}, key=lambda v: v.index)


@dataclass(frozen=True)
class MpsShares:
    """An MPS client's limits: device memory per GPU index, and the percentage of threads."""

    memory: tuple[tuple[int, str], ...]
    threads: int | None

    def label(self) -> str:
        """``MPS 20480M 25%`` (one GPU), ``MPS 0:20480M,1:40960M 25%``."""
        if len(self.memory) == 1:
            memory = self.memory[0][1]
        else:
            memory = ",".join(f"{gpu}:{limit}" for gpu, limit in self.memory)
        threads = "" if self.threads is None else f" {self.threads}%"
        return f"MPS {memory}{threads}".rstrip()

    def as_json(self) -> dict[str, object]:
        return {
            "memory_limits": {str(gpu): limit for gpu, limit in self.memory},
            "active_thread_percentage": self.threads,
        }


def mps_shares(topology: Topology, response: api_pb2.ContainerAllocateResponse) -> MpsShares | None:
    """The MPS limits the response gives its container (None: not an MPS client)."""
    if MPS_PIPE_ENV not in response.envs:
        return None
    gpus = sorted({v.gpu for v in visible_devices(topology, response)})
    memory = []
    for item in response.envs.get(MPS_MEMORY_LIMIT_ENV, "").split(","):
        ordinal, _, limit = item.strip().partition("=")
        if ordinal.isdigit() and int(ordinal) < len(gpus) and limit:
            memory.append((gpus[int(ordinal)], limit))
    threads = response.envs.get(MPS_THREADS_ENV, "")
    return MpsShares(tuple(memory), int(threads) if threads.isdigit() else None)
