"""Allocate responses: what a container gets for the GPUs the kubelet gave it.

A :class:`Responder` turns the container's GPUs (replicas already mapped back to their GPU, each
once, in index order) into a ``ContainerAllocateResponse`` by applying each configured
:class:`Strategy` in a fixed order, whatever order the config lists them in:

- ``envvar``: ``NVIDIA_VISIBLE_DEVICES=<id>,<id>`` (the NVIDIA container runtime reads it);
- ``volume-mounts``: ``NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices`` and one mount per
  GPU, host ``/dev/null`` -> ``/var/run/nvidia-container-devices/<id>``: the runtime reads the
  mount names, which an unprivileged pod cannot forge through its own env (it overrides envvar's
  value, as in NVIDIA's plugin, since the runtime can honour only one);
- ``cdi-annotations``: annotation ``<prefix>nvplugin_<id hash>`` = ``nvidia.com/gpu=<id>,...``;
- ``cdi-cri``: the same CDI names in ``cdi_devices`` (CRI field, containerd >= 1.7 / CRI-O);
- with ``passDeviceSpecs``: DeviceSpecs for ``/dev/nvidia<minor>`` of each GPU, then the control
  nodes that exist under the dev root (``flags.nvidiaDevRoot``).

IDs are UUIDs or NVML indices (``device_id_strategy``). CDI names use the kind ``nvidia.com/gpu``
of the spec ``nvidia-ctk cdi generate`` writes, which names every GPU both by index and by UUID
(its default device-name strategies), so ``index`` IDs work with CDI too; a spec generated with
``--device-name-strategy=uuid`` only needs ``device_id_strategy: uuid``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from nvplugin.config.model import DEFAULT_DEVICE_LIST_STRATEGY, DEFAULT_DRIVER_ROOT
from nvplugin.config.rules import (
    CDI_ANNOTATION_NAME,
    DEFAULT_CDI_ANNOTATION_PREFIX,
    DEVICE_ID_STRATEGIES,
    DEVICE_LIST_STRATEGIES,
)
from nvplugin.node.model import Gpu
from nvplugin.plugin.api.v1beta1 import api_pb2

VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
NO_DEVICES = "void"
"""The NVIDIA runtime's value for "no GPU" (an empty value would mean "not set" to some
runtimes, which then expose every GPU)."""

DEFAULT_DEV_ROOT = DEFAULT_DRIVER_ROOT

VOLUME_MOUNTS_ROOT = "/var/run/nvidia-container-devices"
VOLUME_MOUNTS_HOST_PATH = "/dev/null"
CDI_KIND = "nvidia.com/gpu"
CONTROL_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
"""Device nodes every CUDA container needs besides its GPUs', when they exist on the host."""
DEVICE_PERMISSIONS = "rw"


class Strategy(Protocol):
    """Adds one kind of information about the container's devices to its response.

    ``ids`` are the configured IDs of ``gpus`` (same order: GPU index order, no duplicates).
    """

    def apply(
        self, ids: Sequence[str], gpus: Sequence[Gpu], response: api_pb2.ContainerAllocateResponse
    ) -> None: ...


@dataclass(frozen=True)
class EnvvarStrategy:
    """``NVIDIA_VISIBLE_DEVICES=<id>,<id>,...``."""

    def apply(
        self, ids: Sequence[str], gpus: Sequence[Gpu], response: api_pb2.ContainerAllocateResponse
    ) -> None:
        response.envs[VISIBLE_DEVICES_ENV] = ",".join(ids) or NO_DEVICES


@dataclass(frozen=True)
class VolumeMountsStrategy:
    """The env names the mount root; one ``/dev/null`` mount per device under it."""

    def apply(
        self, ids: Sequence[str], gpus: Sequence[Gpu], response: api_pb2.ContainerAllocateResponse
    ) -> None:
        response.envs[VISIBLE_DEVICES_ENV] = VOLUME_MOUNTS_ROOT if ids else NO_DEVICES
        for device_id in ids:
            response.mounts.add(
                container_path=f"{VOLUME_MOUNTS_ROOT}/{device_id}",
                host_path=VOLUME_MOUNTS_HOST_PATH,
            )


def cdi_names(ids: Sequence[str]) -> list[str]:
    """Fully qualified CDI device names: ``nvidia.com/gpu=<id>``."""
    return [f"{CDI_KIND}={device_id}" for device_id in ids]


def cdi_annotation_key(prefix: str, ids: Sequence[str]) -> str:
    """``<prefix>nvplugin_<hash of the IDs>``: the same devices always give the same key (a
    container that gets GPUs of two resources gets two keys, never one overwriting the other)."""
    digest = hashlib.sha256(",".join(ids).encode()).hexdigest()[:16]
    return f"{prefix}{CDI_ANNOTATION_NAME}_{digest}"


@dataclass(frozen=True)
class CdiAnnotationsStrategy:
    """``<prefix>nvplugin_<hash>: nvidia.com/gpu=<id>,...`` (read by CDI-aware runtimes)."""

    prefix: str = DEFAULT_CDI_ANNOTATION_PREFIX

    def apply(
        self, ids: Sequence[str], gpus: Sequence[Gpu], response: api_pb2.ContainerAllocateResponse
    ) -> None:
        if ids:
            response.annotations[cdi_annotation_key(self.prefix, ids)] = ",".join(cdi_names(ids))


@dataclass(frozen=True)
class CdiCriStrategy:
    """The CDI names in ``ContainerAllocateResponse.cdi_devices``."""

    def apply(
        self, ids: Sequence[str], gpus: Sequence[Gpu], response: api_pb2.ContainerAllocateResponse
    ) -> None:
        for name in cdi_names(ids):
            response.cdi_devices.add(name=name)


@dataclass(frozen=True)
class DeviceSpecsStrategy:
    """``/dev/nvidia<minor>`` of each GPU (index order), then the control nodes present under
    ``dev_root``; host paths under ``dev_root``, container paths under ``/dev``.

    Control nodes are looked for on each Allocate (a ``stat`` each, no NVML): ``nvidia-uvm`` and
    ``nvidia-modeset`` appear when their kernel modules load, which may be after the plugin
    started.
    """

    dev_root: str = DEFAULT_DEV_ROOT

    def apply(
        self, ids: Sequence[str], gpus: Sequence[Gpu], response: api_pb2.ContainerAllocateResponse
    ) -> None:
        names = [f"nvidia{gpu.minor}" for gpu in gpus]
        names += [n for n in CONTROL_DEVICES if os.path.exists(self.host_path(n))]
        for name in dict.fromkeys(names):
            response.devices.add(
                container_path=f"/dev/{name}",
                host_path=self.host_path(name),
                permissions=DEVICE_PERMISSIONS,
            )

    def host_path(self, name: str) -> str:
        return os.path.join(self.dev_root, "dev", name)


_BY_NAME: dict[str, Strategy] = {
    "envvar": EnvvarStrategy(),
    "volume-mounts": VolumeMountsStrategy(),
    "cdi-cri": CdiCriStrategy(),
}


def device_id(gpu: Gpu, id_strategy: str) -> str:
    """The ID a container is told for ``gpu``: its UUID, or its NVML index."""
    return str(gpu.index) if id_strategy == "index" else gpu.uuid


@dataclass(frozen=True)
class Responder:
    """Builds a container's Allocate response by applying each strategy in turn."""

    strategies: tuple[Strategy, ...] = (EnvvarStrategy(),)
    id_strategy: str = DEVICE_ID_STRATEGIES[0]

    def container_response(self, gpus: Sequence[Gpu]) -> api_pb2.ContainerAllocateResponse:
        ordered = sorted({gpu.index: gpu for gpu in gpus}.values(), key=lambda g: g.index)
        ids = [device_id(gpu, self.id_strategy) for gpu in ordered]
        response = api_pb2.ContainerAllocateResponse()
        for strategy in self.strategies:
            strategy.apply(ids, ordered, response)
        return response


def make_responder(
    device_list_strategy: Sequence[str] = DEFAULT_DEVICE_LIST_STRATEGY,
    device_id_strategy: str = DEVICE_ID_STRATEGIES[0],
    *,
    pass_device_specs: bool = False,
    dev_root: str = DEFAULT_DEV_ROOT,
    cdi_annotation_prefix: str = DEFAULT_CDI_ANNOTATION_PREFIX,
) -> Responder:
    """The responder for these settings (validated by the config loader)."""
    strategies: list[Strategy] = []
    for name in DEVICE_LIST_STRATEGIES:
        if name not in device_list_strategy:
            continue
        if name == "cdi-annotations":
            strategies.append(CdiAnnotationsStrategy(cdi_annotation_prefix))
        else:
            strategies.append(_BY_NAME[name])
    if pass_device_specs:
        strategies.append(DeviceSpecsStrategy(dev_root))
    return Responder(tuple(strategies), device_id_strategy)
