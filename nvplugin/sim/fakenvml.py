"""The simulated NVML: a node file behind the real pynvml calls, plus a generated sysfs tree.

While installed, every ``nvml*`` function of the real ``pynvml`` module is replaced: the ones
:mod:`nvplugin.node.nvml` calls answer from the node file with the real pynvml structures and
error classes; every other one raises :class:`UnmodelledNvmlCall`, so new NVML use shows up in
tests at once. Discovery, health events and probes therefore run unchanged, and ``calls`` counts
each function so tests can assert that request paths make no NVML calls.

Model of the node file:

- handles are opaque ``c_nvmlDevice_t`` pointers (never dereferenced), one per GPU;
- NVLinks: GPU i's link indices hold first its direct links to each peer (in peer order, remote
  type GPU, remote PCI info of the peer), then its ``nvswitch_links`` (remote type SWITCH, remote
  PCI info of one of the switches, which are not GPUs). Between two fabric GPUs nothing is
  direct; discovery recovers min(links of each). Indices past the GPU's links up to
  ``MAX_NVLINKS`` answer NotSupported, beyond that InvalidArgument;
- the driver's version and CUDA version are the node file's ``driver``; each GPU's compute
  capability its ``compute_capability`` (NotSupported when unknown); its PCI class and the DMI
  product name (``machine``) are files of the generated tree (:mod:`nvplugin.sim.tree`);
- MIG: a GPU whose model has a MIG profile table (:mod:`nvplugin.node.mig`) reports its mode
  from the node file (``mig`` key present = on); its MIG devices are the node file's instances in
  list order (MIG index), with their own opaque handles, one GPU instance handle each, and the
  profile table behind ``nvmlDeviceGetGpuInstanceProfileInfo`` and its multiprocessors and
  engines behind ``nvmlDeviceGetAttributes``. Other GPUs answer NotSupported.
  The driver's ``mig-minors`` file is written under the tree (the simulated driver root) when a
  GPU has MIG on;
- compute modes: every GPU starts in DEFAULT; ``nvmlDeviceSetComputeMode`` changes it for the
  rest of the simulation (:attr:`SimulatedNvml.compute_modes`);
- the driver root (the same generated tree) holds ``usr/bin/nvidia-cuda-mps-control``, the MPS
  control daemon's stand-in (:mod:`nvplugin.sim.fakempscontrol`), run by this interpreter;
- scripted events (``after_s`` from the first simulated ``nvmlInit``): an Xid event is
  delivered once, by the next ``nvmlEventSetWait`` of a set the GPU is registered in; a lost GPU
  raises GpuIsLost on every query until a ``recover`` event, and the next wait raises GpuIsLost
  once; a ``wait_error`` makes every wait raise NVMLError_Unknown for ``for_s`` seconds;
- health signals, from the due scripted events: a GPU with ``nvswitch_links`` reports its fabric
  state (completed, success, unless an event says otherwise), every other GPU NotSupported; the
  volatile uncorrectable ECC count and the PCIe replay counter add up their steps (a ``reset``
  zeroes the ECC count and clears a pending remap); an NVLink reports DISABLED while scripted
  down, and its errors (all counted as CRC flit errors). ``dead_nvlinks`` (tests) makes a GPU
  without NVLinks answer that many link indices as DISABLED, with error counters that climb on
  every read: what a PCIe GPU with NVLink hardware but no bridge may report.
"""

from __future__ import annotations

import ctypes
import functools
import inspect
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nvplugin.node import mig, nvml
from nvplugin.node.model import MAX_NVLINKS
from nvplugin.node.sysfs import pci_key
from nvplugin.nodefile.spec import FabricSpec, NodeSpec
from nvplugin.sim import driverroot, fakempscontrol, tree

_HANDLE_BASE = 0x7E5A0000
_SET_BASE = 0x7E5B0000
_MIG_BASE = 0x7E5C0000
_GI_BASE = 0x7E5E0000
_MIG_SLOTS = 16
"""Handle slots per GPU for its MIG devices and for its GPU instances (IDs 0..14)."""
SWITCHES = 6
"""How many NVSwitches the simulated fabric spreads a GPU's switch links over."""

_INSTALLED_MARK = nvml.SIMULATION_MARK


class UnmodelledNvmlCall(RuntimeError):
    """A pynvml function the simulated NVML does not model was called."""


class SimulatedNvml:
    """A fake NVML for one node file. :meth:`install` patches pynvml; :meth:`uninstall` undoes.

    ``init_error`` names an NVML error (``"LIBRARY_NOT_FOUND"``, ``"DRIVER_NOT_LOADED"``,
    ``"LIB_RM_VERSION_MISMATCH"``, ...) that ``nvmlInit`` raises, to test failure messages.
    ``no_xid_events`` lists GPUs that do not support Xid event registration. ``clock`` and
    ``sleep`` drive scripted events (tests pass a fake clock). ``sysfs_numa=False`` leaves NUMA
    node directories out of the sysfs tree (a kernel without NUMA).
    """

    def __init__(
        self,
        spec: NodeSpec,
        *,
        sysfs_root: str | None = None,
        init_error: str | None = None,
        no_xid_events: frozenset[int] = frozenset(),
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        sysfs_numa: bool = True,
        dead_nvlinks: int = 0,
    ) -> None:
        self.spec = spec
        self.calls: Counter[str] = Counter()
        self._pynvml = nvml.bindings()
        if init_error is not None and not hasattr(self._pynvml, f"NVML_ERROR_{init_error}"):
            raise ValueError(f"no NVML error NVML_ERROR_{init_error}")
        self._init_error = init_error
        self._no_xid = no_xid_events
        self._clock = clock
        self._sleep = sleep
        self._sysfs_numa = sysfs_numa
        self._given_root = sysfs_root
        self.sysfs_root = ""
        self._made_root = False
        self._saved: dict[str, Any] = {}
        self._lock = threading.RLock()
        self._started: float | None = None
        self._initialised = 0
        self._handles = [
            ctypes.cast(ctypes.c_void_p(_HANDLE_BASE + 16 * i), self._pynvml.c_nvmlDevice_t)
            for i in range(len(spec.gpus))
        ]
        self._mig_models = [mig.mig_model(gpu.name) for gpu in spec.gpus]
        self._mig_uuids = [
            [mig.mig_uuid(g.uuid, i.gpu_instance, i.compute_instance) for i in g.mig or ()]
            for g in spec.gpus
        ]
        self._sets: dict[int, set[int]] = {}  # event-set address -> registered GPU indices
        self._next_set = 0
        self._delivered: set[int] = set()  # event numbers already delivered / raised
        self._link_table = [self._links_of(i) for i in range(len(spec.gpus))]
        self._compute_modes = [self._pynvml.NVML_COMPUTEMODE_DEFAULT] * len(spec.gpus)
        self._dead_nvlinks = dead_nvlinks
        self._dead_reads = 0

    # -- install / uninstall ------------------------------------------------------------------
    def install(self) -> SimulatedNvml:
        """Write the sysfs tree and patch pynvml. Only one simulation at a time."""
        p = self._pynvml
        if getattr(p, _INSTALLED_MARK, None) is not None:
            raise RuntimeError("a simulated NVML is already installed")
        self._write_sysfs()
        modelled = self._modelled()
        names = [n for n in dir(p) if n.startswith("nvml") and inspect.isfunction(getattr(p, n))]
        names += ["_nvmlGetFunctionPointer", "_LoadNvmlLibrary"]
        for name in names:
            self._saved[name] = getattr(p, name)
            fake = modelled.get(name)
            setattr(p, name, self._counted(name, fake) if fake else self._unmodelled(name))
        setattr(p, _INSTALLED_MARK, self)
        return self

    def uninstall(self) -> None:
        """Restore pynvml and remove the generated sysfs tree (if this simulation made it)."""
        p = self._pynvml
        if getattr(p, _INSTALLED_MARK, None) is not self:
            return
        for name, original in self._saved.items():
            setattr(p, name, original)
        self._saved.clear()
        delattr(p, _INSTALLED_MARK)
        if self._made_root:
            shutil.rmtree(self.sysfs_root, ignore_errors=True)
            self._made_root = False

    def __enter__(self) -> SimulatedNvml:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def _counted(self, name: str, fake: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fake)
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return fake(*args, **kwargs)

        return call

    def _unmodelled(self, name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            raise UnmodelledNvmlCall(
                f"the simulated NVML does not model pynvml.{name}: model it in "
                "nvplugin/sim/fakenvml.py (and list it in nvml.CALLED) before calling it"
            )

        return call

    def _modelled(self) -> dict[str, Callable[..., Any]]:
        return {
            "nvmlInit": self.nvmlInit,
            "nvmlShutdown": self.nvmlShutdown,
            "nvmlErrorString": self.nvmlErrorString,
            "nvmlSystemGetDriverVersion": self.nvmlSystemGetDriverVersion,
            "nvmlSystemGetCudaDriverVersion": self.nvmlSystemGetCudaDriverVersion,
            "nvmlDeviceGetCount": self.nvmlDeviceGetCount,
            "nvmlDeviceGetHandleByIndex": self.nvmlDeviceGetHandleByIndex,
            "nvmlDeviceGetUUID": self.nvmlDeviceGetUUID,
            "nvmlDeviceGetName": self.nvmlDeviceGetName,
            "nvmlDeviceGetMemoryInfo": self.nvmlDeviceGetMemoryInfo,
            "nvmlDeviceGetPciInfo": self.nvmlDeviceGetPciInfo,
            "nvmlDeviceGetMinorNumber": self.nvmlDeviceGetMinorNumber,
            "nvmlDeviceGetCudaComputeCapability": self.nvmlDeviceGetCudaComputeCapability,
            "nvmlDeviceGetTopologyCommonAncestor": self.nvmlDeviceGetTopologyCommonAncestor,
            "nvmlDeviceGetNvLinkState": self.nvmlDeviceGetNvLinkState,
            "nvmlDeviceGetNvLinkRemotePciInfo": self.nvmlDeviceGetNvLinkRemotePciInfo,
            "nvmlDeviceGetNvLinkRemoteDeviceType": self.nvmlDeviceGetNvLinkRemoteDeviceType,
            "nvmlDeviceGetMigMode": self.nvmlDeviceGetMigMode,
            "nvmlDeviceGetMaxMigDeviceCount": self.nvmlDeviceGetMaxMigDeviceCount,
            "nvmlDeviceGetMigDeviceHandleByIndex": self.nvmlDeviceGetMigDeviceHandleByIndex,
            "nvmlDeviceGetGpuInstanceId": self.nvmlDeviceGetGpuInstanceId,
            "nvmlDeviceGetComputeInstanceId": self.nvmlDeviceGetComputeInstanceId,
            "nvmlDeviceGetAttributes": self.nvmlDeviceGetAttributes,
            "nvmlDeviceGetGpuInstanceById": self.nvmlDeviceGetGpuInstanceById,
            "nvmlGpuInstanceGetInfo": self.nvmlGpuInstanceGetInfo,
            "nvmlDeviceGetGpuInstanceProfileInfo": self.nvmlDeviceGetGpuInstanceProfileInfo,
            "nvmlEventSetCreate": self.nvmlEventSetCreate,
            "nvmlDeviceRegisterEvents": self.nvmlDeviceRegisterEvents,
            "nvmlEventSetWait": self.nvmlEventSetWait,
            "nvmlEventSetFree": self.nvmlEventSetFree,
            "nvmlDeviceGetComputeMode": self.nvmlDeviceGetComputeMode,
            "nvmlDeviceSetComputeMode": self.nvmlDeviceSetComputeMode,
            "nvmlDeviceGetGpuFabricInfoV": self.nvmlDeviceGetGpuFabricInfoV,
            "nvmlDeviceGetGpuFabricInfo": self.nvmlDeviceGetGpuFabricInfo,
            "nvmlDeviceGetTotalEccErrors": self.nvmlDeviceGetTotalEccErrors,
            "nvmlDeviceGetRemappedRows": self.nvmlDeviceGetRemappedRows,
            "nvmlDeviceGetNvLinkErrorCounter": self.nvmlDeviceGetNvLinkErrorCounter,
            "nvmlDeviceGetPcieReplayCounter": self.nvmlDeviceGetPcieReplayCounter,
        }

    # -- sysfs --------------------------------------------------------------------------------
    def _write_sysfs(self) -> None:
        if self._given_root is not None:
            root = Path(self._given_root)
            root.mkdir(parents=True, exist_ok=True)
        else:
            root = tree.make_root()
            self._made_root = True
        self.sysfs_root = str(root)
        tree.write_tree(self.spec, root, numa=self._sysfs_numa)
        fakempscontrol.write_program(str(root))
        driverroot.write_driver_root(self.spec, root)

    @property
    def driver_root(self) -> str:
        """The simulated driver root (``proc/driver/nvidia-caps/mig-minors``,
        ``usr/bin/nvidia-cuda-mps-control`` and the driver's files and device nodes of
        :mod:`.driverroot` live under it): the same generated tree as the simulated sysfs, which
        has no ``proc``, ``dev`` or ``usr`` of its own."""
        return self.sysfs_root

    @property
    def compute_modes(self) -> list[int]:
        """Each GPU's compute mode now (NVML's values), in index order."""
        with self._lock:
            return list(self._compute_modes)

    # -- state --------------------------------------------------------------------------------
    def _now(self) -> float:
        """Seconds since the first simulated nvmlInit (0 before it)."""
        return 0.0 if self._started is None else self._clock() - self._started

    def _error(self, code: int) -> Exception:
        exc: Exception = self._pynvml.NVMLError(code)
        return exc

    def is_lost(self, index: int) -> bool:
        """Whether GPU ``index`` is lost now (the last due lost/recover event decides)."""
        now = self._now()
        lost = False
        for event in self.spec.events:
            if event.gpu == index and event.after_s <= now and (event.lost or event.recover):
                lost = event.lost
        return lost

    def _require_init(self) -> None:
        if not self._initialised:
            raise self._error(self._pynvml.NVML_ERROR_UNINITIALIZED)

    def _slot(self, handle: Any, base: int) -> int | None:
        """Which of our handles (numbered from ``base``) ``handle`` is; None for any other."""
        self._require_init()
        try:
            offset = nvml._address(handle) - base
        except (TypeError, ctypes.ArgumentError):
            return None
        slot, rest = divmod(offset, 16)
        return None if rest or offset < 0 else slot

    def _device(self, handle: Any) -> int:
        """The GPU index of a handle; raises like NVML for a foreign handle or a lost GPU."""
        index = self._slot(handle, _HANDLE_BASE)
        if index is None:
            raise self._error(self._pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._check_index(index)

    def _check_index(self, index: int) -> int:
        """``index`` if it names a GPU that answers; raises like NVML otherwise."""
        self._require_init()
        if not 0 <= index < len(self.spec.gpus):
            raise self._error(self._pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if self.is_lost(index):
            raise self._error(self._pynvml.NVML_ERROR_GPU_IS_LOST)
        return index

    def _mig_handle(self, handle: Any) -> tuple[int, int] | None:
        """(GPU index, MIG index) of a MIG device handle; None for any other handle. Raises like
        NVML when the parent GPU is lost."""
        slot = self._slot(handle, _MIG_BASE)
        if slot is None:
            return None
        gpu, index = divmod(slot, _MIG_SLOTS)
        if gpu >= len(self.spec.gpus):
            return None
        instances = self.spec.gpus[gpu].mig or ()
        if index >= len(instances):
            return None
        self._check_index(gpu)
        return gpu, index

    def _instance(self, handle: Any) -> mig.MigInstance:
        """The instance behind a MIG device handle; InvalidArgument for any other handle."""
        found = self._mig_handle(handle)
        if found is None:
            raise self._error(self._pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu, index = found
        instances = self.spec.gpus[gpu].mig
        assert instances is not None
        return instances[index]

    def _mig_gpu(self, device: Any) -> tuple[int, mig.MigModel]:
        """A GPU handle's index and MIG model; NotSupported for a GPU without MIG."""
        index = self._device(device)
        model = self._mig_models[index]
        if model is None:
            raise self._error(self._pynvml.NVML_ERROR_NOT_SUPPORTED)
        return index, model

    def _links_of(self, index: int) -> list[tuple[int, int]]:
        """GPU ``index``'s NVLinks in link-index order: (remote type, peer or switch number)."""
        gpu_type = self._pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
        switch_type = self._pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
        links = []
        for peer in range(len(self.spec.gpus)):
            if peer != index:
                links += [(gpu_type, peer)] * self.spec.direct_nvlinks(index, peer)
        links += [(switch_type, k % SWITCHES) for k in range(self.spec.gpus[index].nvswitch_links)]
        return links

    def _link(self, handle: Any, link: int) -> tuple[int, int]:
        index = self._device(handle)
        if not 0 <= link < MAX_NVLINKS:
            raise self._error(self._pynvml.NVML_ERROR_INVALID_ARGUMENT)
        table = self._link_table[index]
        if link >= len(table):
            raise self._error(self._pynvml.NVML_ERROR_NOT_SUPPORTED)
        return table[link]

    def _dead_link(self, index: int, link: int) -> bool:
        """Whether ``link`` of GPU ``index`` is one of the ``dead_nvlinks`` (it has no links)."""
        return not self._link_table[index] and 0 <= link < self._dead_nvlinks

    def _due_signals(self, index: int) -> list[Any]:
        """GPU ``index``'s signal events due now, in script order."""
        now = self._now()
        return [e for e in self.spec.events if e.gpu == index and e.after_s <= now]

    def _link_state(self, index: int, link: int) -> tuple[bool, int]:
        """(up, errors) of a link of GPU ``index`` now."""
        up, errors = True, 0
        for event in self._due_signals(index):
            if event.nvlink == link:
                errors += event.nvlink_errors
                if event.nvlink_up is not None:
                    up = event.nvlink_up
        return up, errors

    def _pci(self, bus_id: str) -> Any:
        struct = getattr(self._pynvml, "nvmlPciInfo_t", None) or self._pynvml.c_nvmlPciInfo_t
        info = struct()
        domain, bus, dev, _ = pci_key(bus_id) or (0, 0, 0, 0)
        info.domain, info.bus, info.device = domain, bus, dev
        info.busId = bus_id
        info.busIdLegacy = f"{domain & 0xFFFF:04X}:{bus:02X}:{dev:02X}.0"
        return info

    # -- the modelled pynvml functions (same names and arguments as pynvml's) -------------------
    def nvmlInit(self) -> None:
        if self._init_error is not None:
            raise self._error(getattr(self._pynvml, f"NVML_ERROR_{self._init_error}"))
        with self._lock:
            if self._started is None:
                self._started = self._clock()
            self._initialised += 1

    def nvmlShutdown(self) -> None:
        self._require_init()
        with self._lock:
            self._initialised -= 1

    def nvmlErrorString(self, result: int) -> str:
        return f"NVML error {result} (simulated)"

    def nvmlSystemGetDriverVersion(self) -> str:
        self._require_init()
        return self.spec.driver.version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        """NVML's encoding: 1000 * major + 10 * minor (12.4 -> 12040)."""
        self._require_init()
        major, minor = self.spec.driver.cuda
        return 1000 * major + 10 * minor

    def nvmlDeviceGetCount(self) -> int:
        self._require_init()
        return len(self.spec.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        return self._handles[self._check_index(index)]

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        found = self._mig_handle(handle)
        if found is not None:
            gpu, index = found
            return self._mig_uuids[gpu][index]
        return self.spec.gpus[self._device(handle)].uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self.spec.gpus[self._device(handle)].name

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        gpu = self.spec.gpus[self._device(handle)]
        memory = self._pynvml.c_nvmlMemory_t()
        memory.total = gpu.memory_mib << 20
        memory.used = 0
        memory.free = memory.total
        return memory

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        return self._pci(self.spec.gpus[self._device(handle)].pci_bus_id)

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        return self._device(handle)

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        """The node file's (or the model's) compute capability; NotSupported when unknown."""
        compute = self.spec.gpus[self._device(handle)].compute_capability
        if compute is None:
            raise self._error(self._pynvml.NVML_ERROR_NOT_SUPPORTED)
        return compute

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: Any, device2: Any) -> int:
        a, b = self._device(device1), self._device(device2)
        link = self.spec.links[a][b]
        if link is None:
            raise self._error(self._pynvml.NVML_ERROR_INVALID_ARGUMENT)
        level: int = nvml.PCIE_TO_LEVEL[link.pcie]
        return level

    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:
        index = self._device(device)
        p = self._pynvml
        if self._dead_link(index, link):
            disabled: int = p.NVML_FEATURE_DISABLED
            return disabled
        self._link(device, link)
        up, _ = self._link_state(index, link)
        state: int = p.NVML_FEATURE_ENABLED if up else p.NVML_FEATURE_DISABLED
        return state

    def nvmlDeviceGetNvLinkErrorCounter(self, device: Any, link: int, counter: int) -> int:
        index = self._device(device)
        p = self._pynvml
        if not 0 <= counter <= p.NVML_NVLINK_ERROR_DL_ECC_DATA:
            raise self._error(p.NVML_ERROR_INVALID_ARGUMENT)
        if self._dead_link(index, link):
            with self._lock:
                self._dead_reads += 1
                return 1000 * self._dead_reads
        self._link(device, link)
        _, errors = self._link_state(index, link)
        return errors if counter == p.NVML_NVLINK_ERROR_DL_CRC_FLIT else 0

    def _fabric_info(self, device: Any, info: Any) -> None:
        index = self._device(device)
        p = self._pynvml
        if not self.spec.gpus[index].nvswitch_links:
            raise self._error(p.NVML_ERROR_NOT_SUPPORTED)
        fabric = FabricSpec()
        for event in self._due_signals(index):
            if event.fabric is not None:
                fabric = event.fabric
        struct = getattr(info, "_obj", info)  # ctypes.byref(struct), as NVML takes it
        struct.state = nvml.FABRIC_STATE_CODES[fabric.state]
        struct.status = nvml.fabric_status_code(fabric.status)

    def nvmlDeviceGetGpuFabricInfoV(self, device: Any, gpuFabricInfo: Any) -> int:
        self._fabric_info(device, gpuFabricInfo)
        success: int = self._pynvml.NVML_SUCCESS
        return success

    def nvmlDeviceGetGpuFabricInfo(self, device: Any, gpuFabricInfo: Any) -> int:
        return self.nvmlDeviceGetGpuFabricInfoV(device, gpuFabricInfo)

    def _ecc_and_remap(self, index: int) -> tuple[int, bool, bool]:
        """GPU ``index``'s volatile uncorrectable ECC count, remap pending, remap failed."""
        ecc, pending, failed = 0, False, False
        for event in self._due_signals(index):
            ecc += event.ecc
            pending = pending or event.remap == "pending"
            failed = failed or event.remap == "failed"
            if event.reset:
                ecc, pending, failed = 0, False, False
        return ecc, pending, failed

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        index = self._device(handle)
        p = self._pynvml
        uncorrected = errorType == p.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        if uncorrected and counterType == p.NVML_VOLATILE_ECC:
            return self._ecc_and_remap(index)[0]
        return 0

    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]:
        _, pending, failed = self._ecc_and_remap(self._device(device))
        return 0, 0, int(pending), int(failed)

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        index = self._device(handle)
        return sum(event.pcie_replays for event in self._due_signals(index))

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: Any, link: int) -> Any:
        kind, far = self._link(device, link)
        if kind == self._pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
            return self._pci(f"00000000:{0xF0 + far:02X}:00.0")
        return self._pci(self.spec.gpus[far].pci_bus_id)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:
        return self._link(handle, link)[0]

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        index, _ = self._mig_gpu(device)
        p = self._pynvml
        mode: int = p.NVML_DEVICE_MIG_DISABLE
        if self.spec.gpus[index].mig is not None:
            mode = p.NVML_DEVICE_MIG_ENABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        """Zero when MIG is not supported or not enabled, as NVML documents."""
        index = self._device(device)
        model = self._mig_models[index]
        if model is None or self.spec.gpus[index].mig is None:
            return 0
        return model.compute_slices

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        gpu, model = self._mig_gpu(device)
        instances = self.spec.gpus[gpu].mig
        if instances is None:
            raise self._error(self._pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= index < model.compute_slices:
            raise self._error(self._pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if index >= len(instances):
            raise self._error(self._pynvml.NVML_ERROR_NOT_FOUND)
        address = _MIG_BASE + 16 * (gpu * _MIG_SLOTS + index)
        return ctypes.cast(ctypes.c_void_p(address), self._pynvml.c_nvmlDevice_t)

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        return self._instance(device).gpu_instance

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        return self._instance(device).compute_instance

    def nvmlDeviceGetAttributes(self, device: Any) -> Any:
        profile = self._instance(device).profile
        units = profile.units
        attributes = self._pynvml.c_nvmlDeviceAttributes()
        attributes.gpuInstanceSliceCount = profile.compute_slices
        attributes.computeInstanceSliceCount = profile.compute_slices
        attributes.memorySizeMB = profile.memory_mib
        attributes.multiprocessorCount = units.multiprocessors
        attributes.sharedCopyEngineCount = units.copy_engines
        attributes.sharedDecoderCount = units.decoders
        attributes.sharedEncoderCount = units.encoders
        attributes.sharedJpegCount = units.jpeg
        attributes.sharedOfaCount = units.ofa
        return attributes

    def nvmlDeviceGetGpuInstanceById(self, device: Any, gpuInstanceId: int) -> Any:
        gpu, _ = self._mig_gpu(device)
        instances = self.spec.gpus[gpu].mig
        if instances is None:
            raise self._error(self._pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not any(inst.gpu_instance == gpuInstanceId for inst in instances):
            raise self._error(self._pynvml.NVML_ERROR_NOT_FOUND)
        address = _GI_BASE + 16 * (gpu * _MIG_SLOTS + gpuInstanceId)
        return ctypes.cast(ctypes.c_void_p(address), self._pynvml.c_nvmlGpuInstance_t)

    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> Any:
        slot = self._slot(gpuInstance, _GI_BASE)
        if slot is None:
            raise self._error(self._pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu, gi = divmod(slot, _MIG_SLOTS)
        self._check_index(gpu)
        found = [inst for inst in self.spec.gpus[gpu].mig or () if inst.gpu_instance == gi]
        if not found:
            raise self._error(self._pynvml.NVML_ERROR_INVALID_ARGUMENT)
        info = self._pynvml.c_nvmlGpuInstanceInfo_t()
        info.device = self._handles[gpu]
        info.id = gi
        info.profileId = found[0].profile.id
        info.placement.start, info.placement.size = found[0].placement
        return info

    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, device: Any, profile: int, version: int = 2
    ) -> Any:
        _, model = self._mig_gpu(device)
        p = self._pynvml
        if not 0 <= profile < p.NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise self._error(p.NVML_ERROR_INVALID_ARGUMENT)
        found = [entry for entry in model.profiles if entry.gi_profile == profile]
        if not found:
            raise self._error(p.NVML_ERROR_NOT_SUPPORTED)
        entry = found[0]
        info = (
            p.c_nvmlGpuInstanceProfileInfo_v2_t()
            if version == 2
            else p.c_nvmlGpuInstanceProfileInfo_t()
        )
        info.id = entry.id
        info.sliceCount = entry.compute_slices
        info.instanceCount = entry.instances
        info.memorySizeMB = entry.memory_mib
        if version == 2:
            info.name = f"MIG {entry.name}".encode()
        return info

    def nvmlDeviceGetComputeMode(self, handle: Any) -> int:
        index = self._device(handle)
        with self._lock:
            mode: int = self._compute_modes[index]
        return mode

    def nvmlDeviceSetComputeMode(self, handle: Any, mode: int) -> None:
        index = self._device(handle)
        if mode not in range(self._pynvml.NVML_COMPUTEMODE_COUNT):
            raise self._error(self._pynvml.NVML_ERROR_INVALID_ARGUMENT)
        with self._lock:
            self._compute_modes[index] = mode

    def nvmlEventSetCreate(self) -> Any:
        self._require_init()
        with self._lock:
            address = _SET_BASE + 16 * self._next_set
            self._next_set += 1
            self._sets[address] = set()
        return ctypes.cast(ctypes.c_void_p(address), self._pynvml.c_nvmlEventSet_t)

    def _set(self, event_set: Any) -> set[int]:
        self._require_init()
        try:
            return self._sets[nvml._address(event_set)]
        except (KeyError, TypeError, ctypes.ArgumentError):
            raise self._error(self._pynvml.NVML_ERROR_INVALID_ARGUMENT) from None

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        index = self._device(handle)
        registered = self._set(eventSet)
        if eventTypes & ~self._pynvml.nvmlEventTypeXidCriticalError:
            raise self._error(self._pynvml.NVML_ERROR_NOT_SUPPORTED)
        if index in self._no_xid:
            raise self._error(self._pynvml.NVML_ERROR_NOT_SUPPORTED)
        with self._lock:
            registered.add(index)

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        self._set(eventSet)
        with self._lock:
            del self._sets[nvml._address(eventSet)]

    def _due(self, registered: set[int]) -> Any:
        """Raise or return what a wait at this moment yields; None when nothing is due."""
        p = self._pynvml
        now = self._now()
        with self._lock:
            for event in self.spec.events:
                if event.wait_error and event.after_s <= now < event.after_s + event.for_s:
                    raise self._error(p.NVML_ERROR_UNKNOWN)
            lost = [
                n
                for n, e in enumerate(self.spec.events)
                if e.lost and e.after_s <= now and n not in self._delivered
            ]
            if lost:
                self._delivered.update(lost)
                raise self._error(p.NVML_ERROR_GPU_IS_LOST)
            for n, event in enumerate(self.spec.events):
                if (
                    event.xid is not None
                    and event.after_s <= now
                    and n not in self._delivered
                    and event.gpu in registered
                ):
                    self._delivered.add(n)
                    data = p.c_nvmlEventData_t()
                    data.device = self._handles[event.gpu]
                    data.eventType = p.nvmlEventTypeXidCriticalError
                    data.eventData = event.xid
                    return data
        return None

    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> Any:
        registered = self._set(eventSet)
        deadline = self._now() + max(0, timeoutms) / 1000.0
        while True:
            data = self._due(registered)
            if data is not None:
                return data
            now = self._now()
            if now >= deadline:
                raise self._error(self._pynvml.NVML_ERROR_TIMEOUT)
            upcoming = [
                t
                for e in self.spec.events
                for t in (e.after_s, e.after_s + e.for_s)
                if now < t < deadline
            ]
            # At least 0.1 ms, so float rounding can never leave a wait that makes no progress.
            self._sleep(max(min([deadline, *upcoming]) - now, 1e-4))
