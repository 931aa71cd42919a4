"""MPS shares: what one share of a GPU is, where an MPS resource's files live, and what a container
of an MPS resource gets in its Allocate response.

A GPU of a resource shared through MPS with ``replicas`` replicas is ``replicas`` shares: each
1/replicas of the GPU's memory (MiB, rounded down) and of its threads (percent, rounded down, at
least 1). The control daemon's defaults (:mod:`nvplugin.plugin.mps`) and a container's own limits
come from the same two functions here.

Files, under the MPS root (``flags.mpsRoot`` on the host; NVIDIA's layout):
``<root>/<resource>/pipe`` (the control daemon's pipes), ``<root>/<resource>/log``
(``control.log``), ``<root>/shm`` (the shared memory of the MPS servers and all their clients).

Allocate, as NVIDIA's plugin answers for MPS: ``CUDA_MPS_PIPE_DIRECTORY=/mps/<resource>/pipe``,
the host's pipe directory mounted there and ``<root>/shm`` mounted at ``/dev/shm``; beyond
NVIDIA, the container's shares as client limits: ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` per device
ordinal (its GPUs in index order; k replicas of a GPU are k shares of it) and
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (one value for all its GPUs: that of the GPU it holds the
fewest shares of, so that no GPU gives it more than its shares).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from nvplugin.api.nvidia import (
    MPS_CONTAINER_ROOT,
    MPS_MEMORY_LIMIT_ENV,
    MPS_PIPE_ENV,
    MPS_SHM_PATH,
    MPS_THREADS_ENV,
)
from nvplugin.api.v1beta1 import api_pb2
from nvplugin.node.model import Gpu

SHM = "shm"
PIPE = "pipe"
LOG = "log"


def pipe_dir(root: str, resource: str) -> str:
    """``<root>/<resource>/pipe``: ``/run/nvidia/mps/nvidia.com/gpu/pipe``."""
    return os.path.join(root, resource, PIPE)


def log_dir(root: str, resource: str) -> str:
    return os.path.join(root, resource, LOG)


def shm_dir(root: str) -> str:
    return os.path.join(root, SHM)


def share_memory_mib(gpu: Gpu, replicas: int, shares: int = 1) -> int:
    """The device memory ``shares`` of ``replicas`` shares of ``gpu`` may pin, in MiB."""
    return gpu.memory_mib * min(shares, replicas) // replicas


def share_threads(replicas: int, shares: int = 1) -> int:
    """The percentage of a GPU's threads ``shares`` of ``replicas`` shares may use."""
    return max(1, 100 * min(shares, replicas) // replicas)


def memory_limit(mib: int) -> str:
    """A memory limit as MPS takes it: ``40960M``."""
    return f"{mib}M"


@dataclass(frozen=True)
class MpsAllocation:
    """What the containers of one MPS resource get beyond their device list. ``root``: the host's
    MPS root (``flags.mpsRoot``)."""

    resource: str
    root: str
    replicas: int

    @property
    def container_pipe_dir(self) -> str:
        return pipe_dir(MPS_CONTAINER_ROOT, self.resource)

    def apply(
        self, gpus: Sequence[tuple[Gpu, int]], response: api_pb2.ContainerAllocateResponse
    ) -> None:
        """Add the MPS part to ``response`` for a container given ``gpus``: (GPU, replicas of it)
        in index order."""
        response.envs[MPS_PIPE_ENV] = self.container_pipe_dir
        response.mounts.add(
            container_path=self.container_pipe_dir, host_path=pipe_dir(self.root, self.resource)
        )
        response.mounts.add(container_path=MPS_SHM_PATH, host_path=shm_dir(self.root))
        if not gpus:
            return
        response.envs[MPS_MEMORY_LIMIT_ENV] = ",".join(
            f"{ordinal}={memory_limit(share_memory_mib(gpu, self.replicas, shares))}"
            for ordinal, (gpu, shares) in enumerate(gpus)
        )
        fewest = min(shares for _, shares in gpus)
        response.envs[MPS_THREADS_ENV] = str(share_threads(self.replicas, fewest))
