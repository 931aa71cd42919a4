"""The admission run behind ``nvplugin admit``: "if I deploy these pods on this node, with this
kubelet configuration, which are admitted, and which GPUs and CPUs do they get?"

It runs the real plugin -- ``nvplugin serve --simulate NODE`` as a child process
(:mod:`.process`) on a private device-plugin directory -- and the fake kubelet in this process
against it, over real unix sockets: registration, ListAndWatch, GetPreferredAllocation and
Allocate are the calls a real kubelet would make. The kubelet side is the topology manager with
the device manager and the CPU manager as hint providers, in the kubelet's order. Pods are
admitted one after the other in file order; admitted pods keep their devices and CPUs, a rejected
pod gives back whatever its earlier containers took (the kubelet reclaims devices of pods that are
not active).

What the plugin serves is learned as a kubelet learns it, through the device-plugin API, never
from the plugin's config or code: its resources from its registrations, their devices and NUMA
nodes from ListAndWatch, and which GPUs a container sees from its Allocate response
(:mod:`.visible`). The NUMA layout and the CPUs come from the node the plugin simulates, which
this process opens too (:func:`nvplugin.node.load_topology`).

When is the plugin ready? When every socket in the private directory has registered and sent its
first device list (:func:`serving_everything`). The directory is the device-plugin API's meeting
place and only this plugin serves in it; a plugin must serve its socket before it registers (the
kubelet dials it back during Register), and ``nvplugin serve`` opens every resource's socket
before it registers any. So once the first registration has arrived no socket is missing, and
the condition depends on the order of events only, never on how fast they come: it holds on a
loaded machine as on an idle one. A plugin that exits first is reported with its own error.

When the plugin dies mid-run the kubelet sees its ListAndWatch stream end and marks every GPU
unhealthy; later pods are then rejected with the kubelet's own message, and the report says what
happened to the plugin (:attr:`AdmitReport.plugin_failure`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

import structlog

from nvplugin import yamlinput
from nvplugin.admit.process import PluginProcess, plugin_environment
from nvplugin.admit.visible import MpsShares, mps_shares, visible_devices
from nvplugin.api import KUBELET_SOCKET
from nvplugin.errors import InputError, NvpluginError, shortened
from nvplugin.fakekubelet.cpumanager import POLICIES as CPU_POLICIES
from nvplugin.fakekubelet.cpumanager import (
    CpuManager,
    parse_cpu_list,
    reserved_cpu_count,
    reserved_cpus,
)
from nvplugin.fakekubelet.devicemanager.manager import DeviceManager
from nvplugin.fakekubelet.kubelet import FakeKubelet
from nvplugin.fakekubelet.lifecycle import (
    DEFAULT_MAX_PODS,
    NodeResources,
    node_allocatable,
    resource_fit,
    validate_node_allocatable,
)
from nvplugin.fakekubelet.observer import Observer
from nvplugin.fakekubelet.pods import CPU, Pod, load_pod_file
from nvplugin.fakekubelet.quantity import add, parse_quantity
from nvplugin.fakekubelet.topologymanager import (
    Manager,
    NumaInfo,
    PodAdmitResult,
    StartupError,
    new_manager,
    new_policy_options,
    validate_config,
)
from nvplugin.fakekubelet.topologymanager.options import POLICY_NONE
from nvplugin.node.model import Topology
from nvplugin.nodefile.reader import load_node
from nvplugin.nodesession import load_topology

REGISTER_TIMEOUT_S = 30.0
"""How long the plugin may take to start, register and list its devices."""
DISCONNECT_TIMEOUT_S = 5.0
"""How long the kubelet side may take to notice a dead plugin's stream ending."""
STOP_TIMEOUT_S = 5.0
"""How long the plugin may take to exit on SIGTERM before it is killed."""
INHERITED_NOT = ("MIG_STRATEGY",)
"""Settings of the environment the private plugin does not inherit besides ``NVPLUGIN_*``: its
MIG strategy is ``--mig-strategy``, else the config file's."""

_log = structlog.get_logger("nvplugin.admit")


@dataclass(frozen=True)
class AdmitSettings:
    """The kubelet flags ``nvplugin admit`` takes (kubelet defaults), and the node."""

    simulate: str | None = None
    topology_manager_policy: str = "none"
    topology_manager_scope: str = "container"
    topology_manager_policy_options: Mapping[str, str] = field(default_factory=dict)
    cpu_manager_policy: str = "none"
    reserved_cpus: str | None = None
    config: str | None = None
    """The plugin's config file (``nvplugin serve --config``): resources by model, time-slicing."""
    mig_strategy: str | None = None
    """``nvplugin serve --mig-strategy`` (None: the config file's, else none)."""
    kill_plugin_after: str | None = None
    """Testing aid: SIGKILL the plugin right after this pod is admitted (or rejected)."""
    max_pods: int = DEFAULT_MAX_PODS
    system_reserved: str | None = None
    """``--system-reserved`` as the kubelet takes it: ``cpu=1,memory=2Gi``."""
    kube_reserved: str | None = None
    """``--kube-reserved``, the same form."""

    def plugin_args(self) -> list[str]:
        """What ``nvplugin serve`` is told besides its directory."""
        args = []
        for flag, value in (
            ("--simulate", self.simulate),
            ("--config", self.config),
            ("--mig-strategy", self.mig_strategy),
        ):
            if value is not None:
                args += [flag, value]
        return args


@dataclass(frozen=True)
class ContainerResult:
    """What one container got."""

    name: str
    devices: Mapping[str, tuple[str, ...]]  # resource -> device IDs (the plugin's order)
    gpu_indices: tuple[int, ...]  # every GPU it sees: whole, or as a MIG device's parent
    cpus: tuple[int, ...]  # exclusive CPUs; empty = the shared pool
    numa_nodes: tuple[int, ...] | None  # stored topology hint; None = none stored / don't care
    mig_devices: tuple[str, ...] = ()  # its MIG devices, ``<gpu>:<mig index>``, in index order
    mps: MpsShares | None = None  # its MPS limits, when it got replicas of an MPS resource

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "devices": {r: list(ids) for r, ids in self.devices.items()},
            "gpu_indices": list(self.gpu_indices),
            "mig_devices": list(self.mig_devices),
            "mps": None if self.mps is None else self.mps.as_json(),
            "cpus": list(self.cpus),
            "numa_nodes": None if self.numa_nodes is None else list(self.numa_nodes),
        }


@dataclass(frozen=True)
class PodResult:
    """One pod's admission, as the kubelet would report it."""

    pod: str
    admitted: bool
    reason: str | None
    message: str | None
    containers: tuple[ContainerResult, ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "pod": self.pod,
            "admitted": self.admitted,
            "reason": self.reason,
            "message": self.message,
            "containers": [c.as_json() for c in self.containers],
        }


@dataclass(frozen=True)
class AdmitReport:
    topology: Topology
    settings: AdmitSettings
    results: tuple[PodResult, ...]
    plugin_failure: str | None = None
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    def as_json(self) -> list[dict[str, Any]]:
        return [r.as_json() for r in self.results]


# --- configuration checks (all before anything starts) ----------------------------------------


def check_settings(settings: AdmitSettings) -> None:
    """The kubelet's flag validation: policy and scope names, options, CPU manager policy.

    Options are checked only under a policy other than ``none``, as the kubelet reads them only
    then (its ``NewManager`` returns before parsing them); under ``none`` the report notes that
    they were not read (:func:`settings_notes`).
    """
    validate_config(settings.topology_manager_policy, settings.topology_manager_scope)
    if settings.topology_manager_policy != POLICY_NONE:
        try:
            new_policy_options(settings.topology_manager_policy_options)
        except StartupError as exc:
            raise StartupError(f"--topology-manager-policy-options: {exc}") from None
    if settings.cpu_manager_policy not in CPU_POLICIES:
        allowed = ", ".join(CPU_POLICIES)
        raise InputError(
            f'--cpu-manager-policy: unknown policy: "{settings.cpu_manager_policy}" '
            f"(one of {allowed})"
        )
    if settings.reserved_cpus is not None:
        parse_cpu_list(settings.reserved_cpus, "--reserved-cpus")
    if settings.max_pods < 0:
        raise InputError(f"--max-pods: {settings.max_pods} is negative")
    reservations(settings)


RESERVABLE = ("cpu", "memory", "ephemeral-storage", "pid")
"""What ``--system-reserved`` and ``--kube-reserved`` may name (the kubelet's list)."""


def reservations(settings: AdmitSettings) -> dict[str, Decimal]:
    """``--system-reserved`` plus ``--kube-reserved``, per resource; InputError naming the flag
    for a pair that is not ``<resource>=<quantity>``, a resource the kubelet does not reserve,
    or a negative quantity."""
    total: dict[str, Decimal] = {}
    for name, texts in reservation_texts(settings).items():
        for text in texts:
            total[name] = add(total.get(name, Decimal(0)), parse_quantity(text).value)
    return total


def reservation_texts(settings: AdmitSettings) -> dict[str, list[str]]:
    """The quantities ``--system-reserved`` and then ``--kube-reserved`` give each resource, as
    written (checked as :func:`reservations` says)."""
    texts: dict[str, list[str]] = {}
    for flag, text in (
        ("--system-reserved", settings.system_reserved),
        ("--kube-reserved", settings.kube_reserved),
    ):
        for item in (text or "").split(","):
            if not item.strip():
                continue
            name, sep, value = item.partition("=")
            name = name.strip()
            if not sep:
                raise InputError(f"{flag}: {shortened(item, 80)!r} is not <resource>=<quantity>")
            if name not in RESERVABLE:
                raise InputError(
                    f'{flag}: cannot reserve "{shortened(name, 80)}" resource '
                    f"(one of {', '.join(RESERVABLE)})"
                )
            try:
                quantity = parse_quantity(value.strip())
            except ValueError as exc:
                raise InputError(f"{flag}: {name}: {exc}") from None
            if quantity.value < 0:
                raise InputError(f'{flag}: resource quantity for "{name}" cannot be negative')
            texts.setdefault(name, []).append(value.strip())
    return texts


def check_allocatable(settings: AdmitSettings, topology: Topology, memory: int | None) -> None:
    """The kubelet's start-up check that no reservation exceeds the node's capacity
    (:func:`~nvplugin.fakekubelet.lifecycle.validate_node_allocatable`); ``--reserved-cpus``
    replaces the CPU reservations by its count, as in the kubelet."""
    texts = reservation_texts(settings)
    if settings.reserved_cpus is not None:
        texts[CPU] = [str(len(parse_cpu_list(settings.reserved_cpus, "--reserved-cpus")))]
    validate_node_allocatable(texts, len(topology.cpus.cpus), memory)


MEMINFO = "/proc/meminfo"


def node_memory(simulate: str | None) -> int | None:
    """The node's memory in bytes, as the kubelet reads its capacity: the node file's
    ``memory_mib`` (None when it gives none), or on a real node ``MemTotal`` of /proc/meminfo."""
    if simulate is not None:
        memory = load_node(simulate).memory_mib
        return None if memory is None else memory * 1024 * 1024
    text = yamlinput.read_text(MEMINFO, MEMINFO, 1 << 20)
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == "MemTotal" and value.split()[1:] == ["kB"] and value.split()[0].isdigit():
            return int(value.split()[0]) * 1024
    return None


def settings_notes(settings: AdmitSettings) -> list[str]:
    """What the report should say about settings the kubelet accepts but does not use."""
    if settings.topology_manager_policy == POLICY_NONE and settings.topology_manager_policy_options:
        names = ", ".join(sorted(settings.topology_manager_policy_options))
        return [
            f"--topology-manager-policy-options ({names}) not read: the kubelet reads them "
            "only under a topology manager policy other than none"
        ]
    return []


def build_managers(
    settings: AdmitSettings, topology: Topology, checkpoint_dir: str | None
) -> tuple[Manager, DeviceManager, CpuManager]:
    """Topology manager, device manager, CPU manager for ``topology``, wired as the kubelet's.

    Raises :class:`StartupError` with the kubelet's texts (e.g. more NUMA nodes than allowed),
    in the kubelet's order: reserved CPUs (read when it starts), then the managers.
    """
    reserved = (
        reserved_cpus(settings.reserved_cpus, topology.cpus)
        if settings.reserved_cpus is not None
        else ()
    )
    numa = NumaInfo.from_distances(topology.numa_distances)
    try:
        manager = new_manager(
            numa,
            settings.topology_manager_policy,
            settings.topology_manager_scope,
            settings.topology_manager_policy_options,
        )
    except StartupError as exc:
        raise StartupError(f"topology manager: {exc}") from None
    devices = DeviceManager(
        numa_nodes=topology.numa_nodes, store=manager, checkpoint_dir=checkpoint_dir
    )
    try:
        cpus = CpuManager.from_topology(
            settings.cpu_manager_policy,
            topology,
            manager,
            reserved,
            reserved_cpu_count(reservations(settings).get(CPU, Decimal(0))),
        )
    except StartupError as exc:
        raise StartupError(f"cpu manager: {exc}") from None
    manager.add_hint_provider(devices.hint_provider)
    manager.add_hint_provider(cpus)
    return manager, devices, cpus


def plugin_sockets(directory: str) -> list[str]:
    """The sockets plugins serve in ``directory``: every socket file but the kubelet's."""
    found = []
    with os.scandir(directory) as entries:
        for entry in entries:
            with contextlib.suppress(OSError):  # gone meanwhile
                if entry.name != KUBELET_SOCKET and stat.S_ISSOCK(entry.stat().st_mode):
                    found.append(entry.path)
    return sorted(found)


def serving_everything(directory: str, devices: DeviceManager, seen: Observer) -> bool:
    """Every plugin socket in ``directory`` is registered and has sent its device list (at
    least one socket: a plugin registers only what it serves)."""
    sockets = plugin_sockets(directory)
    registered = {ep.socket_path for r in devices.resources() for ep in devices.endpoints(r)}
    listed = {s.socket_path for r in devices.resources() for s in seen.snapshots(r)}
    return bool(sockets) and all(s in registered and s in listed for s in sockets)


def device_allocatable(devices: DeviceManager) -> dict[str, int]:
    """Each device resource's allocatable as the kubelet's fit sees it: its healthy devices,
    raised to the devices allocated -- to every pod, the one being admitted included, whose
    devices the container manager allocated before the fit runs (the device manager's
    ``sanitizeNodeAllocatable``). So a pod holding devices that turned unhealthy does not leave
    the next pod short (docs/kubelet-behaviour.md#resource-fit)."""
    extended = {r: c.allocatable for r, c in devices.capacity().items()}
    allocated: dict[str, int] = {}
    for entry in devices.allocations():
        allocated[entry.resource] = allocated.get(entry.resource, 0) + len(entry.device_ids)
    for resource, count in allocated.items():
        extended[resource] = max(extended.get(resource, 0), count)
    return extended


# --- the admission run -------------------------------------------------------------------------


class Admission:
    """The fake kubelet with the real plugin; admit pods one by one (``async with``)."""

    def __init__(
        self, settings: AdmitSettings, topology: Topology, memory: int | None = None
    ) -> None:
        """``memory``: the node's memory in bytes (:func:`node_memory`; None: unknown, memory
        requests are not checked)."""
        check_settings(settings)
        self.settings = settings
        self.topology = topology
        self.memory = memory
        self._reserved = reservations(settings)
        # Not under $TMPDIR: socket paths must stay short (about 107 bytes at most).
        self.directory = tempfile.mkdtemp(dir="/tmp", prefix="nvplugin-admit-")
        try:
            self.manager, self.devices, self.cpus = build_managers(
                settings, topology, self.directory
            )
            # After the managers, as the kubelet: its container manager checks this at Start.
            check_allocatable(settings, topology, memory)
        except BaseException:
            shutil.rmtree(self.directory, ignore_errors=True)
            raise
        self._active: set[str] = set()
        self._admitted: dict[str, Pod] = {}  # the active pods, by UID: what the fit counts
        self._current: str | None = None
        self.devices.active_pods = self._active_pods
        self.kubelet = FakeKubelet(self.directory, devices=self.devices)
        self.observer = self.kubelet.observer
        self.plugin: PluginProcess | None = None
        self.plugin_failure: str | None = None
        self.notes: list[str] = settings_notes(settings)

    def _active_pods(self) -> Iterable[str]:
        if self._current is not None:
            return self._active | {self._current}
        return self._active

    @property
    def mps_root(self) -> str:
        """The plugin's MPS control daemons (a config with sharing.mps) live under this run's
        directory."""
        return os.path.join(self.directory, "mps")

    def start_plugin(self) -> PluginProcess:
        """``nvplugin serve`` on this run's directory, as the settings say."""
        return PluginProcess(
            self.directory,
            *self.settings.plugin_args(),
            "--mps-root",
            self.mps_root,
            env=plugin_environment(drop=INHERITED_NOT),
            log_path=os.path.join(self.directory, "serve.log"),
        )

    def stop_mps(self) -> None:
        """The MPS daemons a stopped plugin leaves running (for a next plugin, which this run
        does not have) stopped, and the compute modes they claimed restored: ``nvplugin mps
        stop`` with the plugin's settings, when it had an MPS root."""
        if not os.path.isdir(self.mps_root):
            return
        command = [sys.executable, "-m", "nvplugin", "mps", "stop", *self.settings.plugin_args()]
        try:
            done = subprocess.run(
                [*command, "--mps-root", self.mps_root],
                env=plugin_environment(drop=INHERITED_NOT),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=STOP_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            _log.warning("nvplugin mps stop did not end", timeout_s=STOP_TIMEOUT_S)
            return
        if done.returncode != 0:
            _log.warning("nvplugin mps stop failed", error=done.stderr.strip()[-500:])

    async def start(self) -> None:
        await self.kubelet.start()
        self.plugin = plugin = self.start_plugin()
        wait = asyncio.ensure_future(
            self.observer.wait_for(
                lambda m: serving_everything(self.directory, m, self.observer),
                REGISTER_TIMEOUT_S,
                "the plugin to register every socket it serves",
            )
        )
        try:
            while not wait.done():
                if not plugin.alive:
                    wait.cancel()
                    raise self._start_failure(plugin)
                await asyncio.wait({wait}, timeout=0.05)
            wait.result()
        except TimeoutError as exc:
            raise NvpluginError(str(exc)) from None
        finally:
            if not wait.done():
                wait.cancel()
                with contextlib.suppress(BaseException):
                    await wait

    @staticmethod
    def _start_failure(plugin: PluginProcess) -> NvpluginError:
        """A plugin that exited before it served: bad input (its config, the node's MIG layout
        for the strategy) as its own message, anything else with the end of its log."""
        error = plugin.error()
        if error is not None and plugin.process.returncode == InputError.exit_code:
            return InputError(error)
        return NvpluginError(f"{plugin.describe_exit()} before registering:\n{plugin.log_tail()}")

    async def stop(self) -> None:
        try:
            if self.plugin is not None:
                await asyncio.to_thread(self.plugin.terminate, STOP_TIMEOUT_S)
                await asyncio.to_thread(self.stop_mps)
            await self.kubelet.stop()
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)

    async def __aenter__(self) -> Admission:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _check_plugin(self, before: str) -> None:
        """Notice a plugin that died, once: wait until the kubelet side has seen it go."""
        if self.plugin is None or self.plugin.alive or self.plugin_failure is not None:
            return
        with contextlib.suppress(TimeoutError):
            await self.observer.wait_for(
                lambda m: not any(m.is_registered(r) for r in m.resources()),
                DISCONNECT_TIMEOUT_S,
                "the kubelet to notice the plugin exit",
            )
        self.plugin_failure = (
            f"{self.plugin.describe_exit()} before pod {before!r} was admitted; the kubelet "
            "marked its GPUs unhealthy, so from then on pods that need GPUs are rejected"
        )
        # Info, not warning: ``nvplugin admit`` itself reports this to the user (once).
        _log.info("device plugin gone", detail=self.plugin_failure)

    async def admit(self, pod: Pod) -> PodResult:
        await self._check_plugin(pod.name)
        self._current = pod.uid
        try:
            result: PodAdmitResult = await asyncio.to_thread(self.manager.admit, pod)
            if result.admit:  # the container manager's handler admits; the resource fit next
                result = resource_fit(pod, list(self._admitted.values()), self.node_resources())
        finally:
            self._current = None
        if result.admit:
            self._active.add(pod.uid)
            self._admitted[pod.uid] = pod
            for container in pod.all_containers:
                try:
                    await self.devices.prepare_container(pod, container)
                except NvpluginError as exc:
                    self.notes.append(f"pod {pod.name!r} container {container.name!r}: {exc}")
            containers = tuple(self._container_result(pod, c.name) for c in pod.all_containers)
        else:
            self.manager.remove_pod(pod.uid)
            self.cpus.remove_pod(pod.uid)
            self.devices.remove_pods([pod.uid])
            containers = tuple(
                ContainerResult(c.name, {}, (), (), None) for c in pod.all_containers
            )
        if self.settings.kill_plugin_after == pod.name and self.plugin is not None:
            self.plugin.kill()
        return PodResult(pod.name, result.admit, result.reason, result.message, containers)

    def node_resources(self) -> NodeResources:
        """The node's allocatable as the kubelet's resource fit sees it now: CPUs and memory
        less the reservations, ``--max-pods``, and each device resource's healthy devices --
        at least as many as are allocated (the kubelet's device manager raises it to that)."""
        extended = device_allocatable(self.devices)
        reserved = self.settings.reserved_cpus
        return node_allocatable(
            len(self.topology.cpus.cpus),
            self.memory,
            max_pods=self.settings.max_pods,
            reserved=self._reserved,
            reserved_cpus=len(parse_cpu_list(reserved)) if reserved is not None else 0,
            extended=extended,
        )

    def _container_result(self, pod: Pod, name: str) -> ContainerResult:
        """The container's devices per resource, and the GPUs and MIG devices its Allocate
        responses make visible."""
        devices: dict[str, tuple[str, ...]] = {}
        visible = set()
        mps = None
        for entry in self.devices.allocations():
            if entry.pod_uid != pod.uid or entry.container != name:
                continue
            devices[entry.resource] = tuple(self.devices.ordered(entry.resource, entry.device_ids))
            visible.update(visible_devices(self.topology, entry.response))
            mps = mps_shares(self.topology, entry.response) or mps
        hint = self.manager.stored_affinity(pod.uid, name)
        numa = None
        if hint is not None and hint.numa_affinity is not None:
            numa = tuple(sorted(hint.numa_affinity.get_bits()))
        return ContainerResult(
            name,
            devices,
            tuple(sorted({v.gpu for v in visible})),
            self.cpus.cpus(pod.uid, name),
            numa,
            tuple(v.label for v in sorted(visible, key=lambda v: v.index) if v.mig is not None),
            mps,
        )


async def admit_pods(
    settings: AdmitSettings, pods: Sequence[Pod], topology: Topology, memory: int | None = None
) -> AdmitReport:
    """Admit ``pods`` in order on a fresh fake kubelet with the real plugin (see module doc);
    ``memory``: the node's, in bytes (None: not checked)."""
    results = []
    async with Admission(settings, topology, memory) as admission:
        for pod in pods:
            results.append(await admission.admit(pod))
        failure = admission.plugin_failure
        if failure is None and admission.plugin is not None and not admission.plugin.alive:
            failure = f"{admission.plugin.describe_exit()} during the run"
        return AdmitReport(topology, settings, tuple(results), failure, tuple(admission.notes))


def run_admit(settings: AdmitSettings, pods_path: str) -> AdmitReport:
    """Everything ``nvplugin admit`` does but printing: checks, node, pods, admission."""
    check_settings(settings)
    pods = load_pod_file(pods_path)
    topology = load_topology(settings.simulate)
    memory = node_memory(settings.simulate)
    report = asyncio.run(admit_pods(settings, pods, topology, memory))
    if memory is None and any(p.effective_requests().get("memory") for p in pods):
        note = (
            "the node file gives no memory_mib (the node's memory), so pods' memory requests "
            "were not checked against it"
        )
        report = replace(report, notes=(*report.notes, note))
    return replace(report, warnings=numa_warnings(settings, topology))


def numa_warnings(settings: AdmitSettings, topology: Topology) -> tuple[str, ...]:
    """What GPUs without a NUMA node do to admission under a topology-manager policy.

    The kubelet counts only devices with a NUMA node when it makes topology hints
    (docs/kubelet-behaviour.md#topology-hints). When some GPUs have one and some do not, the
    others can never satisfy a hint: under single-numa-node and restricted they are never
    allocated, and a pod needing them is rejected. When no GPU has one, the resource has no
    topology at all.
    """
    policy = settings.topology_manager_policy
    if policy == "none":
        return ()
    missing = [g.index for g in topology.gpus if g.numa_node is None]
    if not missing:
        return ()
    if len(missing) == len(topology.gpus):
        return (
            f"no GPU of this node has a NUMA node (nvidia-smi: NUMA Affinity N/A), so the "
            f"kubelet gives its GPUs no topology hints ('don't care'): the {policy} policy "
            "admits GPU pods without aligning them with CPUs or with each other",
        )
    which = ", ".join(map(str, missing))
    it, has = ("it", "has") if len(missing) == 1 else ("them", "have")
    if policy in ("single-numa-node", "restricted"):
        effect = (
            f"under {policy} GPU {which} {'is' if it == 'it' else 'are'} never allocated: a pod "
            "that needs more GPUs than the others have free is rejected with "
            "TopologyAffinityError, as the real kubelet does"
        )
    else:
        effect = f"under {policy} a pod that needs {it} is admitted without a preferred alignment"
    return (
        f"GPU {which} {has} no NUMA node (nvidia-smi: NUMA Affinity N/A) while the other GPUs "
        f"have one. The kubelet counts only GPUs with a NUMA node in its topology hints, so "
        f"{effect}. Give {it} a numa_node in the node file (on a real node: fix the firmware's "
        "ACPI SRAT so that sysfs reports one)",
    )
