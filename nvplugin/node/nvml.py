"""Everything nvplugin asks NVML: discovery once at start, then health events and probes, and
for MPS the compute mode of the GPUs it shares (set when MPS starts serving them, restored after).

This is the only module that imports ``pynvml``. The simulated NVML (:mod:`nvplugin.sim.fakenvml`)
replaces exactly the pynvml functions called here, so the same code runs on a real node and on a
laptop. Discovery reads the rest of the node (NUMA node and PCI class of each GPU, NUMA
distances, CPU layout) from sysfs (:mod:`nvplugin.node.sysfs`), under a configurable root, the
same way in both cases. Besides the GPUs it reads the driver's version and the CUDA version it
supports, and each GPU's compute capability: what GPU Feature Discovery's labels say of a node.

MIG: for each GPU, its current MIG mode and, when on, each MIG device (index, UUID, GPU and
compute instance IDs, attributes, and the GPU instance's profile for the name suffix: the calls
go-nvlib makes, so profile names match NVIDIA's plugin). The ``/dev/nvidia-caps`` minors come from
``proc/driver/nvidia-caps/mig-minors`` under the driver root (else under ``/``), read once if
any GPU has MIG on.

Every NVML failure a user can meet becomes an :class:`NvpluginError` saying what to do (no
library, driver not loaded, driver/library mismatch, GPU lost), never a traceback.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any, TypeVar

import pynvml

from nvplugin.errors import NvpluginError
from nvplugin.node import mig
from nvplugin.node.driverfiles import LIBRARY_DIRS
from nvplugin.node.model import (
    MAX_NVLINKS,
    Driver,
    Gpu,
    Link,
    MigCaps,
    MigDevice,
    MigUnits,
    Pcie,
    Topology,
)
from nvplugin.node.sysfs import (
    pci_key,
    read_cpu_layout,
    read_numa_distances,
    read_numa_node,
    read_pci_class,
)

T = TypeVar("T")

CALLED = (
    "nvmlInit",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetCudaDriverVersion",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetCudaComputeCapability",
    "nvmlDeviceGetTopologyCommonAncestor",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkRemotePciInfo",
    "nvmlDeviceGetNvLinkRemoteDeviceType",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceGetAttributes",
    "nvmlDeviceGetGpuInstanceById",
    "nvmlGpuInstanceGetInfo",
    "nvmlDeviceGetGpuInstanceProfileInfo",
    "nvmlEventSetCreate",
    "nvmlDeviceRegisterEvents",
    "nvmlEventSetWait",
    "nvmlEventSetFree",
    "nvmlDeviceGetComputeMode",
    "nvmlDeviceSetComputeMode",
    "nvmlDeviceGetGpuFabricInfoV",
    "nvmlDeviceGetGpuFabricInfo",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetNvLinkErrorCounter",
    "nvmlDeviceGetPcieReplayCounter",
)
"""The pynvml functions this module calls: the simulated NVML models exactly these."""

COMPUTE_MODES: Mapping[str, int] = MappingProxyType(
    {
        "DEFAULT": pynvml.NVML_COMPUTEMODE_DEFAULT,
        "EXCLUSIVE_THREAD": pynvml.NVML_COMPUTEMODE_EXCLUSIVE_THREAD,
        "PROHIBITED": pynvml.NVML_COMPUTEMODE_PROHIBITED,
        "EXCLUSIVE_PROCESS": pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,
    }
)
"""NVML's compute modes by the names ``nvidia-smi -c`` takes. MPS needs EXCLUSIVE_PROCESS: one
process, the MPS server, holds the GPU's context on behalf of its clients."""

_LEVEL_TO_PCIE: Mapping[int, Pcie] = MappingProxyType(
    {
        pynvml.NVML_TOPOLOGY_INTERNAL: Pcie.INT,
        pynvml.NVML_TOPOLOGY_SINGLE: Pcie.PIX,
        pynvml.NVML_TOPOLOGY_MULTIPLE: Pcie.PXB,
        pynvml.NVML_TOPOLOGY_HOSTBRIDGE: Pcie.PHB,
        pynvml.NVML_TOPOLOGY_NODE: Pcie.NODE,
        pynvml.NVML_TOPOLOGY_SYSTEM: Pcie.SYS,
    }
)
PCIE_TO_LEVEL: Mapping[Pcie, int] = MappingProxyType(
    {pcie: level for level, pcie in _LEVEL_TO_PCIE.items()}
)
"""NVML common-ancestor level of each PCIe relation (the simulated NVML answers with these)."""

NVML_LIBRARY = "libnvidia-ml.so.1"
"""Looked for in each of the driver's library directories (``driverfiles.LIBRARY_DIRS``)."""

NVLINK_ERROR_COUNTERS = (
    pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
    pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA,
    pynvml.NVML_NVLINK_ERROR_DL_REPLAY,
    pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
)
"""The NVLink data-link error counters the nvlink health signal adds up, per link: CRC flit, CRC
data, replay and recovery (``nvmlDeviceGetNvLinkErrorCounter``)."""

FABRIC_STATES: Mapping[int, str] = MappingProxyType(
    {
        pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED: "not-supported",
        pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED: "not-started",
        pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS: "in-progress",
        pynvml.NVML_GPU_FABRIC_STATE_COMPLETED: "completed",
    }
)
"""NVML's GPU fabric registration states by name (``nvmlGpuFabricState_t``)."""
FABRIC_STATE_CODES: Mapping[str, int] = MappingProxyType(
    {name: code for code, name in FABRIC_STATES.items()}
)

MAX_EVENTS_PER_WAIT = 64
"""How many queued events one :meth:`EventWatcher.wait` drains at most."""


def bindings() -> ModuleType:
    """The pynvml module itself, for the simulated NVML to patch (nothing else imports it)."""
    module: ModuleType = pynvml
    return module


@dataclass(frozen=True)
class GpuEvent:
    """A health event of one GPU: an Xid critical error, or the GPU fell off the bus."""

    index: int
    xid: int | None = None
    lost: bool = False


@dataclass(frozen=True)
class Fabric:
    """A GPU's fabric registration (NVSwitch systems): its state (:data:`FABRIC_STATES`) and
    the status NVML gives for it (0: success, else an NVML error code)."""

    state: str
    status: int

    @property
    def problem(self) -> str | None:
        """Why the GPU cannot use the fabric; None when registration completed successfully."""
        if self.status != pynvml.NVML_SUCCESS:
            return f"fabric {self.state}, status {error_name(self.status)}"
        if self.state != "completed":
            return f"fabric {self.state}"
        return None


def fabric_status_known(name: str) -> bool:
    """Whether ``name`` (``unknown``, ``not_ready``...) is an NVML error's name, without its
    ``NVML_ERROR_`` prefix, in lower case (how node files script a fabric status)."""
    return name.islower() and isinstance(getattr(pynvml, f"NVML_ERROR_{name.upper()}", None), int)


def fabric_status_code(name: str) -> int:
    """NVML's code for a fabric status named as :func:`fabric_status_known` takes them."""
    if name == "success":
        return int(pynvml.NVML_SUCCESS)
    return int(getattr(pynvml, f"NVML_ERROR_{name.upper()}"))


def error_name(code: int) -> str:
    """NVML's name of error ``code`` (``NVML_ERROR_UNKNOWN``), or its number."""
    for name in dir(pynvml):
        if name.startswith("NVML_ERROR_") and getattr(pynvml, name) == code:
            return name
    return str(code)


@dataclass(frozen=True)
class Scan:
    """What discovery read: the topology, each GPU's NVLinks into an NVSwitch fabric, and the
    driver's version and CUDA version."""

    topology: Topology
    nvswitch_links: tuple[int, ...]
    driver: Driver


class EventWaitError(NvpluginError):
    """The NVML event wait itself failed (not a timeout); the watcher may be retried."""


def _text(value: str | bytes) -> str:
    """pynvml returns str or bytes depending on its version."""
    return value.decode() if isinstance(value, bytes) else value


def _address(pointer: Any) -> int:
    """The address an opaque NVML handle points at: how an event's device is matched."""
    return int(ctypes.cast(pointer, ctypes.c_void_p).value or 0)


SIMULATION_MARK = "_nvplugin_simulation"
"""The attribute a simulated NVML (:mod:`nvplugin.sim.fakenvml`) sets on pynvml while installed."""


def driver_library(driver_root: str) -> str | None:
    """``libnvidia-ml.so.1`` under ``driver_root`` (the host's driver root as mounted in the
    plugin's container, NVIDIA's ``containerDriverRoot``), or None when it is not there."""
    for directory in LIBRARY_DIRS:
        candidate = os.path.join(driver_root, directory, NVML_LIBRARY)
        if os.path.isfile(candidate):
            return candidate
    return None


def load_library(driver_root: str | None) -> str | None:
    """Load NVML from ``driver_root`` when the library is there, before NVML starts: a plugin
    whose pod mounts the host's driver root needs no NVIDIA container runtime to find it.
    Returns the path loaded (None: the library loader's own search will be used, as without a
    driver root). Only the first load counts: pynvml keeps one library per process."""
    if getattr(pynvml, SIMULATION_MARK, None) is not None:
        return None  # a simulated NVML: its driver root's libraries are stand-ins
    path = driver_library(driver_root) if driver_root else None
    if path is None or pynvml.nvmlLib is not None:
        return None
    try:
        pynvml.nvmlLib = ctypes.CDLL(path)
    except OSError as exc:
        raise NvpluginError(f"cannot load the NVML library {path}: {exc}") from None
    return path


def _failure(exc: Exception, what: str) -> NvpluginError:
    """An NVML error as a message a user can act on."""
    if isinstance(exc, pynvml.NVMLError_LibraryNotFound):
        return NvpluginError(
            "NVML library libnvidia-ml.so.1 not found: is the NVIDIA driver installed on this "
            "node, and is this container run with the NVIDIA container runtime "
            "(runtimeClassName: nvidia, or --gpus / NVIDIA_VISIBLE_DEVICES)? To try nvplugin "
            "without a GPU, use --simulate NODE (a built-in node name or a node file)"
        )
    if isinstance(exc, pynvml.NVMLError_DriverNotLoaded):
        return NvpluginError(
            "the NVIDIA kernel driver is not loaded (NVML: Driver Not Loaded): check "
            "`nvidia-smi` on the node and load the driver (modprobe nvidia) or reinstall it"
        )
    if isinstance(exc, pynvml.NVMLError_LibRmVersionMismatch):
        return NvpluginError(
            "the NVML library and the NVIDIA kernel driver have different versions (NVML: "
            "driver/library version mismatch): the driver was upgraded without reloading it, or "
            "the container carries its own libnvidia-ml; reboot the node (or reload the nvidia "
            "module) and do not bundle libnvidia-ml in the image"
        )
    if isinstance(exc, pynvml.NVMLError_NoPermission):
        return NvpluginError(
            f"no permission to {what} (NVML: Insufficient Permissions): the plugin needs access "
            "to /dev/nvidia*; run it privileged or with the NVIDIA container runtime"
        )
    if isinstance(exc, pynvml.NVMLError_GpuIsLost):
        return NvpluginError(
            f"{what}: the GPU is lost (NVML: GPU is lost; it fell off the bus): drain the node, "
            "then reset the GPU (nvidia-smi -r) or reboot it"
        )
    return NvpluginError(f"NVML failed to {what}: {exc}")


def _call(what: str, func: Callable[..., T], *args: Any) -> T:
    try:
        return func(*args)
    except pynvml.NVMLError as exc:
        raise _failure(exc, what) from None


class Nvml:
    """An initialised NVML session; :meth:`close` shuts it down.

    ``sysfs_root`` is where discovery reads NUMA nodes and CPUs (``/sys`` on a real node, the
    simulated node's generated tree under ``--simulate``); ``driver_root``, where the host's
    driver root is mounted (NVML is loaded from it when there, see :func:`load_library`; the
    MIG capability minors are read under it, else under ``/``: ``/proc/driver`` is the kernel's
    in every container).
    """

    def __init__(self, sysfs_root: str = "/sys", driver_root: str | None = None) -> None:
        self.sysfs_root = sysfs_root
        self.driver_root = driver_root
        self._handles: list[Any] = []
        self._nvlinks: dict[int, tuple[int, ...]] = {}  # GPU -> active NVLinks at discovery
        self.library = load_library(driver_root)
        _call("initialise NVML", pynvml.nvmlInit)
        self._open = True

    def close(self) -> None:
        if self._open:
            self._open = False
            # Shutting down a session that is already broken: nothing is left to free.
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()

    def __enter__(self) -> Nvml:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- discovery ----------------------------------------------------------------------------
    def discover(self, name: str) -> Topology:
        """Read the node once: GPUs, every pair's PCIe relation and NVLinks, NUMA and CPUs."""
        return self.scan(name).topology

    def scan(self, name: str) -> Scan:
        """:meth:`discover`, keeping how many of each GPU's NVLinks go to NVSwitches (what a
        node file records as ``nvswitch_links``, ``nvplugin node capture``)."""
        count = _call("count the GPUs", pynvml.nvmlDeviceGetCount)
        handles = [
            _call(f"open GPU {i}", pynvml.nvmlDeviceGetHandleByIndex, i) for i in range(count)
        ]
        self._handles = handles
        numa_distances = read_numa_distances(self.sysfs_root)
        minors = _MinorsOnce((self.driver_root, "/") if self.driver_root else ("/",))
        gpus = tuple(self._gpu(i, h, len(numa_distances), minors) for i, h in enumerate(handles))
        by_pci = {pci_key(g.pci_bus_id): g.index for g in gpus}
        direct = [[0] * count for _ in range(count)]
        fabric = [0] * count
        for i, handle in enumerate(handles):
            self._walk_nvlinks(i, handle, by_pci, direct[i], fabric)
        links: list[list[Link | None]] = [[None] * count for _ in range(count)]
        for i in range(count):
            for j in range(i + 1, count):
                try:
                    level = pynvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])
                except pynvml.NVMLError_NotSupported:
                    # Some virtual machines (vGPU) cannot tell. Assume the weakest relation, so
                    # no pair is preferred on PCIe grounds, rather than refuse to run at all.
                    level = pynvml.NVML_TOPOLOGY_SYSTEM
                except pynvml.NVMLError as exc:
                    raise _failure(exc, f"read the PCIe relation of GPU {i} and GPU {j}") from None
                pcie = _LEVEL_TO_PCIE.get(level)
                if pcie is None:
                    raise NvpluginError(
                        f"NVML reported an unknown PCIe relation {level} for GPU {i} and GPU {j}"
                    )
                # Each end counts the links it sees; a direct link is seen from both ends.
                nvlinks = max(direct[i][j], direct[j][i])
                if fabric[i] and fabric[j]:
                    nvlinks += min(fabric[i], fabric[j])
                link = Link(pcie, min(nvlinks, MAX_NVLINKS))
                links[i][j] = links[j][i] = link
        cpus = read_cpu_layout(self.sysfs_root)
        topology = Topology(name, gpus, tuple(tuple(row) for row in links), numa_distances, cpus)
        return Scan(topology, tuple(fabric), self.driver())

    def driver(self) -> Driver:
        """The driver's version and the newest CUDA version it supports (NVML encodes that as
        1000 * major + 10 * minor)."""
        version = _text(_call("read the driver version", pynvml.nvmlSystemGetDriverVersion))
        cuda = int(_call("read the CUDA version", pynvml.nvmlSystemGetCudaDriverVersion))
        return Driver(version, (cuda // 1000, cuda % 1000 // 10))

    def _gpu(self, index: int, handle: Any, numa_count: int, minors: _MinorsOnce) -> Gpu:
        what = f"read GPU {index}"
        uuid = _text(_call(f"{what}'s UUID", pynvml.nvmlDeviceGetUUID, handle))
        name = _text(_call(f"{what}'s name", pynvml.nvmlDeviceGetName, handle))
        memory = _call(f"{what}'s memory", pynvml.nvmlDeviceGetMemoryInfo, handle)
        pci = _call(f"{what}'s PCI info", pynvml.nvmlDeviceGetPciInfo, handle)
        minor = _call(f"{what}'s minor number", pynvml.nvmlDeviceGetMinorNumber, handle)
        bus_id = _text(pci.busId)
        numa = read_numa_node(self.sysfs_root, bus_id)
        if numa is not None and numa >= numa_count:
            numa = None  # a node sysfs does not list: treat as unknown rather than fail
        capable, enabled, migs = self._mig(index, handle, int(minor), int(memory.total), minors)
        return Gpu(
            index,
            uuid,
            name,
            int(memory.total) // (1 << 20),
            bus_id,
            int(minor),
            numa,
            enabled,
            migs,
            capable,
            self._compute_capability(index, handle),
            read_pci_class(self.sysfs_root, bus_id),
        )

    def _compute_capability(self, index: int, handle: Any) -> tuple[int, int] | None:
        """GPU ``index``'s CUDA compute capability; None when NVML cannot tell."""
        try:
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
            return None
        except pynvml.NVMLError as exc:
            raise _failure(exc, f"read GPU {index}'s compute capability") from None
        return int(major), int(minor)

    def _mig(
        self, index: int, handle: Any, minor: int, total_bytes: int, minors: _MinorsOnce
    ) -> tuple[bool, bool, tuple[MigDevice, ...]]:
        """Whether GPU ``index`` supports MIG, its MIG mode (current, not pending) and its MIG
        devices in index order.

        A GPU without MIG answers NotSupported: not capable, MIG off. Indices up to the GPU's
        maximum MIG device count that hold no device answer NotFound and are skipped (as
        go-nvlib does).
        """
        try:
            current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
            return False, False, ()
        except pynvml.NVMLError as exc:
            raise _failure(exc, f"read GPU {index}'s MIG mode") from None
        if current != pynvml.NVML_DEVICE_MIG_ENABLE:
            return True, False, ()
        what = f"read GPU {index}'s MIG devices"
        count = _call(what, pynvml.nvmlDeviceGetMaxMigDeviceCount, handle)
        gi_profiles: dict[int, int] | None = None  # profile ID -> NVML profile enum, read once
        devices = []
        for n in range(int(count)):
            try:
                device = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, n)
            except pynvml.NVMLError_NotFound:
                continue
            except pynvml.NVMLError as exc:
                raise _failure(exc, what) from None
            if gi_profiles is None:
                gi_profiles = self._gi_profiles(index, handle)
            devices.append(
                self._mig_device(index, n, handle, device, minor, total_bytes, gi_profiles, minors)
            )
        return True, True, tuple(devices)

    def _gi_profiles(self, index: int, handle: Any) -> dict[int, int]:
        """GPU ``index``'s GPU instance profiles: profile ID -> NVML profile enum."""
        profiles: dict[int, int] = {}
        for enum in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                try:
                    info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, enum)
                except pynvml.NVMLError_FunctionNotFound:  # drivers before the v2 call
                    info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, enum, 1)
            except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
                continue
            except pynvml.NVMLError as exc:
                raise _failure(exc, f"read GPU {index}'s MIG profiles") from None
            profiles.setdefault(int(info.id), enum)
        return profiles

    def _mig_device(
        self,
        index: int,
        n: int,
        parent: Any,
        device: Any,
        minor: int,
        total_bytes: int,
        gi_profiles: dict[int, int],
        minors: _MinorsOnce,
    ) -> MigDevice:
        what = f"read MIG device {index}:{n}"
        uuid = _text(_call(f"{what}'s UUID", pynvml.nvmlDeviceGetUUID, device))
        gi = int(_call(f"{what}'s GPU instance", pynvml.nvmlDeviceGetGpuInstanceId, device))
        ci = int(_call(f"{what}'s compute instance", pynvml.nvmlDeviceGetComputeInstanceId, device))
        attributes = _call(f"{what}'s attributes", pynvml.nvmlDeviceGetAttributes, device)
        instance = _call(f"{what}'s GPU instance", pynvml.nvmlDeviceGetGpuInstanceById, parent, gi)
        info = _call(f"{what}'s GPU instance", pynvml.nvmlGpuInstanceGetInfo, instance)
        enum = gi_profiles.get(int(info.profileId))
        if enum is None:
            raise NvpluginError(
                f"MIG device {index}:{n} ({uuid}) has GPU instance profile {info.profileId}, "
                f"which GPU {index} does not list among its profiles: cannot name it"
            )
        gi_slices = int(attributes.gpuInstanceSliceCount)
        memory_mib = int(attributes.memorySizeMB)
        name = mig.profile_name(
            enum, gi_slices, int(attributes.computeInstanceSliceCount), memory_mib, total_bytes
        )
        table = minors.get()
        caps = None
        if table is not None:
            gi_minor, ci_minor = table.get((minor, gi, None)), table.get((minor, gi, ci))
            if gi_minor is not None and ci_minor is not None:
                caps = MigCaps(gi_minor, ci_minor)
        placement = (int(info.placement.start), int(info.placement.size))
        units = MigUnits(
            int(attributes.multiprocessorCount),
            int(attributes.sharedCopyEngineCount),
            int(attributes.sharedDecoderCount),
            int(attributes.sharedEncoderCount),
            int(attributes.sharedJpegCount),
            int(attributes.sharedOfaCount),
        )
        ci_slices = int(attributes.computeInstanceSliceCount)
        return MigDevice(
            index, n, uuid, name, gi, ci, memory_mib, gi_slices, placement, caps, ci_slices, units
        )

    def _walk_nvlinks(
        self,
        index: int,
        handle: Any,
        by_pci: dict[tuple[int, int, int, int] | None, int],
        direct: list[int],
        fabric: list[int],
    ) -> None:
        """Count GPU ``index``'s active NVLinks: per peer GPU, and into the NVSwitch fabric.

        A link whose index the GPU does not have answers NotSupported or InvalidArgument: skip
        it. A link to an NVSwitch leads to every other fabric GPU (counted as min of the two).
        """
        active = []
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                if pynvml.nvmlDeviceGetNvLinkState(handle, link) != pynvml.NVML_FEATURE_ENABLED:
                    continue
                remote = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
            except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
                continue
            except pynvml.NVMLError as exc:
                raise _failure(exc, f"read NVLink {link} of GPU {index}") from None
            active.append(link)
            self._nvlinks[index] = tuple(active)
            peer = by_pci.get(pci_key(_text(remote.busId)))
            try:
                kind = pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
            except (
                pynvml.NVMLError_NotSupported,
                pynvml.NVMLError_InvalidArgument,
                pynvml.NVMLError_FunctionNotFound,
            ):
                # Older drivers: a link whose far end is a known GPU is a GPU link.
                kind = pynvml.NVML_NVLINK_DEVICE_TYPE_GPU if peer is not None else None
            except pynvml.NVMLError as exc:
                raise _failure(exc, f"read NVLink {link} of GPU {index}") from None
            if kind == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                fabric[index] += 1
            elif kind == pynvml.NVML_NVLINK_DEVICE_TYPE_GPU and peer is not None and peer != index:
                direct[peer] += 1

    # -- compute mode (MPS) ---------------------------------------------------------------------
    def compute_mode(self, index: int) -> str:
        """GPU ``index``'s compute mode, by name (:data:`COMPUTE_MODES`)."""
        mode = _call(
            f"read GPU {index}'s compute mode",
            lambda: pynvml.nvmlDeviceGetComputeMode(self._handle(index)),
        )
        for name, value in COMPUTE_MODES.items():
            if value == mode:
                return name
        raise NvpluginError(f"NVML reported an unknown compute mode {mode} for GPU {index}")

    def set_compute_mode(self, index: int, mode: str) -> None:
        """Set GPU ``index``'s compute mode (a name of :data:`COMPUTE_MODES`); needs root."""
        _call(
            f"set GPU {index}'s compute mode to {mode}",
            lambda: pynvml.nvmlDeviceSetComputeMode(self._handle(index), COMPUTE_MODES[mode]),
        )

    # -- health -------------------------------------------------------------------------------
    def _handle(self, index: int) -> Any:
        if index < len(self._handles):
            return self._handles[index]
        return pynvml.nvmlDeviceGetHandleByIndex(index)

    def probe(self, index: int) -> bool:
        """One cheap query of GPU ``index``; False when NVML cannot answer it (lost etc.)."""
        try:
            pynvml.nvmlDeviceGetMemoryInfo(self._handle(index))
        except pynvml.NVMLError:
            return False
        return True

    # -- polled health signals (nvplugin.node.signals judges them) -----------------------------
    def nvlinks(self, index: int) -> tuple[int, ...]:
        """GPU ``index``'s NVLinks that were up at discovery: the only ones health watches (a
        link that never came up, or that the GPU does not have, is no fault)."""
        return self._nvlinks.get(index, ())

    def fabric(self, index: int) -> Fabric | None:
        """GPU ``index``'s fabric registration; None on a GPU without one (NotSupported, or
        state NOT_SUPPORTED: every GPU outside an NVSwitch fabric)."""
        handle = self._handle(index)
        try:
            try:
                info: Any = pynvml.c_nvmlGpuFabricInfoV_t()
                pynvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
            except pynvml.NVMLError_FunctionNotFound:  # drivers before the versioned call
                info = pynvml.c_nvmlGpuFabricInfo_t()
                pynvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
            return None
        except pynvml.NVMLError as exc:
            raise _failure(exc, f"read GPU {index}'s fabric state") from None
        state = int(info.state)
        if state == pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED:
            return None
        return Fabric(FABRIC_STATES.get(state, f"state-{state}"), int(info.status))

    def ecc_uncorrected(self, index: int) -> int | None:
        """GPU ``index``'s volatile uncorrectable ECC error count (since the driver loaded or
        the GPU was reset); None when the GPU has no ECC or it is off."""
        return self._counter(
            index,
            "volatile uncorrectable ECC errors",
            pynvml.nvmlDeviceGetTotalEccErrors,
            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            pynvml.NVML_VOLATILE_ECC,
        )

    def row_remap(self, index: int) -> tuple[bool, bool] | None:
        """GPU ``index``'s row remapper: (a remap pending, a remap failed); None on GPUs without
        one (before Ampere). A pending remap takes effect, and NVML clears it, at a GPU reset."""
        try:
            _corr, _unc, pending, failure = pynvml.nvmlDeviceGetRemappedRows(self._handle(index))
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
            return None
        except pynvml.NVMLError as exc:
            raise _failure(exc, f"read GPU {index}'s remapped rows") from None
        return bool(pending), bool(failure)

    def nvlink(self, index: int, link: int) -> tuple[bool, int] | None:
        """NVLink ``link`` of GPU ``index``: (up, the sum of its :data:`NVLINK_ERROR_COUNTERS`);
        None when the GPU does not have that link. A link that is down is not asked its
        counters (they do not move)."""
        handle = self._handle(index)
        what = f"read NVLink {link} of GPU {index}"
        try:
            if pynvml.nvmlDeviceGetNvLinkState(handle, link) != pynvml.NVML_FEATURE_ENABLED:
                return False, 0
            total = 0
            for counter in NVLINK_ERROR_COUNTERS:
                try:
                    total += int(pynvml.nvmlDeviceGetNvLinkErrorCounter(handle, link, counter))
                except pynvml.NVMLError_NotSupported:
                    continue  # a counter this link generation does not keep
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
            return None
        except pynvml.NVMLError as exc:
            raise _failure(exc, what) from None
        return True, total

    def pcie_replays(self, index: int) -> int | None:
        """GPU ``index``'s PCIe replay counter; None when NVML cannot tell."""
        return self._counter(index, "PCIe replay counter", pynvml.nvmlDeviceGetPcieReplayCounter)

    def _counter(self, index: int, what: str, func: Callable[..., Any], *args: Any) -> int | None:
        try:
            return int(func(self._handle(index), *args))
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
            return None
        except pynvml.NVMLError as exc:
            raise _failure(exc, f"read GPU {index}'s {what}") from None

    def watch_events(self, indices: Sequence[int]) -> EventWatcher:
        """An event set with Xid critical errors registered for each of ``indices``.

        A GPU that does not support the event, or that is lost right now, is skipped rather than
        failing the whole set: a monitor re-creating its set after a wait failure must not be
        stopped by one dead GPU. Skipped GPUs are still probed when a wait reports a lost GPU.
        """
        event_set = _call("create an NVML event set", pynvml.nvmlEventSetCreate)
        registered = []
        by_address = {}
        for index in indices:
            try:
                handle = self._handle(index)
                by_address[_address(handle)] = index
                pynvml.nvmlDeviceRegisterEvents(
                    handle, pynvml.nvmlEventTypeXidCriticalError, event_set
                )
            except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_GpuIsLost):
                continue
            except pynvml.NVMLError as exc:
                with contextlib.suppress(pynvml.NVMLError):
                    pynvml.nvmlEventSetFree(event_set)
                raise _failure(exc, f"register Xid events of GPU {index}") from None
            registered.append(index)
        return EventWatcher(self, event_set, tuple(indices), tuple(registered), by_address)


class EventWatcher:
    """Waits for Xid critical errors and lost GPUs among the watched GPUs."""

    def __init__(
        self,
        nvml: Nvml,
        event_set: Any,
        watched: tuple[int, ...],
        registered: tuple[int, ...],
        by_address: dict[int, int],
    ) -> None:
        self._nvml = nvml
        self._set: Any = event_set
        self.watched = watched
        self.registered = registered
        self._by_address = by_address

    def wait(self, timeout_ms: int) -> list[GpuEvent]:
        """Events within ``timeout_ms``: [] on timeout; queued events are drained together.

        When the wait reports a lost GPU, every watched GPU is probed and each that fails is
        reported lost. Any other failure of the wait raises :class:`EventWaitError`.
        """
        if self._set is None:
            raise EventWaitError("the NVML event watcher is closed")
        events: list[GpuEvent] = []
        timeout = timeout_ms
        while len(events) < MAX_EVENTS_PER_WAIT:
            try:
                data = pynvml.nvmlEventSetWait(self._set, timeout)
            except pynvml.NVMLError_Timeout:
                break
            except pynvml.NVMLError_GpuIsLost:
                lost = [GpuEvent(i, lost=True) for i in self.watched if not self._nvml.probe(i)]
                return events + lost
            except pynvml.NVMLError as exc:
                if events:
                    break  # report what arrived; the failure shows again on the next wait
                raise EventWaitError(f"waiting for NVML events failed: {exc}") from None
            index = self._by_address.get(_address(data.device))
            if index is not None and data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                events.append(GpuEvent(index, xid=int(data.eventData)))
            timeout = 0
        return events

    def close(self) -> None:
        if self._set is not None:
            event_set, self._set = self._set, None
            with contextlib.suppress(pynvml.NVMLError):  # a broken session: nothing to free
                pynvml.nvmlEventSetFree(event_set)


class _MinorsOnce:
    """The driver's MIG capability minors, read on first use (only nodes with MIG need them)
    from the first of ``roots`` that has them (:func:`nvplugin.node.mig.read_mig_minors`); None
    when none can be read (no MIG-capable driver, or not mounted)."""

    def __init__(self, roots: tuple[str, ...]) -> None:
        self._paths = tuple(Path(root, mig.MIG_MINORS_PATH) for root in roots)
        self._read = False
        self._table: dict[mig.CapsKey, int] | None = None

    def get(self) -> dict[mig.CapsKey, int] | None:
        if not self._read:
            self._read = True
            self._table = mig.read_mig_minors(self._paths)
        return self._table
