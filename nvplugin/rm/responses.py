"""Allocate responses: what a container gets for the GPUs the kubelet gave it.

A :class:`Responder` turns the container's devices (replicas mapped back to the GPU or MIG device
they share, each once, in index order) into a ``ContainerAllocateResponse`` by applying each
configured :class:`Strategy` in a fixed order, whatever order the config lists them in:

- ``envvar``: ``NVIDIA_VISIBLE_DEVICES=<id>,<id>`` (the NVIDIA container runtime reads it);
- ``volume-mounts``: ``NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices`` and one mount per
  GPU, host ``/dev/null`` -> ``/var/run/nvidia-container-devices/<id>``: the runtime reads the
  mount names, which an unprivileged pod cannot forge through its own env (it overrides envvar's
  value, as in NVIDIA's plugin, since the runtime can honour only one);
- ``cdi-annotations``: annotation ``<prefix>nvplugin_<id hash>`` = ``<kind>=<id>,...``;
- ``cdi-cri``: the same CDI names in ``cdi_devices`` (CRI field, containerd >= 1.7 / CRI-O);
- with ``passDeviceSpecs``: DeviceSpecs for ``/dev/nvidia<minor>`` of each GPU (a MIG device:
  its parent's, and the ``/dev/nvidia-caps/nvidia-cap<N>`` nodes of its GPU instance and compute
  instance), then the control nodes that exist under the dev root (``flags.nvidiaDevRoot``);
- for a resource shared through MPS, last: its pipe directory, shared memory and the container's
  shares (:mod:`nvplugin.rm.mps`), which count the replicas the container got of each GPU.

IDs are UUIDs or NVML indices (``device_id_strategy``): a MIG device is its ``MIG-`` UUID, or
``<gpu index>:<mig index>`` as NVIDIA writes MIG indices. CDI names are ``<kind>=<id>``: by
default NVIDIA's plugin's kind ``k8s.device-plugin.nvidia.com/gpu``, of the spec ``serve``
writes (:mod:`nvplugin.cdi`) with a device for each ID; ``nvplugin.cdi.kind: nvidia.com/gpu``
uses the container toolkit's spec instead (``nvidia-ctk cdi generate`` names every device by
index and UUID by default).
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from nvplugin.api.nvidia import NO_DEVICES, VISIBLE_DEVICES_ENV, VOLUME_MOUNTS_ROOT
from nvplugin.api.v1beta1 import api_pb2
from nvplugin.config.model import DEFAULT_DEVICE_LIST_STRATEGY, DEFAULT_DRIVER_ROOT
from nvplugin.config.rules import (
    CDI_ANNOTATION_NAME,
    DEFAULT_CDI_ANNOTATION_PREFIX,
    DEFAULT_CDI_KIND,
    DEVICE_ID_STRATEGIES,
    DEVICE_LIST_STRATEGIES,
)
from nvplugin.errors import NvpluginError
from nvplugin.node.mig import MIG_MINORS_PATH, caps_device
from nvplugin.rm.devices import Device
from nvplugin.rm.mps import MpsAllocation

DEFAULT_DEV_ROOT = DEFAULT_DRIVER_ROOT

VOLUME_MOUNTS_HOST_PATH = "/dev/null"
CONTROL_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
"""Device nodes every CUDA container needs besides its GPUs', when they exist on the host."""
DEVICE_PERMISSIONS = "rw"


class Strategy(Protocol):
    """Adds one kind of information about the container's devices to its response.

    ``ids`` are the configured IDs of ``devices`` (same order: GPU index, then MIG index order;
    no duplicates, no replicas).
    """

    def apply(
        self,
        ids: Sequence[str],
        devices: Sequence[Device],
        response: api_pb2.ContainerAllocateResponse,
    ) -> None: ...


@dataclass(frozen=True)
class EnvvarStrategy:
    """``NVIDIA_VISIBLE_DEVICES=<id>,<id>,...``."""

    def apply(
        self,
        ids: Sequence[str],
        devices: Sequence[Device],
        response: api_pb2.ContainerAllocateResponse,
    ) -> None:
        response.envs[VISIBLE_DEVICES_ENV] = ",".join(ids) or NO_DEVICES


@dataclass(frozen=True)
class VolumeMountsStrategy:
    """The env names the mount root; one ``/dev/null`` mount per device under it."""

    def apply(
        self,
        ids: Sequence[str],
        devices: Sequence[Device],
        response: api_pb2.ContainerAllocateResponse,
    ) -> None:
        response.envs[VISIBLE_DEVICES_ENV] = VOLUME_MOUNTS_ROOT if ids else NO_DEVICES
        for device_id in ids:
            response.mounts.add(
                container_path=f"{VOLUME_MOUNTS_ROOT}/{device_id}",
                host_path=VOLUME_MOUNTS_HOST_PATH,
            )


def cdi_names(ids: Sequence[str], kind: str = DEFAULT_CDI_KIND) -> list[str]:
    """Fully qualified CDI device names: ``<kind>=<id>``."""
    return [f"{kind}={device_id}" for device_id in ids]


def cdi_annotation_key(prefix: str, ids: Sequence[str]) -> str:
    """``<prefix>nvplugin_<hash of the IDs>``: the same devices always give the same key (a
    container that gets GPUs of two resources gets two keys, never one overwriting the other)."""
    digest = hashlib.sha256(",".join(ids).encode()).hexdigest()[:16]
    return f"{prefix}{CDI_ANNOTATION_NAME}_{digest}"


@dataclass(frozen=True)
class CdiAnnotationsStrategy:
    """``<prefix>nvplugin_<hash>: <kind>=<id>,...`` (read by CDI-aware runtimes)."""

    prefix: str = DEFAULT_CDI_ANNOTATION_PREFIX
    kind: str = DEFAULT_CDI_KIND

    def apply(
        self,
        ids: Sequence[str],
        devices: Sequence[Device],
        response: api_pb2.ContainerAllocateResponse,
    ) -> None:
        if ids:
            response.annotations[cdi_annotation_key(self.prefix, ids)] = ",".join(
                cdi_names(ids, self.kind)
            )


@dataclass(frozen=True)
class CdiCriStrategy:
    """The CDI names in ``ContainerAllocateResponse.cdi_devices``."""

    kind: str = DEFAULT_CDI_KIND

    def apply(
        self,
        ids: Sequence[str],
        devices: Sequence[Device],
        response: api_pb2.ContainerAllocateResponse,
    ) -> None:
        for name in cdi_names(ids, self.kind):
            response.cdi_devices.add(name=name)


@dataclass(frozen=True)
class DeviceSpecsStrategy:
    """``/dev/nvidia<minor>`` of each GPU (index order; a MIG device: its parent's, then its GPU
    and compute instances' ``nvidia-caps`` nodes), then the control nodes present under
    ``dev_root``; host paths under ``dev_root``, container paths under ``/dev``.

    Control nodes are looked for on each Allocate (a ``stat`` each, no NVML): ``nvidia-uvm`` and
    ``nvidia-modeset`` appear when their kernel modules load, which may be after the plugin
    started.
    """

    dev_root: str = DEFAULT_DEV_ROOT

    def apply(
        self,
        ids: Sequence[str],
        devices: Sequence[Device],
        response: api_pb2.ContainerAllocateResponse,
    ) -> None:
        names = []
        for device in devices:
            names.append(f"nvidia{device.gpu.minor}")
            if device.mig is not None:
                caps = device.mig.caps
                if caps is None:  # refused at start (check_caps): unreachable from the daemon
                    raise NvpluginError(f"MIG device {device.mig.label}: {CAPS_UNKNOWN}")
                for minor in (caps.gpu_instance, caps.compute_instance):
                    names.append(caps_device(minor).removeprefix("/dev/"))
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
}


CAPS_UNKNOWN = (
    f"its /dev/nvidia-caps minors are unknown: the driver's {MIG_MINORS_PATH} could not be read "
    "under the driver root (flags.plugin.containerDriverRoot) or under /; make it readable (it "
    "is the host's /proc, which the plugin's container sees), or turn passDeviceSpecs off"
)


def check_caps(devices: Sequence[Device]) -> None:
    """NvpluginError naming the MIG devices whose ``nvidia-caps`` minors are unknown: with
    ``passDeviceSpecs`` their Allocate responses cannot be built, so the daemon refuses to start
    rather than fail every pod that gets one."""
    unknown = sorted({d.order: d.mig.label for d in devices if d.mig and not d.mig.caps}.items())
    if unknown:
        shown = ", ".join(label for _, label in unknown[:8])
        more = f" and {len(unknown) - 8} more" if len(unknown) > 8 else ""
        raise NvpluginError(f"passDeviceSpecs: MIG devices {shown}{more}: {CAPS_UNKNOWN}")


def device_id(device: Device, id_strategy: str) -> str:
    """The ID a container is told for ``device``: its (MIG) UUID, or its NVML index (a MIG
    device: ``<gpu index>:<mig index>``)."""
    return device.label if id_strategy == "index" else device.uuid


@dataclass(frozen=True)
class Responder:
    """Builds a container's Allocate response by applying each strategy in turn; ``mps``: the
    MPS part, for a resource shared through MPS (one responder per such resource)."""

    strategies: tuple[Strategy, ...] = (EnvvarStrategy(),)
    id_strategy: str = DEVICE_ID_STRATEGIES[0]
    mps: MpsAllocation | None = None

    def container_response(self, devices: Sequence[Device]) -> api_pb2.ContainerAllocateResponse:
        """The response for a container given ``devices`` (replicas of one GPU or MIG device
        count once: the container sees the device, not its replicas -- except as MPS shares)."""
        response = api_pb2.ContainerAllocateResponse()
        self.fill(devices, response)
        return response

    def fill(self, devices: Sequence[Device], response: api_pb2.ContainerAllocateResponse) -> None:
        """:meth:`container_response`, written into ``response`` (an entry of a reply being
        built: no message of its own to copy in)."""
        unique = {device.uuid: replace(device, id=device.uuid, replica=None) for device in devices}
        ordered = sorted(unique.values(), key=lambda device: device.order)
        ids = [device_id(device, self.id_strategy) for device in ordered]
        for strategy in self.strategies:
            strategy.apply(ids, ordered, response)
        if self.mps is not None:
            shares = Counter(device.uuid for device in devices)
            self.mps.apply([(device.gpu, shares[device.uuid]) for device in ordered], response)


def make_responder(
    device_list_strategy: Sequence[str] = DEFAULT_DEVICE_LIST_STRATEGY,
    device_id_strategy: str = DEVICE_ID_STRATEGIES[0],
    *,
    pass_device_specs: bool = False,
    dev_root: str = DEFAULT_DEV_ROOT,
    cdi_annotation_prefix: str = DEFAULT_CDI_ANNOTATION_PREFIX,
    cdi_kind: str = DEFAULT_CDI_KIND,
) -> Responder:
    """The responder for these settings (validated by the config loader)."""
    strategies: list[Strategy] = []
    for name in DEVICE_LIST_STRATEGIES:
        if name not in device_list_strategy:
            continue
        if name == "cdi-annotations":
            strategies.append(CdiAnnotationsStrategy(cdi_annotation_prefix, cdi_kind))
        elif name == "cdi-cri":
            strategies.append(CdiCriStrategy(cdi_kind))
        else:
            strategies.append(_BY_NAME[name])
    if pass_device_specs:
        strategies.append(DeviceSpecsStrategy(dev_root))
    return Responder(tuple(strategies), device_id_strategy)
